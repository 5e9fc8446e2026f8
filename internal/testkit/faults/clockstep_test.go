package faults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// The tests in this file step the wall clock of the semaphore's Redis
// (redistest.StartWallClock), as an NTP correction or a resumed virtual
// machine does, while leases are held and waiters wait; docs/reliability.md
// ("The server's clock steps") reports what they measure.

// stepLeaseTTL and the steps of TestServerClockSteps: a step forward longer
// than a lease, a step back shorter than the fair sessions' QueueTTL.
const (
	stepLeaseTTL = time.Second
	stepQueueTTL = 10 * time.Second
	stepForward  = 3 * time.Second
	stepBack     = 2 * time.Second
)

// clockWatch is what a clock-step test knows about one semaphore: its
// keys, on a client of its own, and every fencing token granted so far.
type clockWatch struct {
	t      *testing.T
	admin  *redis.Client
	clock  *redistest.WallClock
	keys   core.Keys
	limit  int
	mu     sync.Mutex
	tokens map[int64]string // token -> lease id
	before int64            // the greatest token granted before the latest step
	last   int64            // the greatest token granted so far
}

// startClockWatch starts a server whose clock the test steps, and watches
// semaphore name on it, of limit limit.
func startClockWatch(t *testing.T, limit int) (*redistest.Server, *clockWatch, string) {
	t.Helper()
	srv, clock := redistest.StartWallClock(t)
	name := redistest.Name(t)
	return srv, &clockWatch{t: t, admin: srv.Client(t), clock: clock, limit: limit,
		keys: core.KeysFor(core.DefaultPrefix, name), tokens: map[int64]string{}}, name
}

// step moves the server's clock; every token granted from now on must be
// above every token granted before.
func (w *clockWatch) step(d time.Duration) time.Time {
	w.mu.Lock()
	w.before = w.last
	w.mu.Unlock()
	w.clock.Step(d)
	return time.Now()
}

// granted records l's token, failing the test if the token went backwards
// (not above every token granted before the latest step) or was granted
// twice.
func (w *clockWatch) granted(l redsem.Lease) {
	w.t.Helper()
	w.token(l.ID(), l.Token())
}

func (w *clockWatch) token(id string, tok int64) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if other, dup := w.tokens[tok]; dup {
		w.t.Fatalf("token %d granted twice (%s and %s)", tok, other, id)
	}
	if tok <= w.before {
		w.t.Fatalf("token went backwards: %s got %d, a lease granted before the latest step had %d", id, tok, w.before)
	}
	w.tokens[tok] = id
	w.last = max(w.last, tok)
}

// check reads the semaphore's keys and fails on any breach of the
// library's invariants, more live holders than the limit among them.
func (w *clockWatch) check(ctx context.Context, when string) *redistest.Layout {
	w.t.Helper()
	l, err := redistest.ReadLayout(ctx, w.admin, w.keys.List)
	if err != nil {
		w.t.Fatal(err)
	}
	if p := l.Check(w.limit); !p.OK() {
		w.t.Fatalf("%s: %s", when, p)
	}
	return l
}

// late is how much later than Redis's deadline for it lease l's Deadline()
// is (negative: earlier, as it should be). The server runs on this
// machine: its clock is the system's plus the step offset. Both are read
// again if the lease was renewed meanwhile.
func (w *clockWatch) late(ctx context.Context, l redsem.Lease) time.Duration {
	w.t.Helper()
	for {
		d := l.Deadline()
		ms, err := w.admin.ZScore(ctx, w.keys.List[core.KeyHolders], l.ID()).Result()
		if err != nil {
			w.t.Fatalf("deadline of %s: %v", l.ID(), err)
		}
		if l.Deadline().Equal(d) {
			return d.Sub(time.UnixMilli(int64(ms)).Add(-w.clock.Offset()))
		}
	}
}

// TestServerClockSteps: leases held and waiters waiting while the server's
// clock steps forward by more than the lease TTL and back by less than
// the fair QueueTTL, three times. After every step: no token goes
// backwards, the library's invariants hold (no more live holders than the
// limit among them); a step forward ends every lease at once in Redis, the
// holders learn it at their next renewal, the waiters get the slots, in
// arrival order (fair), and the leases they get report a Deadline() that
// is never late (before: a fair grant delivered by message before the
// waiter's engine had a reply since the step said a deadline the whole
// step late); a step back ends no renewed lease, the third
// waiter keeps its place, and the tokens granted after it run ahead of
// the server's clock by about the step.
func TestServerClockSteps(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			const limit = 2
			srv, w, name := startClockWatch(t, limit)
			ctx := redistest.Ctx(t, 60*time.Second)
			o := opts{LeaseTTL: stepLeaseTTL, QueueTTL: stepQueueTTL}
			holders := v.new(t, srv.Client(t), name, limit, o) // one process
			wc := srv.Client(t)
			refused := &replies{script: lua.Acquire, code: 0}
			renewed := renewals()
			wc.AddHook(refused)
			wc.AddHook(renewed)
			waiters := v.new(t, wc, name, limit, o) // another

			for round := 1; round <= 3; round++ {
				var held []redsem.Lease
				for i := 0; i < limit; i++ {
					l, err := holders.TryAcquire(ctx)
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					w.granted(l)
					held = append(held, l)
				}
				// Three waiters, queued one after the other (unfair: each
				// refused twice, by its try and by its try once subscribed,
				// and then waits).
				chans := map[int]<-chan result{}
				var queued []string
				for i := 0; i < 3; i++ {
					from := refused.n.Load()
					chans[i] = acquireAsync(ctx, waiters)
					eventually(t, 5*time.Second, "waiting", func() error {
						if !v.fair {
							if n := refused.n.Load() - from; n < 2 {
								return errorf("%d attempts refused", n)
							}
							return nil
						}
						st, err := waiters.Status(ctx)
						if err != nil || len(st.Waiters) != i+1 {
							return errorf("%d waiters, %v", len(st.Waiters), err)
						}
						queued = waiterIDs(st.Waiters)
						return nil
					})
				}
				w.check(ctx, "before the step forward")

				// Forward: every lease ends in Redis at once.
				ended := make(chan time.Time, len(held))
				for _, l := range held {
					go func() {
						select {
						case <-l.Done():
							ended <- time.Now()
						case <-ctx.Done():
						}
					}()
				}
				t0 := w.step(stepForward)
				got := map[int]redsem.Lease{}
				var grantAt []time.Duration
				for len(got) < limit {
					select {
					case r := <-chans[0]:
						got[0] = mustLease(t, r)
						delete(chans, 0)
					case r := <-chans[1]:
						got[1] = mustLease(t, r)
						delete(chans, 1)
					case r := <-chans[2]:
						got[2] = mustLease(t, r)
						delete(chans, 2)
					case <-time.After(10 * time.Second):
						t.Fatalf("round %d: %d of %d waiters granted 10 s after the step forward", round, len(got), limit)
					}
					grantAt = append(grantAt, time.Since(t0))
				}
				var lostAt []time.Duration
				for range held {
					select {
					case at := <-ended:
						lostAt = append(lostAt, at.Sub(t0))
					case <-time.After(stepLeaseTTL + 5*time.Second):
						t.Fatalf("round %d: a holder did not learn that its lease ended in Redis", round)
					}
				}
				for _, l := range held {
					if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
						t.Fatalf("round %d: lease ended with %v, want ErrLeaseLost", round, l.Err())
					}
				}
				var fresh []redsem.Lease
				var lateness []time.Duration
				for i := 0; i < 3; i++ {
					if l := got[i]; l != nil {
						w.granted(l)
						fresh = append(fresh, l)
						late := w.late(ctx, l)
						if late > 0 {
							t.Fatalf("round %d: %s's Deadline() is %v later than Redis's deadline for it", round, l.ID(), late)
						}
						lateness = append(lateness, late)
					}
				}
				if v.fair && (got[0] == nil || got[1] == nil || got[0].ID() != queued[0] || got[1].ID() != queued[1] ||
					got[0].Token() > got[1].Token()) {
					t.Fatalf("round %d: granted %v, want the first two of %v in order", round, leaseIDs(got), queued)
				}
				w.check(ctx, "after the step forward")
				t.Logf("round %d, +%v: waiters granted after %v, holders told lost after %v; their Deadline() late by %v",
					round, stepForward, grantAt, lostAt, lateness)

				// Back: renewed leases keep going, the third waiter waits on.
				from := renewed.n.Load()
				w.step(-stepBack)
				// Two renewals each (every LeaseTTL/3 apiece): both were renewed.
				eventually(t, 5*stepLeaseTTL, "both leases renewed after the step back", func() error {
					if n := renewed.n.Load() - from; n < int64(2*len(fresh)) {
						return errorf("%d renewals", n)
					}
					return nil
				})
				for _, l := range fresh {
					if l.Err() != nil {
						t.Fatalf("round %d: a renewed lease ended after the step back: %v", round, l.Err())
					}
				}
				var third <-chan result
				for _, ch := range chans {
					third = ch
				}
				select {
				case r := <-third:
					t.Fatalf("round %d: the third waiter returned with both slots held: %v", round, r.err)
				default:
				}
				if v.fair {
					st, err := waiters.Status(ctx)
					if err != nil || len(st.Waiters) != 1 || st.Waiters[0].ID != queued[2] {
						t.Fatalf("round %d: after the step back the queue is %v (%v), want [%s]", round, st.Waiters, err, queued[2])
					}
				}
				w.check(ctx, "after the step back")
				if err := fresh[0].Release(ctx); err != nil {
					t.Fatal(err)
				}
				l := mustLease(t, <-third)
				w.granted(l)
				lay := w.check(ctx, "after the hand-off")
				t.Logf("round %d, -%v: the third waiter's token is %v ahead of the server's clock", round, stepBack,
					time.Duration(l.Token()-lay.NowUs)*time.Microsecond)
				for _, l := range append(fresh[1:], l) {
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			expectNoEntries(t, w.admin, name, stepQueueTTL)
		})
	}
}

// replies counts, on the client it hooks, the replies of one script whose
// first element is code: refusals of acquire.lua (code 0; an unfair waiter
// is refused twice before it waits, by its try and by its try once
// subscribed to freed-slot notices), renewals by renew.lua (code 1).
type replies struct {
	script lua.Script
	code   int64
	n      atomic.Int64
}

// renewals counts the leases renewed, by renew.lua (code 1, a lease the
// user renewed) or by renewmany.lua (each positive deadline in its reply:
// the watchdog's renewals, several leases a call).
func renewals() *replies { return &replies{script: lua.Renew, code: 1} }

func (r *replies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *replies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		c, ok := cmd.(*redis.Cmd)
		if len(a) < 2 || !ok {
			return err
		}
		v, _ := c.Slice()
		switch {
		case a[1] == r.script.Function() || a[1] == r.script.Hash():
			if len(v) > 0 && v[0] == r.code {
				r.n.Add(1)
			}
		case r.script == lua.Renew && r.code == 1 && (a[1] == lua.RenewMany.Function() || a[1] == lua.RenewMany.Hash()):
			for _, d := range v[min(len(v), 1):] {
				if d, ok := d.(int64); ok && d > 0 {
					r.n.Add(1)
				}
			}
		}
		return err
	}
}

func (r *replies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// mustLease is r's lease, failing the test if Acquire failed.
func mustLease(t *testing.T, r result) redsem.Lease {
	t.Helper()
	if r.err != nil {
		t.Fatalf("Acquire: %v", r.err)
	}
	return r.l
}

// waiterIDs lists the waiters' ids, in their order.
func waiterIDs(ws []redsem.Waiter) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.ID)
	}
	return out
}

// leaseIDs prints which waiter (by the order it queued in) got which lease.
func leaseIDs(m map[int]redsem.Lease) string {
	var keys []int
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%d:%s ", k, m[k].ID())
	}
	return s
}

// TestServerClockStepBack: what a step back of the server's clock by Y
// does to a lease whose holder died, to one renewed after the step, and to
// the tombstones' pruning. The holders that die are a process's raw script
// calls (a live process with DisableAutoRenew gives its slots back itself
// once its own deadline passes).
//
//   - A lease granted just before the step and never renewed keeps its
//     slot for LeaseTTL + Y: the waiter gets it no sooner (Redis's own
//     deadline, which the step moved Y later in real time).
//   - A lease renewed after the step keeps its deadline from before it (a
//     renewal never moves a deadline earlier), and the invariants hold.
//   - Tombstones keep being pruned. Before: the next prune time stayed
//     where the clock had been, and nothing was pruned for Y.
func TestServerClockStepBack(t *testing.T) {
	skipShort(t)
	const leaseTTL = 300 * time.Millisecond
	const back = time.Second
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv, w, name := startClockWatch(t, 1)
			ctx := redistest.Ctx(t, 30*time.Second)
			o := opts{LeaseTTL: leaseTTL, QueueTTL: stepQueueTTL}
			sem := v.new(t, srv.Client(t), name, 1, o)

			// A dead holder's slot: LeaseTTL + Y.
			start := time.Now()
			w.rawGrant(ctx, "dead1", leaseTTL)
			w.step(-back)
			got := mustLease(t, <-acquireAsync(ctx, sem))
			took := time.Since(start)
			w.granted(got)
			if took < leaseTTL+back-2*time.Millisecond {
				t.Fatalf("the slot of a lease of %v went to a waiter %v after the grant, with the clock stepped back %v", leaseTTL, took, back)
			}
			t.Logf("-%v: a lease of %v whose holder died kept its slot %v", back, leaseTTL, took)
			w.check(ctx, "after the hand-off")
			if err := got.Release(ctx); err != nil {
				t.Fatal(err)
			}
			released := got.ID() // its tombstone

			// A lease renewed after the step keeps its deadline from before
			// it (a renewal never moves a deadline earlier: Resume), so its
			// slot too is held up to Y longer should its holder die.
			before := w.rawGrant(ctx, "dead2", leaseTTL)
			w.step(-back)
			r, err := core.Script(lua.Renew).Run(ctx, w.admin, w.keys.List, w.keys.Chan, "PUBLISH", 1, "dead2",
				leaseTTL.Milliseconds()).Slice()
			if err != nil || r[0] != int64(1) || r[2] != before {
				t.Fatalf("renew after a step back of %v: %v %v, want the deadline %d kept", back, r, err, before)
			}
			w.check(ctx, "after a renewal after the step back")
			r, err = core.Script(lua.Release).Run(ctx, w.admin, w.keys.List, w.keys.Chan, "PUBLISH", 1, "dead2",
				"owner", leaseTTL.Milliseconds()).Slice()
			if err != nil || r[0] != int64(1) {
				t.Fatalf("release: %v %v", r, err)
			}

			// Tombstones: the releases above left some, due leaseTTL after
			// them by the clock then; after this step they are due later,
			// but what is released now is due leaseTTL from now.
			w.step(-back)
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			w.granted(l)
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			due, err := w.admin.ZScore(ctx, w.keys.List[core.KeyEnded], l.ID()).Result()
			if err != nil {
				t.Fatal(err)
			}
			redistest.WaitFor(t, 5*time.Second, "the tombstone's time and a prune period to pass", func() (bool, error) {
				now, err := w.admin.Time(ctx).Result()
				return now.UnixMilli() > int64(due)+100, err
			})
			g, err := sem.TryAcquire(ctx) // a script: it prunes what is due
			if err != nil {
				t.Fatal(err)
			}
			w.granted(g)
			if _, err := w.admin.ZScore(ctx, w.keys.List[core.KeyEnded], l.ID()).Result(); err == nil {
				t.Fatalf("a tombstone due at %d is still there after a script ran more than 100 ms later, after a step back", int64(due))
			}
			if _, err := w.admin.ZScore(ctx, w.keys.List[core.KeyEnded], released).Result(); err != nil {
				t.Fatalf("the tombstone from before the steps back is gone: %v", err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatal(err)
			}
			w.check(ctx, "at the end")
		})
	}
}

// rawGrant grants id one slot for ttl by a raw acquire.lua call: a holder
// whose process dies at once, so that nothing renews or releases it. It
// returns the lease's deadline (server ms).
func (w *clockWatch) rawGrant(ctx context.Context, id string, ttl time.Duration) int64 {
	w.t.Helper()
	r, err := core.Script(lua.Acquire).Run(ctx, w.admin, w.keys.List, w.keys.Chan, "PUBLISH",
		w.limit, id, 1, ttl.Milliseconds(), "try", "-", 1000, "dead", 0).Slice()
	if err != nil || r[0] != int64(1) {
		w.t.Fatalf("raw acquire %s: %v %v", id, r, err)
	}
	w.token(id, r[2].(int64))
	return r[3].(int64)
}

// TestAcquireAfterClockStepForward: an Acquire with a deadline right after
// the server's clock stepped forward succeeds. Before: it failed with
// "acquire cancelled by its own undo": acquire.lua's refuse_after, the
// caller's deadline in server time, came from the engine's reply before the
// step, and the script refused the request as one held up past its
// caller's deadline.
func TestAcquireAfterClockStepForward(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv, clock := redistest.StartWallClock(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			s := v.new(t, srv.Client(t), redistest.Name(t), 1, opts{LeaseTTL: stepLeaseTTL})
			for _, call := range []struct {
				name string
				do   func(context.Context) (redsem.Lease, error)
			}{{"Acquire", s.Acquire}, {"TryAcquire", s.TryAcquire}} {
				l, err := s.TryAcquire(ctx) // the engine reads the clock
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
				clock.Step(5 * time.Second)
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, err = call.do(cctx)
				cancel()
				if err != nil {
					t.Fatalf("%s after a step forward of 5 s: %v", call.name, err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestServerClockStepPastQueueTTL: a step forward longer than the fair
// QueueTTL makes every session look dead to Redis: its waiters are evicted,
// and each process, told by its next heartbeat, has its waiters queue again.
// None is lost or hangs, and none gets a slot it should not (the library's
// invariants, the tokens), but the queue's order is not kept: they queue
// again in the order their processes and goroutines get to it (the test
// logs the order they were granted in).
func TestServerClockStepPastQueueTTL(t *testing.T) {
	skipShort(t)
	redistest.CheckLeaks(t)
	v := variant{"fair", true}
	srv, w, name := startClockWatch(t, 1)
	ctx := redistest.Ctx(t, 30*time.Second)
	const queueTTL = 2 * time.Second
	o := opts{LeaseTTL: stepLeaseTTL, QueueTTL: queueTTL}
	a := v.new(t, srv.Client(t), name, 1, o)
	b := v.new(t, srv.Client(t), name, 1, o)
	c := v.new(t, srv.Client(t), name, 1, o)
	h, err := a.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.granted(h)
	results := make(chan result, 4)
	var queued []string
	for i, s := range []redsem.Semaphore{b, c, b, c} {
		go func() { l, err := s.Acquire(ctx); results <- result{l, err} }()
		eventually(t, 5*time.Second, "queued", func() error {
			st, err := a.Status(ctx)
			if err != nil || len(st.Waiters) != i+1 {
				return errorf("%d waiters, %v", len(st.Waiters), err)
			}
			queued = waiterIDs(st.Waiters)
			return nil
		})
	}
	t0 := w.step(queueTTL + 3*time.Second)
	var order []int
	for range queued {
		var r result
		select {
		case r = <-results:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiters granted in order %v, then none for 10 s", order)
		}
		l := mustLease(t, r)
		w.granted(l)
		w.check(ctx, "after a grant")
		order = append(order, slices.Index(queued, l.ID()))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(h.Err(), redsem.ErrLeaseLost) {
		t.Fatalf("the holder's lease ended with %v, want ErrLeaseLost", h.Err())
	}
	t.Logf("+%v with QueueTTL %v: waiters queued 0 1 2 3 (processes b c b c) were granted %v, all within %v of the step",
		queueTTL+3*time.Second, queueTTL, order, time.Since(t0))
	expectNoEntries(t, w.admin, name, queueTTL)
}

// TestFencingAfterClockStepBack: after a step back of Y, tokens come from
// the counter, up to Y ahead of the server's clock. A fencing guard whose
// store is that server (its clock stepped with it) accepts them while Y is
// within its MaxSkew, and refuses them as from the future beyond it (no
// write, a clear error) until the clock has caught up; the per-slot order
// it keeps is never broken, as tokens never go backwards.
func TestFencingAfterClockStepBack(t *testing.T) {
	skipShort(t)
	redistest.CheckLeaks(t)
	srv, w, name := startClockWatch(t, 1)
	ctx := redistest.Ctx(t, 30*time.Second)
	admin := w.admin
	s := variants[0].new(t, srv.Client(t), name, 1, opts{LeaseTTL: stepLeaseTTL})
	strict, err := fencing.NewRedisGuard(admin, fencing.RedisOptions{MaxSkew: stepBack / 4})
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := fencing.NewRedisGuard(admin, fencing.RedisOptions{KeyPrefix: "lenient"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.granted(first)
	for _, g := range []*fencing.RedisGuard{strict, lenient} {
		if err := g.Check(ctx, fencing.Of("r", first)); err != nil {
			t.Fatal(err)
		}
	}
	w.step(-stepBack)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.granted(second)
	if err := strict.Check(ctx, fencing.Of("r", second)); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("a token %v ahead of the store's clock, MaxSkew %v: %v, want ErrInvalidFence",
			stepBack, stepBack/4, err)
	}
	if err := lenient.Check(ctx, fencing.Of("r", second)); err != nil {
		t.Fatalf("a token %v ahead of the store's clock, default MaxSkew: %v", stepBack, err)
	}
	if err := lenient.Check(ctx, fencing.Of("r", first)); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("the lease before the step after the one after it: %v, want ErrStale", err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
