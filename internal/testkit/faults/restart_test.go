package faults_test

import (
	"errors"
	"github.com/redis/go-redis/v9"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// errRecorder collects the errors a semaphore reports to its Observer.
type errRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (r *errRecorder) observe(ev redsem.Event) {
	if ev.Err != nil {
		r.mu.Lock()
		r.errs = append(r.errs, ev.Err)
		r.mu.Unlock()
	}
}

func (r *errRecorder) noscript(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, err := range r.errs {
		if strings.Contains(err.Error(), "NOSCRIPT") {
			t.Fatalf("NOSCRIPT reached the semaphore: %v", err)
		}
	}
}

// redis-server killed and restarted empty mid-run: holders find their lease
// lost on the next renewal (a renewal never re-creates it), a blocked waiter
// carries on and gets a slot, the script cache reloads without a NOSCRIPT
// reaching anyone, and tokens keep increasing (the token floor is the server
// clock).
func TestRestartMidRun(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv := redistest.Start(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			var rec errRecorder
			o := opts{LeaseTTL: 1500 * time.Millisecond, QueueTTL: time.Second, Fallback: 300 * time.Millisecond, Observer: rec.observe}
			auto := v.new(t, c, name, 2, o)
			o.NoAutoRenew = true
			manual := v.new(t, c, name, 2, o)

			m, err := manual.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a, err := auto.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := acquireAsync(ctx, auto)
			if v.fair {
				eventually(t, 10*time.Second, "waiter queued", func() error {
					if n, err := waitersOf(ctx, auto); err != nil || n != 1 {
						return errorf("%d waiters, %v", n, err)
					}
					return nil
				})
			}

			srv.Restart(t)

			if err := m.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("renew after restart: %v, want ErrLeaseLost", err)
			}
			select {
			case <-m.Done():
			default:
				t.Fatal("Done not closed after the renewal found the lease lost")
			}
			select {
			case <-a.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("auto-renewed lease not reported lost after restart")
			}
			if !errors.Is(a.Err(), redsem.ErrLeaseLost) {
				t.Fatalf("Err %v, want ErrLeaseLost", a.Err())
			}
			w := await(t, got, 15*time.Second, "waiter after restart")
			if w.Token() <= max(m.Token(), a.Token()) {
				t.Fatalf("token %d after restart not above %d and %d", w.Token(), m.Token(), a.Token())
			}
			// The lost leases were not re-created by their renewals.
			expectHolders(t, ctx, auto, w.ID())
			// The scripts are back: in the script cache (EVALSHA), or as the
			// function library, which the engine loads again in the
			// background once a call found it missing.
			lib, _ := lua.Library()
			eventually(t, 5*time.Second, "scripts reloaded", func() error {
				libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib}).Result()
				if err != nil {
					return err
				}
				if len(libs) == 1 {
					return nil
				}
				ok, err := c.ScriptExists(ctx, lua.Acquire.Hash(), lua.Renew.Hash()).Result()
				if err != nil || !ok[0] || !ok[1] {
					return errorf("script cache %v (%v), no library %s", ok, err, lib)
				}
				return nil
			})
			if err := m.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("release of lost lease: %v", err)
			}
			if err := w.Release(ctx); err != nil {
				t.Fatal(err)
			}
			rec.noscript(t)
			_ = auto.Close()
			_ = manual.Close()
			expectCleanState(t, c, name, 5*time.Second)
		})
	}
}
