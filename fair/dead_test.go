package fair_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// acquireAsync starts Acquire in a goroutine; the lease (or error) arrives
// on the returned channel.
type result struct {
	l   redsem.Lease
	err error
}

func acquireAsync(ctx context.Context, s redsem.Semaphore) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx)
		ch <- result{l, err}
	}()
	return ch
}

// got waits up to d for an Acquire result and fails the test on error.
func got(t *testing.T, ch <-chan result, d time.Duration) redsem.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("acquire: %v", r.err)
		}
		return r.l
	case <-time.After(d):
		t.Fatalf("acquire did not return within %v", d)
	}
	return nil
}

// pending asserts that an Acquire has not returned yet.
func pending(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned early: lease %v, err %v", what, r.l, r.err)
	default:
	}
}

// A waiter whose process is killed is evicted after QueueTTL although it
// stands in the middle of the queue; the waiters behind it move up and are
// admitted in order.
func TestDeadWaiterEvictedFromMiddle(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	name := redistest.Name(t)
	opts := fair.Options{QueueTTL: 2 * time.Second, Observer: noEvictions(t)}
	s0 := newSem(t, redistest.Client(t), name, 1, opts)
	s1 := newSem(t, redistest.Client(t), name, 1, opts)
	s3 := newSem(t, redistest.Client(t), name, 1, opts)

	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w1 := acquireAsync(ctx, s1)
	waitWaiters(t, ctx, s0, 1)
	c := startChild(t, childConfig{addr: redistest.Shared(t).Addr, name: name, limit: 1,
		queueTTL: opts.QueueTTL, leaseTTL: 30 * time.Second})
	waitWaiters(t, ctx, s0, 2)
	w3 := acquireAsync(ctx, s3)
	ids := waiterIDs(t, waitWaiters(t, ctx, s0, 3))
	childID := ids[1]
	cl := redistest.Client(t)
	before := arrivals(t, ctx, cl, name)

	c.kill()
	waitFor(t, 15*time.Second, "the dead waiter's eviction", func() (bool, error) {
		r := raw(t, ctx, cl, name)
		return r.queue == 2 && r.waiters == 2, nil
	})
	// The live waiters kept their entries (not evicted and queued again).
	after0 := arrivals(t, ctx, cl, name)
	for _, id := range []string{ids[0], ids[2]} {
		if after0[id] != before[id] {
			t.Fatalf("live waiter %s has arrival number %v, had %v", id, after0[id], before[id])
		}
	}
	after := waiterIDs(t, status(t, ctx, s0))
	if want := []string{ids[0], ids[2]}; !slices.Equal(after, want) {
		t.Fatalf("queue after eviction %v, want %v (child was %s)", after, want, childID)
	}
	pending(t, w1, "first waiter")
	pending(t, w3, "third waiter")

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l1 := got(t, w1, 10*time.Second)
	if l1.ID() != ids[0] {
		t.Fatalf("admitted %s, want the head %s", l1.ID(), ids[0])
	}
	if st := status(t, ctx, s0); len(st.Waiters) != 1 || st.Waiters[0].ID != ids[2] || st.Waiters[0].Position != 0 {
		t.Fatalf("status after first admission: %+v", st)
	}
	pending(t, w3, "third waiter")
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := got(t, w3, 10*time.Second)
	if l3.ID() != ids[2] || l3.Token() <= l1.Token() {
		t.Fatalf("third admitted %s token %d after token %d", l3.ID(), l3.Token(), l1.Token())
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, cl, name)
}

// A waiter whose process is paused for less than QueueTTL keeps its place,
// and a slot granted to it while it is paused is still its own when it
// resumes.
func TestSlowWaiterKeepsPlace(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	name := redistest.Name(t)
	opts := fair.Options{QueueTTL: 5 * time.Second, Observer: noEvictions(t)}
	s0 := newSem(t, redistest.Client(t), name, 1, opts)
	s1 := newSem(t, redistest.Client(t), name, 1, opts)

	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := startChild(t, childConfig{addr: redistest.Shared(t).Addr, name: name, limit: 1,
		queueTTL: opts.QueueTTL, leaseTTL: 30 * time.Second})
	waitWaiters(t, ctx, s0, 1)
	w := acquireAsync(ctx, s1)
	ids := waiterIDs(t, waitWaiters(t, ctx, s0, 2))

	c.stop()
	c.noLine()
	time.Sleep(time.Second) // the fault: a pause well inside QueueTTL
	if got := waiterIDs(t, status(t, ctx, s0)); !slices.Equal(got, ids) {
		t.Fatalf("queue changed during a short pause: %v, want %v", got, ids)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The head is granted although its process is frozen.
	st := status(t, ctx, s0)
	if len(st.Holders) != 1 || st.Holders[0].ID != ids[0] || len(st.Waiters) != 1 || st.Waiters[0].ID != ids[1] {
		t.Fatalf("after release: %+v, want holder %s and waiter %s", st, ids[0], ids[1])
	}
	time.Sleep(500 * time.Millisecond)
	c.signal(syscall.SIGCONT)
	id, held := c.acquired(10 * time.Second)
	if id != ids[0] || held != "held" {
		t.Fatalf("child acquired %s (%s), want %s held", id, held, ids[0])
	}
	pending(t, w, "second waiter")
	c.release(10 * time.Second)
	l := got(t, w, 10*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, redistest.Client(t), name)
}

// A waiter whose process pauses longer than QueueTTL loses its place and the
// slot granted to it while it was frozen (the grant was never claimed). When
// it resumes it must not believe the stale grant message: it queues again
// and gets a real slot later. It never hangs.
func TestPausedWaiterRequeues(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	name := redistest.Name(t)
	opts := fair.Options{QueueTTL: 2 * time.Second}
	s0 := newSem(t, redistest.Client(t), name, 1, opts)
	s1 := newSem(t, redistest.Client(t), name, 1, opts)

	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := startChild(t, childConfig{addr: redistest.Shared(t).Addr, name: name, limit: 1,
		queueTTL: opts.QueueTTL, leaseTTL: 30 * time.Second})
	waitWaiters(t, ctx, s0, 1)
	w := acquireAsync(ctx, s1)
	ids := waiterIDs(t, waitWaiters(t, ctx, s0, 2))

	c.stop()
	c.noLine()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The frozen child was granted the slot; it cannot claim it, so when its
	// session expires the grant is revoked and the next waiter admitted.
	if st := status(t, ctx, s0); len(st.Holders) != 1 || st.Holders[0].ID != ids[0] {
		t.Fatalf("after release: %+v, want holder %s", st, ids[0])
	}
	l := got(t, w, 15*time.Second)
	if l.ID() != ids[1] {
		t.Fatalf("admitted %s, want %s", l.ID(), ids[1])
	}
	c.signal(syscall.SIGCONT)
	// The child must queue again rather than take the revoked grant.
	waitFor(t, 10*time.Second, "the resumed child to queue again", func() (bool, error) {
		select {
		case line := <-c.lines:
			hs, _ := redistest.Client(t).ZRangeWithScores(ctx, keysOf(name).List[core.KeyHolders], 0, -1).Result()
			ws, _ := redistest.Client(t).HGetAll(ctx, keysOf(name).List[core.KeyMeta]).Result()
			return false, fmt.Errorf("child acquired while %s holds the only slot: %s (holders %v, meta %v, status %+v)",
				l.ID(), line, hs, ws, status(t, ctx, s0))
		default:
		}
		st, err := s0.Status(ctx)
		return err == nil && len(st.Waiters) == 1, err
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	id, held := c.acquired(10 * time.Second)
	if id != ids[0] || held != "held" {
		t.Fatalf("child acquired %s (%s), want %s held", id, held, ids[0])
	}
	c.release(10 * time.Second)
	checkClean(t, ctx, redistest.Client(t), name)
}

// Live waiters keep their places however long they wait: their sessions'
// heartbeats renew them, so after several QueueTTLs every waiter still has
// its original queue entry (same arrival number) and none was evicted.
func TestLiveWaitersOutlastQueueTTL(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	opts := fair.Options{QueueTTL: 2 * time.Second, Observer: noEvictions(t)}
	s0 := newSem(t, redistest.Client(t), name, 1, opts)
	s1 := newSem(t, redistest.Client(t), name, 1, opts)
	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < 3; i++ {
		chans = append(chans, acquireAsync(ctx, []*fair.Semaphore{s1, s0}[i%2]))
		waitWaiters(t, ctx, s0, i+1)
	}
	first := status(t, ctx, s0)
	before := arrivals(t, ctx, c, name)
	// Wait until every session was renewed to 1.5 QueueTTL beyond its
	// first deadline.
	waitFor(t, 15*time.Second, "the sessions to be renewed", func() (bool, error) {
		st, err := s0.Status(ctx)
		if err != nil || len(st.Waiters) != 3 {
			return false, err
		}
		for i, w := range st.Waiters {
			if w.Deadline.Before(first.Waiters[i].Deadline.Add(opts.QueueTTL * 3 / 2)) {
				return false, nil
			}
		}
		return true, nil
	})
	if got := waiterIDs(t, status(t, ctx, s0)); !slices.Equal(got, waiterIDs(t, first)) {
		t.Fatalf("queue %v, was %v", got, waiterIDs(t, first))
	}
	if after := arrivals(t, ctx, c, name); !maps.Equal(after, before) {
		t.Fatalf("arrival numbers changed from %v to %v: waiters were evicted and queued again", before, after)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		l := got(t, ch, 10*time.Second)
		if l.ID() != first.Waiters[i].ID {
			t.Fatalf("admission %d: %s, want %s", i, l.ID(), first.Waiters[i].ID)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkClean(t, ctx, c, name)
}

// Close while an Acquire is blocked (with a context that never ends) must
// not leave it hanging: it returns an error and leaves the queue.
func TestCloseUnblocksAcquire(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	s0 := newSem(t, redistest.Client(t), name, 1, fair.Options{})
	s1 := newSem(t, redistest.Client(t), name, 1, fair.Options{})
	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(context.Background(), s1)
	waitWaiters(t, ctx, s0, 1)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-w:
		if !errors.Is(r.err, redsem.ErrClosed) {
			t.Fatalf("Acquire after Close: lease %v, err %v; want ErrClosed", r.l, r.err)
		}
		t.Logf("Acquire after Close: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire still blocked 10s after Close")
	}
	st := status(t, ctx, s0)
	if len(st.Waiters) != 0 || len(st.Holders) != 1 {
		t.Fatalf("status after Close: %+v", st)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, redistest.Client(t), name)
}
