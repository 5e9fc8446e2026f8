package redsem_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Issue 31: races between the engine's goroutines. Each test holds back a
// reply or a pub/sub message, as a slow network does, at the moment that
// matters, and failed before the one-owner rework of internal/core as its
// comment says.

// lateReply holds back the reply of the next call of one script (the
// command ran in Redis; its reply comes d late).
type lateReply struct {
	script lua.Script
	d      atomic.Int64 // ns; 0: off
	held   atomic.Int32 // replies held back so far
}

func (h *lateReply) arm(d time.Duration) { h.d.Store(int64(d)) }

func (h *lateReply) matches(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	arg, _ := args[1].(string)
	switch strings.ToLower(name) {
	case "evalsha", "evalsha_ro":
		return arg == h.script.Hash()
	case "eval", "eval_ro":
		return arg == h.script.Source()
	case "fcall", "fcall_ro":
		return arg == h.script.Function()
	}
	return false
}

func (h *lateReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *lateReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.matches(cmd) {
			if d := h.d.Swap(0); d > 0 {
				h.held.Add(1)
				time.Sleep(time.Duration(d))
			}
		}
		return err
	}
}

func (h *lateReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Renew that Redis ran just before the lease's local deadline, whose
// reply came after it. The loss is one moment, the deadline: the lease's
// Context, Done and Err say so then, not when the reply comes, and Renew
// reports ErrLeaseLost whatever Redis did; the renewal Redis ran is undone
// (the give-up at the deadline), so the slot comes free then, not at the
// renewed deadline. Before issue 31 the timer force-released the lease
// while the renewal was in flight and Renew still returned nil; before
// issue 42 the renewal in flight kept the lease's Context alive until its
// reply came (or go-redis gave up, seconds later).
func TestRenewReplyAfterDeadline(t *testing.T) {
	const ttl = 400 * time.Millisecond
	forEach(t, func(t *testing.T, v variant) {
		renewNearDeadline(t, func(c redis.UniversalClient, name string, noRenew bool) redsem.Semaphore {
			return mustNew(t, v, c, name, 1, opts{LeaseTTL: ttl, DisableAutoRenew: noRenew})
		})
	})
	t.Run("fair-rated", func(t *testing.T) {
		renewNearDeadline(t, func(c redis.UniversalClient, name string, noRenew bool) redsem.Semaphore {
			s, err := fair.New(c, name, 1, fair.Options{LeaseTTL: ttl, DisableAutoRenew: noRenew,
				Rate: redsem.Rate{Limit: 100, Per: time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
}

func renewNearDeadline(t *testing.T, newSem func(c redis.UniversalClient, name string, noRenew bool) redsem.Semaphore) {
	{
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		late := &lateReply{script: lua.Renew}
		c := redistest.Client(t)
		c.AddHook(late)
		s := newSem(c, name, true)
		other := newSem(redistest.Client(t), name, false)
		for round := 0; round < 3; round++ {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ended := make(chan time.Time, 1)
			context.AfterFunc(l.Context(), func() { ended <- time.Now() })
			// Renew 10-30 ms before the local deadline; its reply comes
			// 80 ms late, well after the deadline.
			time.Sleep(time.Until(l.Deadline()) - time.Duration(10+10*round)*time.Millisecond)
			late.arm(80 * time.Millisecond)
			err = l.Renew(ctx)
			returned := time.Now()
			dl := l.Deadline()
			if !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("round %d: Renew whose reply came after the deadline: %v, want ErrLeaseLost", round, err)
			}
			if !errors.Is(l.Err(), redsem.ErrLeaseLost) || !errors.Is(context.Cause(l.Context()), redsem.ErrLeaseLost) {
				t.Fatalf("round %d: after Renew: Err %v, cause %v; want ErrLeaseLost", round, l.Err(), context.Cause(l.Context()))
			}
			select {
			case <-l.Done():
			default:
				t.Fatalf("round %d: Done open after Renew reported the loss", round)
			}
			end := <-ended
			t.Logf("round %d: Context ended %v after Deadline(), Renew returned %v after it", round, end.Sub(dl), returned.Sub(dl))
			// The reply came 80 ms late: neither waited for it.
			if end.Sub(dl) > 60*time.Millisecond || returned.Sub(dl) > 60*time.Millisecond {
				t.Fatalf("round %d: the lease's Context ended %v and Renew returned %v after Deadline(): they waited for the late reply",
					round, end.Sub(dl), returned.Sub(dl))
			}
			// The renewal Redis ran is undone: the slot is free before the
			// renewed deadline (a full TTL after Redis ran it).
			var o redsem.Lease
			for o == nil {
				if o, err = other.TryAcquire(ctx); err != nil && !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatal(err)
				}
				if o == nil && time.Since(dl) > 300*time.Millisecond {
					t.Fatalf("round %d: the slot still taken %v after the lost lease's deadline: the late renewal was not undone", round, time.Since(dl))
				}
			}
			if err := o.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if late.held.Load() == 0 {
			t.Fatal("no renewal reply was held back: the test tested nothing")
		}
	}
}

// gatedConn holds back what the server sends on a pub/sub connection while
// its dialer's gate is closed: read, then kept until the gate opens (so
// messages come late, in order, and nothing is lost).
type gatedConn struct {
	net.Conn
	d      *gatedDialer
	pubsub atomic.Bool
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if strings.Contains(strings.ToLower(string(b)), "subscribe") {
		c.pubsub.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.pubsub.Load() {
		c.d.mu.Lock()
		gate := c.d.gate
		c.d.mu.Unlock()
		if gate != nil {
			<-gate
		}
	}
	return n, err
}

type gatedDialer struct {
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (d *gatedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, d: d}, nil
}

func (d *gatedDialer) close() {
	d.mu.Lock()
	d.gate = make(chan struct{})
	d.mu.Unlock()
}

func (d *gatedDialer) open() {
	d.mu.Lock()
	if d.gate != nil {
		close(d.gate)
		d.gate = nil
	}
	d.mu.Unlock()
}

// staleSetup makes a dedicated server and four fair semaphores of one name
// and limit for the stale-message tests: h, q2 and the admin client on
// plain clients, and w on a client whose pub/sub reads gd can hold back.
func staleSetup(t *testing.T, limit int) (admin *redis.Client, gd *gatedDialer, h, w, q2 *fair.Semaphore) {
	srv := redistest.Start(t)
	name := redistest.Name(t)
	o := fair.Options{LeaseTTL: 5 * time.Second, QueueTTL: 900 * time.Millisecond}
	newSem := func(c redis.UniversalClient) *fair.Semaphore {
		s, err := fair.New(c, name, limit, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	gd = &gatedDialer{}
	t.Cleanup(gd.open)
	wopt := srv.Options()
	wopt.Dialer = gd.dial
	wc := redis.NewClient(wopt)
	t.Cleanup(func() { _ = wc.Close() })
	return srv.Client(t), gd, newSem(srv.Client(t)), newSem(wc), newSem(srv.Client(t))
}

// waitersOf is a condition for redistest.WaitFor: s has n waiters.
func waitersOf(ctx context.Context, s redsem.Semaphore) func(n int) func() (bool, error) {
	return func(n int) func() (bool, error) {
		return func() (bool, error) {
			st, err := s.Status(ctx)
			return err == nil && len(st.Waiters) == n, err
		}
	}
}

// A fair grant made before a data loss and delivered after the waiter
// queued again (on the new data, under a new session) is not taken: the
// waiter's Acquire ends only with the grant Redis makes it now. Before: W's
// Acquire returned slot 0 with its old token while Q2 held slot 0 under
// limit 1 (FLUSHALL stands in for a restart without persistence).
func TestStaleFairGrantAfterDataLoss(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	admin, gd, h, w, q2 := staleSetup(t, 1)

	first, err := h.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   redsem.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := w.Acquire(ctx)
		got <- result{l, err}
	}()
	waiters := waitersOf(ctx, q2)
	redistest.WaitFor(t, 5*time.Second, "W queued", waiters(1))

	// W's pub/sub reads are held back; H's release grants W (the "g"
	// message waits in W's connection); then the data is lost.
	gd.close()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, "W granted", func() (bool, error) {
		st, err := q2.Status(ctx)
		return err == nil && len(st.Holders) == 1 && len(st.Waiters) == 0, err
	})
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := q2.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("Q2 on the emptied semaphore: %v", err)
	}
	// W's process finds its session dead at its next beat and queues W
	// again under a new one.
	redistest.WaitFor(t, 5*time.Second, "W queued again", waiters(1))
	gd.open() // the old grant arrives now

	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("W's Acquire returned slots %v (token %d) from before the data loss while Q2 holds slot %d under limit 1",
				r.l.Slots(), r.l.Token(), q.Slot())
		}
		t.Fatalf("W's Acquire failed: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release(ctx)
	st, err := q2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].ID != r.l.ID() || st.Holders[0].Token != r.l.Token() || st.Holders[0].Slot != r.l.Slot() {
		t.Fatalf("W's lease (id %s, slot %d, token %d) is not what Redis holds: %+v", r.l.ID(), r.l.Slot(), r.l.Token(), st.Holders)
	}
}

// An "x" message (SetLimit evicted the waiter as too heavy) that arrives
// after the waiter queued again does not end its Acquire: the waiter asks
// Redis, which still has it queued. Before: W's AcquireN returned ErrWeight
// and skipped the undo, so its new queue entry stayed behind as a ghost
// that held up the queue until its session expired.
func TestStaleEvictionAfterRequeue(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	admin, gd, h, w, q2 := staleSetup(t, 2)

	first, err := h.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	type result struct {
		l   redsem.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := w.AcquireN(ctx, 2)
		got <- result{l, err}
	}()
	waiters := waitersOf(ctx, q2)
	redistest.WaitFor(t, 5*time.Second, "W queued", waiters(1))
	gd.close()
	if err := h.SetLimit(ctx, 1); err != nil { // evicts W: its "x" message waits
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, "W evicted", waiters(0))
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := q2.TryAcquire(ctx) // limit 2 again (the data is gone): one slot left
	if err != nil {
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, "W queued again", waiters(1))
	gd.open() // the old "x" arrives now

	select {
	case r := <-got:
		if r.err == nil {
			_ = r.l.Release(ctx)
		}
		t.Fatalf("W's AcquireN(2) ended while it is queued and may be admitted: lease %v, err %v", r.l, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := q2.Status(ctx)
	if err != nil || len(st.Holders)+len(st.Waiters) != 0 {
		t.Fatalf("left behind: %+v %v", st, err)
	}
}

// An acquire whose request reached Redis later than LeaseTTL after it was
// sent (a slow network, go-redis re-sending it): the lease's deadline,
// counted from the send, has passed when the reply comes. No call returns
// such a lease: Acquire (through Do, where fn would run holding nothing)
// and TryAcquire ask again for the lease Redis holds under the same id, and
// return it with its remaining time. Before issue 42 they returned a lease
// already past its deadline.
func TestAcquireLateReplyNotDead(t *testing.T) {
	const ttl = 300 * time.Millisecond
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		late := &lateSend{lateReply: lateReply{script: lua.Acquire}}
		c := redistest.Client(t)
		c.AddHook(late)
		s := mustNew(t, v, c, name, 1, opts{LeaseTTL: ttl})
		check := func(what string, l redsem.Lease) {
			t.Helper()
			if late.held.Load() == 0 {
				t.Fatalf("%s: the request was not held back: the test tests nothing", what)
			}
			late.held.Store(0)
			if left := time.Until(l.Deadline()); left <= 0 || l.Err() != nil || l.Context().Err() != nil {
				t.Fatalf("%s returned a lease %v past its Deadline(), Err %v, Context %v", what, -left, l.Err(), l.Context().Err())
			}
		}
		late.arm(ttl + 100*time.Millisecond)
		err := redsem.Do(ctx, s, func(fctx context.Context, l redsem.Lease) error {
			check("Do's Acquire", l)
			return fctx.Err()
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		late.arm(ttl + 100*time.Millisecond)
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		check("TryAcquire", l)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
