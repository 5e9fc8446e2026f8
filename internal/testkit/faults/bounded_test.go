package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// closeBound is what "Close returns within a few hundred ms whatever Redis
// does" allows on a loaded CI machine.
const closeBound = time.Second

// Close while Redis is black-holed, right after an Acquire with a 50 ms
// deadline that started the process's hub there (a fair session and its
// heartbeat, an unfair subscription): Close returns within closeBound. Before issue
// 44, a fair Close took 4.95 s: it waited for a heartbeat in flight into
// the black hole, bounded only by QueueTTL/3 + 1 s.
//
// "subscribed" is the state found from outside: the subscription was made,
// then its connection dropped and the black hole swallowed go-redis's
// reconnect (its HELLO), whose lock PubSub.Close waits for: Close took
// about 10 s.
func TestCloseBoundedWhenBlackholed(t *testing.T) {
	for _, v := range variants {
		for _, when := range []string{"before subscribing", "subscribed"} {
			t.Run(v.name+"/"+when, func(t *testing.T) {
				p, viaProxy, _ := proxied(t)
				s := v.new(t, viaProxy, redistest.Name(t), 1, opts{LeaseTTL: 10 * time.Second, QueueTTL: 10 * time.Second})
				ctx := redistest.Ctx(t, 30*time.Second)
				if _, err := s.Status(ctx); err != nil { // connected, scripts loaded
					t.Fatal(err)
				}
				if when == "subscribed" {
					if _, err := s.Acquire(ctx); err != nil { // the one slot
						t.Fatal(err)
					}
					wctx, stopWaiter := context.WithCancel(ctx)
					defer stopWaiter()
					go func() { _, _ = s.Acquire(wctx) }() // subscribes and waits
					time.Sleep(200 * time.Millisecond)
					p.SetBlackhole(true)
					p.ResetAll() // the subscription reconnects, into the hole
					time.Sleep(100 * time.Millisecond)
				} else {
					p.SetBlackhole(true)
					short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
					_, _ = s.Acquire(short) // starts the hub, into the black hole
					cancel()
				}
				start := time.Now()
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took > closeBound {
					t.Errorf("Close took %v with Redis black-holed, want at most %v", took, closeBound)
				} else {
					t.Logf("Close took %v", took)
				}
			})
		}
	}
}

// refusedBound is what "as fast as TryAcquire" allows: a refused dial
// fails in a few ms; go-redis retries a refused dial with backoff, which
// failFast does not wait for.
const refusedBound = 300 * time.Millisecond

// With Redis refusing connections (its process gone), the administrative
// calls fail as fast as TryAcquire does, with ErrUnavailable, not at the
// end of their (10 s) context. Before issue 44, Status took 1.71 s and
// SetLimit 1.31 s (go-redis dialled again and again until its retries ran
// out), and every Prometheus scrape waited as long.
func TestAdminCallsFailFastWhenRefused(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client(t)
			name := redistest.Name(t)
			s := v.new(t, c, name, 2, opts{LeaseTTL: 10 * time.Second})
			var f interface {
				SetTotal(context.Context, int) error
				Status(context.Context) (redsem.FamilyStatus, error)
			}
			var famNoTotal interface {
				Status(context.Context) (redsem.FamilyStatus, error)
			}
			if v.fair {
				ff, err := fair.NewFamily(c, name+"-fam", 2, fair.FamilyOptions{Total: 3})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ff.Close() })
				f = ff
				fn, err := fair.NewFamily(c, name+"-fam0", 2, fair.FamilyOptions{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = fn.Close() })
				famNoTotal = fn
			} else {
				uf, err := unfair.NewFamily(c, name+"-fam", 2, unfair.FamilyOptions{Total: 3})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = uf.Close() })
				f = uf
				un, err := unfair.NewFamily(c, name+"-fam0", 2, unfair.FamilyOptions{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = un.Close() })
				famNoTotal = un
			}
			ctx := redistest.Ctx(t, 60*time.Second)
			if _, err := s.Status(ctx); err != nil {
				t.Fatal(err)
			}
			srv.Kill(t)
			calls := []struct {
				name string
				call func(context.Context) error
			}{
				{"TryAcquire", func(ctx context.Context) error { _, err := s.TryAcquire(ctx); return err }},
				{"Status", func(ctx context.Context) error { _, err := s.Status(ctx); return err }},
				{"SetLimit", func(ctx context.Context) error { return s.SetLimit(ctx, 3) }},
				{"SetRate", func(ctx context.Context) error { return s.SetRate(ctx, redsem.Rate{Limit: 5, Per: time.Second}) }},
				{"Family.SetTotal", func(ctx context.Context) error { return f.SetTotal(ctx, 4) }},
				{"Family.Status", func(ctx context.Context) error { _, err := f.Status(ctx); return err }},
				{"Family.Status (no total)", func(ctx context.Context) error { _, err := famNoTotal.Status(ctx); return err }},
			}
			for _, c := range calls {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				start := time.Now()
				err := c.call(cctx)
				took := time.Since(start)
				cancel()
				t.Logf("%s: %v in %v", c.name, err, took)
				if !errors.Is(err, redsem.ErrUnavailable) {
					t.Errorf("%s with Redis refusing: %v, want ErrUnavailable", c.name, err)
				}
				if took > refusedBound {
					t.Errorf("%s took %v with Redis refusing connections, want at most %v", c.name, took, refusedBound)
				}
			}
		})
	}
}
