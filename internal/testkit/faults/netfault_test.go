package faults_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// The reply to an acquire script is lost after the script ran: go-redis
// retries the script (MaxRetries) with the same request id, and the retry
// finds the lease already granted, so one Acquire takes one slot, not two.
// When every reply is lost the Acquire fails, and its undo leaves nothing
// behind: no holder, no queue entry.
func TestReplyLost(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			p, viaProxy, direct := proxied(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			o := opts{LeaseTTL: 2 * time.Second, QueueTTL: time.Second, Fallback: 200 * time.Millisecond}
			s := v.new(t, viaProxy, name, 2, o)
			check := v.new(t, direct, name, 2, o)

			// Load the scripts, so that the acquire below is one EVALSHA
			// (or FCALL).
			warm, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := warm.Release(ctx); err != nil {
				t.Fatal(err)
			}

			acquireMarker := marker(t, s, lua.Acquire)
			p.DropMatching(acquireMarker, 1)
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Fatalf("acquire with one lost reply: %v", err)
			}
			if droppedReplies(p) != 1 {
				t.Fatalf("%d replies dropped, want 1", droppedReplies(p))
			}
			expectHolders(t, ctx, check, l.ID())

			// Every reply lost: the acquire (granted by the script each
			// time, then retried: a lost reply is a transient error that
			// Acquire rides out) gives up when its context ends and is
			// undone, in the background.
			p.DropMatching(acquireMarker, -1)
			lost := func() {
				t.Helper()
				actx, cancel := context.WithTimeout(ctx, 2*time.Second) // a dozen tries, each reply lost
				defer cancel()
				if _, err := s.Acquire(actx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("acquire with every reply lost: %v, want the deadline", err)
				}
			}
			lost()
			if droppedReplies(p) < 2 {
				t.Fatalf("only %d replies dropped", droppedReplies(p))
			}
			eventually(t, 5*time.Second, "the abandoned grant to be undone", func() error {
				st, err := check.Status(ctx)
				if err != nil || len(st.Holders) != 1 {
					return errorf("holders %v (%v)", st.Holders, err)
				}
				return nil
			})
			expectHolders(t, ctx, check, l.ID())

			// Same with the semaphore full: the fair acquire queues each time
			// it runs, and the undo must take the queue entry out again.
			other, err := check.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			lost()
			eventually(t, 5*time.Second, "the abandoned queue entry to be undone", func() error {
				if n, err := waitersOf(ctx, check); err != nil || n != 0 {
					return errorf("%d waiters left behind (%v)", n, err)
				}
				return nil
			})
			expectHolders(t, ctx, check, l.ID(), other.ID())

			p.DropMatching(nil, 0)
			for _, x := range []redsem.Lease{l, other} {
				if err := x.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			_ = s.Close()
			expectCleanState(t, direct, name, 5*time.Second)
		})
	}
}

// The reply to a Release is lost after the script freed the slot: go-redis
// retries, and the rerun finds the tombstone the first run left, so Release
// reports success (and the Observer a release, not a lost lease). A release
// forced by someone else (the redsem command, an undo) leaves no tombstone:
// the holder's own Release still reports ErrLeaseLost after it.
func TestReleaseReplyLost(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			p, viaProxy, direct := proxied(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			var mu sync.Mutex
			kinds := map[string][]redsem.EventKind{}
			o := opts{LeaseTTL: 5 * time.Second, QueueTTL: time.Second, Fallback: 200 * time.Millisecond,
				Observer: func(ev redsem.Event) {
					if ev.LeaseID != "" {
						mu.Lock()
						kinds[ev.LeaseID] = append(kinds[ev.LeaseID], ev.Kind)
						mu.Unlock()
					}
				}}
			s := v.new(t, viaProxy, name, 1, o)
			check := v.new(t, direct, name, 1, opts{LeaseTTL: 5 * time.Second, QueueTTL: time.Second})

			// Load the scripts, so that the release below is one EVALSHA
			// (or FCALL).
			warm, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := warm.Release(ctx); err != nil {
				t.Fatal(err)
			}

			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.DropMatching(marker(t, s, lua.Release), 1)
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release with its first reply lost: %v, want nil", err)
			}
			if droppedReplies(p) != 1 {
				t.Fatalf("%d replies dropped, want 1", droppedReplies(p))
			}
			if l.Err() != nil {
				t.Fatalf("Err after a successful Release: %v", l.Err())
			}
			mu.Lock()
			got := fmt.Sprint(kinds[l.ID()])
			mu.Unlock()
			if want := fmt.Sprint([]redsem.EventKind{redsem.EventAcquired, redsem.EventReleased}); got != want {
				t.Fatalf("events %s, want %s", got, want)
			}
			other, err := check.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("the slot was not freed: %v", err)
			}
			if err := other.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// Forced release by id, as "redsem release NAME ID" does.
			l2, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if kind, err := forceRelease(ctx, direct, name, l2.ID()); err != nil || kind != core.ReleasedLease {
				t.Fatalf("forced release: kind %d, %v", kind, err)
			}
			if err := l2.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("Release after a forced release: %v, want ErrLeaseLost", err)
			}
			_ = s.Close()
			expectCleanState(t, direct, name, 10*time.Second)
		})
	}
}

// A Release that fails because Redis does not answer (a black hole, as
// through a failover or a network blip) is retried in the background: once
// Redis answers again the slot comes back long before the lease's deadline
// (it stayed held until the deadline before), the lease ends as released
// (one EventReleased, Err nil) and a second Release returns nil. So too when
// the caller cancels its Release while the request is on its way (mode
// cancel: it may yet run). Meanwhile the lease is let go: Renew returns
// ErrReleased at once, asking nothing of Redis (before, it renewed a lease
// that the retry, or the late request, released a moment later). Close
// ends the retry (mode close): the lease is still let go, never renewed,
// and its slot comes back at its deadline.
func TestReleaseRetriedAfterFailure(t *testing.T) {
	for _, v := range variants {
		for _, mode := range []string{"timeout", "cancel", "close"} {
			t.Run(v.name+"/"+mode, func(t *testing.T) {
				redistest.CheckLeaks(t)
				p, viaProxy, direct := proxied(t)
				ctx := redistest.Ctx(t, 60*time.Second)
				name := redistest.Name(t)
				var released atomic.Int32
				ttl := 20 * time.Second
				if mode == "close" {
					ttl = 2 * time.Second // the slot comes back at the deadline
				}
				s := v.new(t, viaProxy, name, 1, opts{LeaseTTL: ttl, QueueTTL: time.Second, Fallback: 200 * time.Millisecond,
					Observer: func(ev redsem.Event) {
						if ev.Kind == redsem.EventReleased {
							released.Add(1)
						}
					}})
				check := v.new(t, direct, name, 1, opts{LeaseTTL: ttl, QueueTTL: time.Second})
				l, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// The library's load, which the first call starts in the
				// background, ends before the black hole (else it waits
				// there, and WaitBackground with it, for its own bound).
				redistest.WaitFor(t, 5*time.Second, "the library loaded", func() (bool, error) {
					return core.EngineOf(s).ScriptMode() != "pending", nil
				})
				p.SetBlackhole(true)
				rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				if mode == "cancel" {
					rctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(300*time.Millisecond, cancel)
				}
				err = l.Release(rctx)
				cancel()
				if err == nil {
					t.Fatal("Release through a black hole succeeded")
				}
				if _, err := check.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatalf("while the release cannot reach Redis: %v, want ErrNoSlot (the slot still held)", err)
				}
				if mode == "close" {
					// Close ends the retry; then Redis answers again, and a
					// Renew would reach it.
					_ = s.Close()
					core.EngineOf(s).WaitBackground()
					p.SetBlackhole(false)
				}
				// The holder let the lease go: a Renew meanwhile is refused at
				// once (it asks nothing of Redis), rather than renewing a
				// lease that the retry releases a moment later.
				rctx, cancel = context.WithTimeout(ctx, 2*time.Second)
				err = l.Renew(rctx)
				cancel()
				if !errors.Is(err, redsem.ErrReleased) {
					t.Fatalf("Renew after the failed Release: %v, want ErrReleased", err)
				}
				deadline := l.Deadline()
				p.SetBlackhole(false)
				start := time.Now()
				var other redsem.Lease
				redistest.WaitFor(t, 10*time.Second, "the slot back after the failed Release", func() (bool, error) {
					other, err = check.TryAcquire(ctx)
					return err == nil, nil
				})
				t.Logf("slot back %v after Redis answered again (lease deadline %v away)", time.Since(start).Round(time.Millisecond), time.Until(deadline).Round(time.Millisecond))
				if err := other.Release(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case <-l.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the lease did not end after its background release")
				}
				if mode == "close" {
					// Nothing retried: Redis let the slot go at the lease's
					// deadline, never renewed (Redis's own deadline is a
					// little later than the local one).
					if time.Now().Before(deadline) {
						t.Fatalf("after Close the slot came back %v before the lease's deadline: something released it", time.Until(deadline))
					}
					if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
						t.Fatalf("after Close, at its deadline: Err %v, want ErrLeaseLost", l.Err())
					}
					return
				}
				if l.Err() != nil || released.Load() != 1 {
					t.Fatalf("after the background release: Err %v, %d EventReleased", l.Err(), released.Load())
				}
				if err := l.Release(ctx); err != nil {
					t.Fatalf("a second Release: %v", err)
				}
			})
		}
	}
}

// With Redis unreachable (nothing listening, or a black hole that accepts
// and never answers) Acquire, TryAcquire and Status return an error that
// says why (a net.Error, or the context's deadline) and do not hang.
func TestRedisUnreachable(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	refused := "127.0.0.1:" + strconv.Itoa(port) // nothing listens here
	for _, v := range variants {
		for _, mode := range []string{"refused", "blackhole"} {
			t.Run(v.name+"/"+mode, func(t *testing.T) {
				redistest.CheckLeaks(t)
				addr := refused
				if mode == "blackhole" {
					p := redistest.StartProxy(t, refused)
					p.SetBlackhole(true)
					addr = p.Addr
				}
				c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
				t.Cleanup(func() { _ = c.Close() })
				s := v.new(t, c, redistest.Name(t), 1, opts{})
				const deadline = time.Second
				// No hang: the call must return well within this bound (it
				// may take up to the deadline plus the 2s bounded undo).
				const bound = deadline + 8*time.Second
				// The three calls run at once, to keep the test short.
				ops := []string{"Acquire", "TryAcquire", "Status"}
				errs := make([]error, len(ops))
				took := make([]time.Duration, len(ops))
				var wg sync.WaitGroup
				for i, op := range ops {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						defer cancel()
						start := time.Now()
						switch op {
						case "Acquire":
							_, errs[i] = s.Acquire(ctx)
						case "TryAcquire":
							_, errs[i] = s.TryAcquire(ctx)
						case "Status":
							_, errs[i] = s.Status(ctx)
						}
						took[i] = time.Since(start)
					}()
				}
				wg.Wait()
				for i, op := range ops {
					err := errs[i]
					var ne net.Error
					if err == nil || !(errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)) {
						t.Fatalf("%s: %v (%T), want a net.Error or the deadline", op, err, err)
					}
					if took[i] > bound {
						t.Fatalf("%s took %v with a %v deadline", op, took[i], deadline)
					}
					t.Logf("%s: %v after %v", op, err, took[i].Round(time.Millisecond))
				}
			})
		}
	}
}

// Latency with jitter on every packet, and every connection reset (RST)
// every 150ms, while workers acquire, hold and release: never more than the
// limit at once, tokens of successive holders of a slot increase, errors are
// only network errors, and once the resets stop the workers acquire again
// and nothing is left behind.
func TestJitterAndResets(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			p, viaProxy, direct := proxied(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			const limit = 2
			s := v.new(t, viaProxy, name, limit, opts{LeaseTTL: time.Second, QueueTTL: time.Second, Fallback: 100 * time.Millisecond})
			p.SetJitter(3 * time.Millisecond)

			var (
				mu        sync.Mutex
				active    int
				peak      int
				slotToken = map[int]int64{}
				ok, fails int
				bad       []string
			)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < 5; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						actx, cancel := context.WithTimeout(ctx, 3*time.Second)
						l, err := s.Acquire(actx)
						cancel()
						mu.Lock()
						if err != nil {
							fails++
							var ne net.Error
							if !errors.As(err, &ne) && !errors.Is(err, context.DeadlineExceeded) &&
								!strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "connection reset") {
								bad = append(bad, err.Error())
							}
							mu.Unlock()
							continue
						}
						ok++
						active++
						peak = max(peak, active)
						if l.Token() <= slotToken[l.Slot()] {
							bad = append(bad, fmt.Sprintf("slot %d token %d not above %d", l.Slot(), l.Token(), slotToken[l.Slot()]))
						}
						slotToken[l.Slot()] = l.Token()
						mu.Unlock()
						time.Sleep(2 * time.Millisecond)
						mu.Lock()
						active--
						mu.Unlock()
						_ = l.Release(ctx) // may fail on a reset: the slot then expires
					}
				}()
			}
			resets := 0
			for i := 0; i < 10; i++ {
				time.Sleep(150 * time.Millisecond)
				resets += p.ResetAll()
			}
			mu.Lock()
			before := ok
			mu.Unlock()
			eventually(t, 20*time.Second, "acquisitions after the resets", func() error {
				mu.Lock()
				defer mu.Unlock()
				if ok < before+10 {
					return errorf("%d acquisitions after the resets", ok-before)
				}
				return nil
			})
			close(stop)
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if peak > limit {
				t.Fatalf("%d holders at once, limit %d", peak, limit)
			}
			if len(bad) > 0 {
				t.Fatalf("%d bad outcomes, first: %s", len(bad), bad[0])
			}
			if resets == 0 {
				t.Fatal("no connection was reset")
			}
			t.Logf("%d connections reset; %d acquisitions, %d failed", resets, ok, fails)
			_ = s.Close()
			expectCleanState(t, direct, name, 5*time.Second)
		})
	}
}
