package fair_test

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Waiters spread over several Semaphore instances (separate clients, so
// separate sessions, as separate processes would have) are admitted exactly
// in arrival order, also when some of them give up on the way; the fencing
// tokens, issued in grant order, show the admission order. Meanwhile
// TryAcquire from yet another instance never jumps the queue.
func TestFIFOAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	name := redistest.Name(t)
	const limit, n = 2, 15
	var sems []*fair.Semaphore
	for i := 0; i < 3; i++ {
		sems = append(sems, newSem(t, redistest.Client(t), name, limit, fair.Options{}))
	}
	trier := newSem(t, redistest.Client(t), name, limit, fair.Options{})

	var first []redsem.Lease
	for i := 0; i < limit; i++ {
		l, err := sems[0].TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, l)
	}

	type admission struct {
		id    string
		token int64
	}
	var mu sync.Mutex
	var admitted []admission
	var wg sync.WaitGroup
	cancels := map[int]context.CancelFunc{}
	errs := make([]error, n)
	var arrival []string
	for i := 0; i < n; i++ {
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		wg.Add(1)
		go func(i int, s *fair.Semaphore) {
			defer wg.Done()
			l, err := s.Acquire(wctx)
			if err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			admitted = append(admitted, admission{l.ID(), l.Token()})
			mu.Unlock()
			time.Sleep(time.Millisecond)
			if err := l.Release(ctx); err != nil {
				errs[i] = err
			}
		}(i, sems[i%len(sems)])
		arrival = waiterIDs(t, waitWaiters(t, ctx, sems[0], i+1))
	}

	// Nobody may jump a queue of live waiters, even with TryAcquire.
	if _, err := trier.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquire with %d waiters queued: %v, want ErrNoSlot", n, err)
	}
	// Two waiters give up: one near the head, one in the middle.
	gaveUp := []int{1, 7}
	for _, i := range gaveUp {
		cancels[i]()
	}
	waitWaiters(t, ctx, sems[0], n-len(gaveUp))

	// Hammer TryAcquire while the queue drains: a success must come after
	// every waiter was admitted, so its token is above all of theirs.
	stop := make(chan struct{})
	var tried []int64
	var tryWG sync.WaitGroup
	tryWG.Add(1)
	go func() {
		defer tryWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			l, err := trier.TryAcquire(ctx)
			if err == nil {
				tried = append(tried, l.Token())
				_ = l.Release(ctx)
			} else if !errors.Is(err, redsem.ErrNoSlot) {
				t.Error(err)
				return
			}
		}
	}()
	for _, l := range first {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(stop)
	tryWG.Wait()
	for _, cancel := range cancels {
		cancel()
	}

	var want []string
	for i, id := range arrival {
		if slices.Contains(gaveUp, i) {
			if !errors.Is(errs[i], context.Canceled) {
				t.Errorf("cancelled waiter %d: %v", i, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("waiter %d: %v", i, errs[i])
		}
		want = append(want, id)
	}
	sort.Slice(admitted, func(a, b int) bool { return admitted[a].token < admitted[b].token })
	var order []string
	for _, a := range admitted {
		order = append(order, a.id)
	}
	if !slices.Equal(order, want) {
		t.Fatalf("admission order differs from arrival order:\n got %v\nwant %v", order, want)
	}
	last := admitted[len(admitted)-1].token
	for _, tok := range tried {
		if tok <= last {
			t.Fatalf("TryAcquire got token %d before the last waiter (token %d) was admitted", tok, last)
		}
	}
	t.Logf("%d waiters admitted in order; %d TryAcquire successes after the queue drained", len(order), len(tried))
	checkClean(t, ctx, redistest.Client(t), name)
}

// With a slot free and a live waiter queued (its process alive but not yet
// told), TryAcquire does not take the slot: the script grants it to the
// head waiter instead. A dead waiter at the head does not block TryAcquire.
func TestTryAcquireNeverJumpsQueue(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s := newSem(t, c, name, 1, fair.Options{})

	// A holder that crashed: a raw grant of 200 ms that nobody releases (a
	// client's own lease would be given back at its deadline).
	if v, err := script(ctx, c, lua.Acquire, name, 1, "crashed-holder", 1, 200, "try", "-", 1000, "test", 0); err != nil || v[0] != int64(1) {
		t.Fatalf("raw grant: %v %v", v, err)
	}
	// A live waiter (session alive for a minute) queues behind the holder.
	queueRaw(t, ctx, c, name, 1, "live-waiter", "livesession", time.Minute)
	// The holder expires: a slot is free and nobody has been told yet.
	waitFor(t, 10*time.Second, "the holder to expire", func() (bool, error) {
		st, err := s.Status(ctx)
		return err == nil && len(st.Holders) == 0, err
	})
	if r := raw(t, ctx, c, name); r.holders != 1 || r.queue != 1 {
		t.Fatalf("raw state before TryAcquire: %+v, want the expired holder and the waiter", r)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquire with a free slot and a live waiter: %v, want ErrNoSlot", err)
	}
	st := status(t, ctx, s)
	if len(st.Holders) != 1 || st.Holders[0].ID != "live-waiter" || len(st.Waiters) != 0 {
		t.Fatalf("the free slot should go to the head waiter: %+v", st)
	}
	if _, err := script(ctx, c, lua.Release, name, 1, "live-waiter", "force"); err != nil {
		t.Fatal(err)
	}

	// A dead waiter (its session expired) at the head is evicted, not served.
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	queueRaw(t, ctx, c, name, 1, "dead-waiter", "deadsession", 50*time.Millisecond)
	waitFor(t, 10*time.Second, "the dead waiter to drop out of Status", func() (bool, error) {
		st, err := s.Status(ctx)
		return err == nil && len(st.Waiters) == 0, err
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err = s.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire with only a dead waiter queued: %v", err)
	}

	// A grant its waiter never claims is revoked when the waiter's session
	// expires; then the slot is free again.
	queueRaw(t, ctx, c, name, 1, "frozen-waiter", "frozensession", time.Second)
	if err := l.Release(ctx); err != nil { // grants the slot to frozen-waiter
		t.Fatal(err)
	}
	if st := status(t, ctx, s); len(st.Holders) != 1 || st.Holders[0].ID != "frozen-waiter" {
		t.Fatalf("status after release: %+v, want frozen-waiter holding", st)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquire while the unclaimed grant stands: %v", err)
	}
	waitFor(t, 10*time.Second, "the unclaimed grant to lapse in Status", func() (bool, error) {
		st, err := s.Status(ctx)
		return err == nil && len(st.Holders) == 0, err
	})
	if l, err = s.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire after the unclaimed grant was revoked: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, c, name)
}
