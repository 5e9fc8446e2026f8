package redsemhttp_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemhttp"
	"github.com/redsem/redsem/unfair"
)

// FailOpen applies only when Redis cannot be reached: on a healthy Redis a
// MaxWait so short that acquires end while their request is in flight, and
// requests whose context ended before they came, are answered 503 and
// never run without a lease. (Issue 20: with limit 2 and MaxWait 5 ms, 290
// requests ran without a lease, 30 at once.)
func TestFailOpenNeverOnHealthyRedis(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			c := redistest.Client(t)
			name := redistest.Name(t)
			var sem interface {
				Close() error
			}
			var mw func(http.Handler) http.Handler
			if variant == "fair" {
				s, err := fair.New(c, name, 2, fair.Options{})
				if err != nil {
					t.Fatal(err)
				}
				sem = s
				mw = redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(s), MaxWait: 5 * time.Millisecond, FailOpen: true})
			} else {
				s, err := unfair.New(c, name, 2, unfair.Options{})
				if err != nil {
					t.Fatal(err)
				}
				sem = s
				mw = redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(s), MaxWait: 5 * time.Millisecond, FailOpen: true})
			}
			t.Cleanup(func() { _ = sem.Close() })
			var running, most, withLease, without, refused atomic.Int64
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, ok := redsemhttp.LeaseFromContext(r.Context()); ok {
					withLease.Add(1)
				} else {
					without.Add(1)
				}
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				running.Add(-1)
			}))
			ctx := redistest.Ctx(t, 30*time.Second)
			// Warm (scripts loaded, clock known), so that some requests
			// make it in 5 ms; those that do not must be refused.
			if rec := serve(h, ctx); rec.Code != http.StatusOK && rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("warm-up request: %d", rec.Code)
			}
			var wg sync.WaitGroup
			for range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 10 {
						if rec := serve(h, ctx); rec.Code != http.StatusOK {
							refused.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			// A request whose context ended before it came.
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if rec := serve(h, gone); rec.Code != http.StatusServiceUnavailable {
				t.Errorf("request with an ended context: status %d, want 503", rec.Code)
			}
			t.Logf("%d served with a lease, %d refused (503), at most %d at once", withLease.Load(), refused.Load(), most.Load())
			if without.Load() != 0 || most.Load() > 2 {
				t.Fatalf("%d requests ran without a lease on a healthy Redis, %d at once (limit 2)", without.Load(), most.Load())
			}
		})
	}
}
