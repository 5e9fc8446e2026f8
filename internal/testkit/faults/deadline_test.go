package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// deadlineSlack is how long after a lease's Deadline() its loss may reach
// the holder: the timer's own lateness on a loaded machine (the promise is
// "by Deadline() plus a few ms"; CI runs with -race on two shared cores).
const deadlineSlack = 100 * time.Millisecond

// A lost lease stops the code that runs under it, at the entry point users
// call: redsem.Do. The holder is cut off from Redis (a proxy that black-holes
// its bytes), Redis is paused (SIGSTOP), renewals are off
// (DisableAutoRenew), or MaxHold stops them; in each mode fn's context must
// end by the lease's Deadline() plus the slack, with ErrLeaseLost as its
// cause, and at that moment Err and Done say so too (one moment). Where
// another client can reach Redis, the slot's next holder is granted only
// after fn's context ended. Before issue 42, Do's fn context stayed live
// 1-4 s past the deadline in every mode (the lease's Context ended before
// the lease was marked lost, and Do read Err then), while another client
// held the slot.
func TestDoCancelsAtDeadline(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, v := range variants {
		for _, mode := range []string{"cut-off", "paused", "DisableAutoRenew", "MaxHold"} {
			t.Run(v.name+"/"+mode, func(t *testing.T) {
				ctx := redistest.Ctx(t, 30*time.Second)
				name := redistest.Name(t)
				srv := redistest.Start(t)
				direct := srv.Client(t)
				var holderClient redis.UniversalClient = direct
				var p *redistest.Proxy
				o := opts{LeaseTTL: ttl, QueueTTL: ttl}
				switch mode {
				case "cut-off":
					p = redistest.StartProxy(t, srv.Addr)
					opt := srv.Options()
					opt.Addr = p.Addr
					c := redis.NewClient(opt)
					t.Cleanup(func() { _ = c.Close() })
					holderClient = c
				case "DisableAutoRenew":
					o.NoAutoRenew = true
				case "MaxHold":
					o.MaxHold = ttl / 2
				}
				s := v.new(t, holderClient, name, 1, o)
				var other closer
				if mode != "paused" {
					other = v.new(t, direct, name, 1, opts{LeaseTTL: ttl, QueueTTL: ttl})
				}
				type outcome struct {
					end, deadline time.Time
					cause, err    error
					done          bool
				}
				got := make(chan outcome, 1)
				// next: whether fn's context had ended when the next holder
				// was granted (read then, not compared by clock: fn's
				// goroutine may be scheduled a few ms after its context
				// ended on a loaded machine).
				next := make(chan bool, 1)
				err := redsem.Do(ctx, s, func(fctx context.Context, l redsem.Lease) error {
					if other != nil {
						go func() {
							o, err := other.Acquire(ctx)
							if err != nil {
								t.Errorf("the next holder: %v", err)
								next <- true
								return
							}
							next <- fctx.Err() != nil
							_ = o.Release(ctx)
						}()
					}
					switch mode {
					case "cut-off":
						p.SetBlackhole(true)
					case "paused":
						srv.Pause(t)
						defer srv.Resume(t)
					}
					select {
					case <-fctx.Done():
					case <-time.After(10 * time.Second):
						t.Fatalf("fn's context still live %v after Deadline()", time.Since(l.Deadline()))
					}
					end := time.Now()
					done := false
					select {
					case <-l.Done():
						done = true
					default:
					}
					got <- outcome{end: end, deadline: l.Deadline(), cause: context.Cause(fctx), err: l.Err(), done: done}
					return fctx.Err()
				})
				if !errors.Is(err, redsem.ErrLeaseLost) {
					t.Errorf("Do returned %v, want ErrLeaseLost", err)
				}
				r := <-got
				t.Logf("fn's context ended %v after Deadline()", r.end.Sub(r.deadline))
				if !errors.Is(r.cause, redsem.ErrLeaseLost) || !errors.Is(r.err, redsem.ErrLeaseLost) || !r.done {
					t.Errorf("when fn's context ended: cause %v, Err %v, Done closed %v; want ErrLeaseLost, ErrLeaseLost, true", r.cause, r.err, r.done)
				}
				if late := r.end.Sub(r.deadline); late > deadlineSlack {
					t.Errorf("fn's context ended %v after Deadline()", late)
				}
				if mode != "MaxHold" && r.end.Before(r.deadline) {
					t.Errorf("fn's context ended %v before Deadline(), with nothing lost yet", r.deadline.Sub(r.end))
				}
				if other != nil {
					select {
					case ended := <-next:
						if !ended {
							t.Error("the next holder was granted the slot while fn's context was live")
						}
					case <-time.After(10 * time.Second):
						t.Error("the next holder was never granted the slot")
					}
				}
			})
		}
	}
}

// A caller's Renew or Release in flight while the holder is cut off from
// Redis (a black hole) is bounded by the lease's Deadline(): it returns
// ErrLeaseLost by Deadline() plus the slack, and the lease's Context ends
// then too, with auto-renewal on or off. Before issue 42 a
// Renew(context.Background()) in flight kept the Context alive until
// go-redis gave up (9 s after Deadline()), while another client held the
// slot 21 ms after the deadline.
func TestOpInFlightEndsAtDeadline(t *testing.T) {
	const ttl = 600 * time.Millisecond
	for _, v := range variants {
		for _, op := range []string{"Renew", "Release"} {
			for _, auto := range []bool{true, false} {
				name := v.name + "/" + op + "/auto-renew"
				if !auto {
					name = v.name + "/" + op + "/DisableAutoRenew"
				}
				t.Run(name, func(t *testing.T) {
					ctx := redistest.Ctx(t, 30*time.Second)
					p, viaProxy, _ := proxied(t)
					s := v.new(t, viaProxy, redistest.Name(t), 1, opts{LeaseTTL: ttl, QueueTTL: ttl, NoAutoRenew: !auto})
					l, err := s.TryAcquire(ctx)
					if err != nil {
						t.Fatal(err)
					}
					ended := make(chan time.Time, 1)
					context.AfterFunc(l.Context(), func() { ended <- time.Now() })
					p.SetBlackhole(true)
					time.Sleep(ttl / 3)
					if op == "Renew" {
						err = l.Renew(context.Background())
					} else {
						err = l.Release(context.Background())
					}
					returned := time.Now()
					dl := l.Deadline()
					t.Logf("%s returned %v after Deadline()", op, returned.Sub(dl))
					if !errors.Is(err, redsem.ErrLeaseLost) {
						t.Errorf("%s in flight at the deadline: %v, want ErrLeaseLost", op, err)
					}
					if late := returned.Sub(dl); late > deadlineSlack {
						t.Errorf("%s returned %v after Deadline()", op, late)
					}
					select {
					case at := <-ended:
						if late := at.Sub(dl); late > deadlineSlack {
							t.Errorf("the lease's Context ended %v after Deadline()", late)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("the lease's Context never ended")
					}
					if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
						t.Errorf("Err %v, want ErrLeaseLost", l.Err())
					}
				})
			}
		}
	}
}
