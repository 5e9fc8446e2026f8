package redsem_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// settled waits until sem's engine knows how it runs its scripts (the
// function library loaded, or refused), so that a test that watches or
// drops the bytes of one call sees the call it means, not the library's
// background load.
func settled(ctx context.Context, t *testing.T, sem redsem.Semaphore) {
	t.Helper()
	e := core.EngineOf(sem)
	if e == nil {
		t.Fatalf("no engine behind %T", sem)
	}
	waitUntil(ctx, t, "the script mode settled", func() bool { return e.ScriptMode() != "pending" })
}

// commandCalls returns the calls of each command from INFO commandstats.
func commandCalls(ctx context.Context, t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var n int64
		fmt.Sscanf(rest, "calls=%d", &n)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// On a server that takes FUNCTION, an engine loads the library after its
// first call and runs every script with FCALL (status with FCALL_RO) from
// then on; after the server lost the library (a restart without
// persistence, here FUNCTION FLUSH), the next call still succeeds (run
// again with EVALSHA) and the library is loaded again.
func TestScriptsRunAsFunctions(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		ctx := redistest.Ctx(t, 20*time.Second)
		s := mustNew(t, v, c, redistest.Name(t), 2, opts{})
		cycle := func(what string) {
			t.Helper()
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if _, err := s.Status(ctx); err != nil {
				t.Fatalf("%s: Status: %v", what, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		cycle("first call")
		settled(ctx, t, s)
		if m := core.EngineOf(s).ScriptMode(); m != "fcall" {
			t.Fatalf("script mode %q on a Redis 7 server, want fcall", m)
		}
		before := commandCalls(ctx, t, c)
		for i := 0; i < 10; i++ {
			cycle("warm")
		}
		after := commandCalls(ctx, t, c)
		if d := after["fcall"] - before["fcall"]; d < 20 {
			t.Errorf("%d FCALLs for 10 acquire+release cycles, want at least 20", d)
		}
		if d := after["fcall_ro"] - before["fcall_ro"]; d != 10 {
			t.Errorf("%d FCALL_ROs for 10 Status calls, want 10", d)
		}
		for _, cmd := range []string{"evalsha", "eval", "evalsha_ro"} {
			if d := after[cmd] - before[cmd]; d != 0 {
				t.Errorf("%d %s calls once the library was loaded, want 0", d, cmd)
			}
		}

		if err := c.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		cycle("the library lost")
		waitUntil(ctx, t, "the library loaded again", func() bool { return core.EngineOf(s).ScriptMode() == "fcall" })
		before = commandCalls(ctx, t, c)
		cycle("reloaded")
		after = commandCalls(ctx, t, c)
		if d := after["fcall"] - before["fcall"]; d < 2 {
			t.Errorf("%d FCALLs after the reload, want at least 2", d)
		}
	})
}

// A server that refuses FUNCTION (here a Redis 7 with the command renamed
// away, as some managed services do) runs the scripts with EVALSHA, and the
// choice is logged once, at Info.
func TestScriptsWithoutFunctions(t *testing.T) {
	srv := redistest.Start(t, "--rename-command", "FUNCTION", "", "--rename-command", "FCALL", "")
	c := srv.Client(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	var mu sync.Mutex
	var logged []string
	logger := slog.New(recordHandler(func(r slog.Record) {
		mu.Lock()
		logged = append(logged, r.Level.String()+" "+r.Message)
		mu.Unlock()
	}))
	for i := 0; i < 2; i++ { // two semaphores of one client: one log record
		s, err := unfair.New(c, redistest.Name(t), 2, unfair.Options{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		for j := 0; j < 3; j++ {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		settled(ctx, t, s)
		if m := core.EngineOf(s).ScriptMode(); m != "evalsha" {
			t.Fatalf("script mode %q on a server without FUNCTION, want evalsha", m)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, l := range logged {
		if strings.Contains(l, "EVALSHA") {
			n++
			if !strings.HasPrefix(l, "DEBUG ") {
				t.Errorf("logged %q, want it at Debug (an expected mode, not a fault)", l)
			}
		}
	}
	if n != 1 {
		t.Errorf("the EVALSHA fallback was logged %d times, want once: %q", n, logged)
	}
}

// recordHandler is a slog.Handler that hands every record to f.
type recordHandler func(slog.Record)

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h(r)
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }
