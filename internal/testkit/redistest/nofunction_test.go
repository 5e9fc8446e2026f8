package redistest_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// Under EnvNoFunction the servers Start makes refuse FUNCTION, and a
// semaphore's script calls all go as EVALSHA (none as FCALL), which is what
// the CI leg that sets it relies on.
func TestNoFunction(t *testing.T) {
	t.Setenv(redistest.EnvNoFunction, "1")
	c := redistest.Start(t).Client(t)
	ctx := redistest.Ctx(t, 10*time.Second)
	if err := c.Do(ctx, "FUNCTION", "LIST").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("FUNCTION LIST: %v, want an unknown command", err)
	}
	var logs redistest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := unfair.New(c, redistest.Name(t), 1, unfair.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cycle := func() {
		t.Helper()
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first call has the client try FUNCTION LOAD in the background:
	// wait until it says the server refused it, then call again.
	cycle()
	redistest.WaitFor(t, 5*time.Second, "the library's FUNCTION LOAD refused", func() (bool, error) {
		return strings.Contains(logs.String(), "refused FUNCTION LOAD"), nil
	})
	for i := 0; i < 5; i++ {
		cycle()
	}
	stats := c.Info(ctx, "commandstats").Val()
	if strings.Contains(stats, "cmdstat_fcall") || !strings.Contains(stats, "cmdstat_evalsha") {
		t.Fatalf("script calls not all EVALSHA:\n%s", stats)
	}
}
