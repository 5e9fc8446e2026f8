package fair_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func acquireNAsync(ctx context.Context, s redsem.Semaphore, n int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.AcquireN(ctx, n)
		ch <- result{l, err}
	}()
	return ch
}

// stillWaiting fails the test if ch already has a result: that acquire must
// still be waiting.
func stillWaiting(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned %v, %v; want it still waiting", what, r.l, r.err)
	default:
	}
}

// checkLease checks a weighted lease's slots: n distinct, ascending, in
// [0, limit), Slot() the first.
func checkLease(t *testing.T, l redsem.Lease, n, limit int) {
	t.Helper()
	s := l.Slots()
	if len(s) != n || !slices.IsSorted(s) || s[0] != l.Slot() || s[0] < 0 || s[len(s)-1] >= limit {
		t.Fatalf("lease slots %v (Slot %d), want %d ascending in [0,%d)", s, l.Slot(), n, limit)
	}
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			t.Fatalf("lease slots %v repeat a slot", s)
		}
	}
}

// AcquireN is all or nothing, and n outside [1, limit] is refused at once
// without writing anything.
func TestWeightedAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s := newSem(t, c, name, 5, fair.Options{})
	for _, n := range []int{0, -1, 6} {
		if _, err := s.AcquireN(ctx, n); !errors.Is(err, redsem.ErrWeight) {
			t.Fatalf("AcquireN(%d): %v, want ErrWeight", n, err)
		}
		if _, err := s.TryAcquireN(ctx, n); !errors.Is(err, redsem.ErrWeight) {
			t.Fatalf("TryAcquireN(%d): %v, want ErrWeight", n, err)
		}
	}
	if r := raw(t, ctx, c, name); r != (rawCounts{}) {
		t.Fatalf("refused weights left %+v", r)
	}
	a, err := s.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	checkLease(t, a, 3, 5)
	if _, err := s.TryAcquireN(ctx, 3); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquireN(3) with 2 free: %v, want ErrNoSlot", err)
	}
	b, err := s.TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkLease(t, b, 2, 5)
	for _, x := range b.Slots() {
		if slices.Contains(a.Slots(), x) {
			t.Fatalf("slot %d in both %v and %v", x, a.Slots(), b.Slots())
		}
	}
	st := status(t, ctx, s)
	if len(st.Holders) != 2 || len(st.Holders[0].Slots)+len(st.Holders[1].Slots) != 5 {
		t.Fatalf("status %+v, want 2 holders of 5 slots in all", st)
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	checkClean(t, ctx, c, name)
}

// A waiter for several slots at the head is never overtaken by smaller
// requests behind it, and TryAcquireN does not jump the queue: the slots
// that free one by one stay free for it until it fits.
func TestWeightedHeadNotOvertaken(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s0 := newSem(t, redistest.Client(t), name, 4, fair.Options{})
	s1 := newSem(t, redistest.Client(t), name, 4, fair.Options{})
	var held []redsem.Lease
	for i := 0; i < 4; i++ {
		l, err := s0.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	big := acquireNAsync(ctx, s1, 3)
	waitWaiters(t, ctx, s0, 1)
	small := acquireNAsync(ctx, s1, 1)
	st := waitWaiters(t, ctx, s0, 2)
	if st.Waiters[0].Weight != 3 || st.Waiters[1].Weight != 1 {
		t.Fatalf("waiters %+v, want weights 3 then 1", st.Waiters)
	}
	// Two slots free: not enough for the head; the small waiter behind it
	// and a TryAcquire both stay out.
	for i := 0; i < 2; i++ {
		if err := held[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s0.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquire with the head waiting for 3: %v, want ErrNoSlot", err)
	}
	st = status(t, ctx, s0)
	if len(st.Holders) != 2 || len(st.Waiters) != 2 {
		t.Fatalf("status %+v: the freed slots must stay free for the head", st)
	}
	stillWaiting(t, big, "the head waiter")
	stillWaiting(t, small, "the small waiter")
	// The third free slot admits the head at once.
	if err := held[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := got(t, big, 10*time.Second)
	checkLease(t, lb, 3, 4)
	stillWaiting(t, small, "the small waiter")
	if err := held[3].Release(ctx); err != nil {
		t.Fatal(err)
	}
	ls := got(t, small, 10*time.Second)
	checkLease(t, ls, 1, 4)
	if lb.Token() >= ls.Token() {
		t.Fatalf("tokens %d (head) and %d (behind it): admission out of order", lb.Token(), ls.Token())
	}
	_ = lb.Release(ctx)
	_ = ls.Release(ctx)
	checkClean(t, ctx, c, name)
}

// A weighted waiter is woken by every way slots come free: a release, the
// expiry of a holder, a dead process's holder, the cancel of a waiter
// ahead of it, and SetLimit raising the limit.
func TestWeightedWokenByEveryFreeing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		free func(t *testing.T, ctx context.Context, f *freeing)
	}{
		{"release", func(t *testing.T, ctx context.Context, f *freeing) {
			if err := f.holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"expiry", func(t *testing.T, ctx context.Context, f *freeing) {
			// The holder was made with a short TTL and no renewal: it
			// expires by itself, and the waiting process's heartbeat admits.
		}},
		{"dead process", func(t *testing.T, ctx context.Context, f *freeing) {
			// The holder's process stops renewing (as if it died): its
			// lease runs out and nobody releases it.
			f.holderSem.Close()
		}},
		{"cancel ahead", func(t *testing.T, ctx context.Context, f *freeing) {
			f.cancelAhead()
		}},
		{"set-limit up", func(t *testing.T, ctx context.Context, f *freeing) {
			if err := f.waiterSem.SetLimit(ctx, 5); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			f := &freeing{}
			opts := fair.Options{}
			if tc.name == "expiry" || tc.name == "dead process" {
				opts = fair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true}
			}
			f.holderSem = newSem(t, redistest.Client(t), name, 3, opts)
			f.waiterSem = newSem(t, redistest.Client(t), name, 3, fair.Options{})
			// Limit 3: the holder has 2, so a waiter for 2 must wait.
			var err error
			if f.holder, err = f.holderSem.TryAcquireN(ctx, 2); err != nil {
				t.Fatal(err)
			}
			wantHeld := 2
			if tc.name == "cancel ahead" {
				// A waiter for 3 is ahead: even with 1 free, nobody behind
				// it may enter until it leaves.
				actx, cancel := context.WithCancel(ctx)
				ahead := acquireNAsync(actx, f.waiterSem, 3)
				waitWaiters(t, ctx, f.waiterSem, 1)
				f.cancelAhead = func() {
					cancel()
					if r := <-ahead; !errors.Is(r.err, context.Canceled) {
						t.Errorf("the waiter ahead: %v", r.err)
					}
				}
				wantHeld = 1
			}
			w := acquireNAsync(ctx, f.waiterSem, wantHeld)
			if tc.name == "cancel ahead" {
				waitWaiters(t, ctx, f.waiterSem, 2)
			} else {
				waitWaiters(t, ctx, f.waiterSem, 1)
			}
			stillWaiting(t, w, "the weighted waiter")
			tc.free(t, ctx, f)
			l := got(t, w, 15*time.Second)
			checkLease(t, l, wantHeld, 5)
			_ = l.Release(ctx)
			_ = f.holder.Release(ctx)
		})
	}
}

type freeing struct {
	holderSem, waiterSem *fair.Semaphore
	holder               redsem.Lease
	cancelAhead          func()
}

// SetLimit lowering the limit below a queued waiter's weight ends that
// waiter's AcquireN with ErrWeight wherever it stands; a lighter waiter
// keeps its place.
func TestWeightedSetLimitBelowWeight(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s := newSem(t, c, name, 4, fair.Options{})
	h, err := s.TryAcquireN(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	light := acquireNAsync(ctx, s, 1)
	waitWaiters(t, ctx, s, 1)
	heavy := acquireNAsync(ctx, s, 3)
	waitWaiters(t, ctx, s, 2)
	if err := s.SetLimit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-heavy:
		if !errors.Is(r.err, redsem.ErrWeight) {
			t.Fatalf("heavy waiter after SetLimit(2): %v, want ErrWeight", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("heavy waiter still waiting after SetLimit below its weight")
	}
	if st := status(t, ctx, s); len(st.Waiters) != 1 || st.Waiters[0].Weight != 1 {
		t.Fatalf("waiters %+v, want only the light one", st.Waiters)
	}
	if _, err := s.TryAcquireN(ctx, 3); !errors.Is(err, redsem.ErrWeight) {
		t.Fatalf("TryAcquireN(3) with limit 2: %v, want ErrWeight", err)
	}
	_ = h.Release(ctx)
	l := got(t, light, 10*time.Second)
	_ = l.Release(ctx)
	checkClean(t, ctx, c, name)
}

// MaxWaiters sheds load: with that many entries queued, AcquireN returns
// ErrQueueFull at once and writes nothing.
func TestMaxWaiters(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s := newSem(t, c, name, 1, fair.Options{MaxWaiters: 2})
	h, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < 2; i++ {
		chans = append(chans, acquireAsync(ctx, s))
		waitWaiters(t, ctx, s, i+1)
	}
	before := raw(t, ctx, c, name)
	if _, err := s.Acquire(ctx); !errors.Is(err, redsem.ErrQueueFull) {
		t.Fatalf("third waiter: %v, want ErrQueueFull", err)
	}
	if after := raw(t, ctx, c, name); after != before {
		t.Fatalf("a refused waiter changed %+v to %+v", before, after)
	}
	_ = h.Release(ctx)
	l := got(t, chans[0], 10*time.Second)
	_ = l.Release(ctx)
	l = got(t, chans[1], 10*time.Second)
	_ = l.Release(ctx)
}

// Owner labels leases and queue entries in Status; the default is
// hostname:pid.
func TestOwnerInStatus(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	s0 := newSem(t, redistest.Client(t), name, 1, fair.Options{Owner: "worker-7"})
	s1 := newSem(t, redistest.Client(t), name, 1, fair.Options{})
	h, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireNAsync(ctx, s1, 1)
	st := waitWaiters(t, ctx, s0, 1)
	if st.Holders[0].Owner != "worker-7" {
		t.Fatalf("holder owner %q, want worker-7", st.Holders[0].Owner)
	}
	if want := fmt.Sprintf(":%d", osGetpid()); len(st.Waiters[0].Owner) <= len(want) || st.Waiters[0].Owner[len(st.Waiters[0].Owner)-len(want):] != want {
		t.Fatalf("waiter owner %q, want hostname%s", st.Waiters[0].Owner, want)
	}
	if _, err := fair.New(redistest.Client(t), name, 1, fair.Options{Owner: "a|b"}); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Fatalf("owner with '|': %v, want ErrInvalidConfig", err)
	}
	_ = h.Release(ctx)
	l := got(t, w, 10*time.Second)
	_ = l.Release(ctx)
}

// MaxHold stops renewal once a lease is that old: the lease is lost at its
// next deadline and Done, Err and Context say so.
func TestMaxHold(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	s := newSem(t, redistest.Client(t), name, 1, fair.Options{LeaseTTL: 300 * time.Millisecond, MaxHold: 500 * time.Millisecond})
	start := time.Now()
	l, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a lease past MaxHold was not lost")
	}
	if held := time.Since(start); held < 500*time.Millisecond {
		t.Fatalf("lost after %v, before MaxHold", held)
	}
	if !errors.Is(l.Err(), redsem.ErrLeaseLost) || !errors.Is(context.Cause(l.Context()), redsem.ErrLeaseLost) {
		t.Fatalf("Err %v, Context cause %v: want ErrLeaseLost", l.Err(), context.Cause(l.Context()))
	}
	if err := l.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
		t.Fatalf("Release after loss: %v", err)
	}
	if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
		t.Fatalf("Err after Release of a lost lease: %v, want ErrLeaseLost still", l.Err())
	}
	// The slot is free again.
	waitFor(t, 10*time.Second, "the slot to free", func() (bool, error) {
		st, err := s.Status(ctx)
		return err == nil && len(st.Holders) == 0, err
	})
}

func osGetpid() int { return os.Getpid() }
