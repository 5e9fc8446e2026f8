package lua_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// Both variants run unchanged on miniredis, which users unit-test with:
// the scripts use only commands that it (and Redis 6.2) has, and plain
// PUBLISH/SUBSCRIBE outside a cluster. This checks that they run there, not
// redsem's guarantees (those are tested against real Redis).
func TestVariantsRunOnMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			defer c.Close()
			var s redsem.Semaphore
			var err error
			if variant == "fair" {
				s, err = fair.New(c, "mini-"+variant, 2, fair.Options{})
			} else {
				s, err = unfair.New(c, "mini-"+variant, 2, unfair.Options{})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			a, err := s.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatalf("TryAcquire when full: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				l, err := s.Acquire(ctx)
				if err == nil {
					err = l.Release(ctx)
				}
				done <- err
			}()
			if err := a.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := s.SetLimit(ctx, 3); err != nil {
				t.Fatal(err)
			}
			st, err := s.Status(ctx)
			if err != nil || st.Limit != 3 || len(st.Holders) != 0 {
				t.Fatalf("status %+v, %v", st, err)
			}
			// Releases that go together (releasemany.lua) run there too.
			var ls []redsem.Lease
			for range 3 {
				l, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, l)
			}
			k := core.EngineOf(s).Keys()
			r, err := core.Script(lua.ReleaseMany).Run(ctx, c, k.Script(), k.Chan, "PUBLISH", 2, 15000, ls[0].ID(), ls[1].ID()).Slice()
			if err != nil || len(r) != 3 || r[1] != int64(1) || r[2] != int64(1) {
				t.Fatalf("releasemany: %v, %v; want {now, 1, 1}", r, err)
			}
			for _, l := range ls {
				if err := l.Release(ctx); err != nil { // the first two find their tombstones
					t.Fatal(err)
				}
			}
			if st, err := s.Status(ctx); err != nil || len(st.Holders) != 0 {
				t.Fatalf("status %+v, %v", st, err)
			}
		})
	}
}

// Code that takes a redsem.Semaphore can be unit-tested on miniredis: both
// variants run on it unchanged. That checks your code, not redsem's
// guarantees (those are tested against real Redis).
func Example_miniredis() {
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	sem, err := unfair.New(client, "api", 2, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()
	ctx := context.Background()
	a, _ := sem.TryAcquire(ctx)
	b, _ := sem.TryAcquire(ctx)
	_, err = sem.TryAcquire(ctx)
	fmt.Println("third:", err)
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output: third: redsem: no slot available
}

// levelCount is a slog handler that counts records at Info and above.
type levelCount struct {
	mu   sync.Mutex
	msgs []string
}

func (h *levelCount) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelCount) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		h.mu.Lock()
		h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *levelCount) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelCount) WithGroup(string) slog.Handler      { return h }

// On miniredis, which has no CONFIG and no FUNCTION, nothing is logged at
// Info or above: both are expected there, not faults (before issue 44,
// every process logged a WARN that it cannot read maxmemory-policy, and an
// INFO about EVALSHA).
func TestMiniredisQuietLogs(t *testing.T) {
	m := miniredis.RunT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			defer c.Close()
			logs := &levelCount{}
			var s redsem.Semaphore
			var err error
			if variant == "fair" {
				s, err = fair.New(c, "quiet-"+variant, 2, fair.Options{Logger: slog.New(logs)})
			} else {
				s, err = unfair.New(c, "quiet-"+variant, 2, unfair.Options{Logger: slog.New(logs)})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for range 3 {
				l, err := s.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The policy check and the library load run in the background:
			// wait for both to end.
			e := core.EngineOf(s)
			_ = e.MaxMemoryPolicy()
			for e.ScriptMode() == "pending" {
				if ctx.Err() != nil {
					t.Fatal("the library load never ended")
				}
				time.Sleep(5 * time.Millisecond)
			}
			logs.mu.Lock()
			defer logs.mu.Unlock()
			if len(logs.msgs) != 0 {
				t.Errorf("logged on miniredis: %q", logs.msgs)
			}
		})
	}
}
