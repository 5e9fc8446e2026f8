package fair_test

import (
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A holder that stops renewing loses its slot at its deadline, and the head
// waiter is admitted then by its session's heartbeat, which runs at the
// earliest holder deadline (the waiters' periodic heartbeat is far off, and
// no release message comes).
func TestExpiredHolderAdmitsHead(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	sh := newSem(t, redistest.Client(t), name, 1, fair.Options{LeaseTTL: 400 * time.Millisecond, DisableAutoRenew: true})
	sw := newSem(t, redistest.Client(t), name, 1, quiet)
	sw2 := newSem(t, redistest.Client(t), name, 1, quiet)

	holder, err := sh.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(ctx, sw)
	waitWaiters(t, ctx, sh, 1)
	w2 := acquireAsync(ctx, sw2)
	ids := waiterIDs(t, waitWaiters(t, ctx, sh, 2))

	// quiet's periodic heartbeat is 20s away: admission within 10s can only
	// come from the heartbeat aimed at the holder's deadline.
	l := got(t, w, 10*time.Second)
	admitted := time.Now()
	if l.ID() != ids[0] {
		t.Fatalf("admitted %s, want the head %s", l.ID(), ids[0])
	}
	if admitted.Before(holder.Deadline()) {
		t.Fatalf("admitted at %v, before the holder's deadline %v", admitted, holder.Deadline())
	}
	if l.Token() <= holder.Token() {
		t.Fatalf("token %d not above the expired holder's %d", l.Token(), holder.Token())
	}
	pending(t, w2, "the second waiter")
	if err := holder.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
		t.Fatalf("Renew of the expired holder: %v, want ErrLeaseLost", err)
	}
	select {
	case <-holder.Done():
	default:
		t.Fatal("Done not closed after the loss was found")
	}
	if err := holder.Err(); !errors.Is(err, redsem.ErrLeaseLost) {
		t.Fatalf("Err: %v", err)
	}
	if err := holder.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
		t.Fatalf("Release of the expired holder: %v, want ErrLeaseLost", err)
	}
	st := status(t, ctx, sh)
	if len(st.Holders) != 1 || st.Holders[0].ID != ids[0] || len(st.Waiters) != 1 || st.Waiters[0].ID != ids[1] {
		t.Fatalf("status %+v", st)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := got(t, w2, 10*time.Second)
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, redistest.Client(t), name)
}

// Raising the limit with SetLimit admits the head waiters at once (by
// message, well before any periodic heartbeat); lowering it revokes nothing
// but admits nobody until holders drop below it.
func TestSetLimitAdmitsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	s0 := newSem(t, redistest.Client(t), name, 1, quiet)
	s1 := newSem(t, redistest.Client(t), name, 1, quiet)
	admin := newSem(t, redistest.Client(t), name, 1, quiet)

	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < 4; i++ {
		chans = append(chans, acquireAsync(ctx, []*fair.Semaphore{s0, s1}[i%2]))
		waitWaiters(t, ctx, s0, i+1)
	}
	ids := waiterIDs(t, status(t, ctx, s0))
	if err := admin.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	l0 := got(t, chans[0], 10*time.Second)
	l1 := got(t, chans[1], 10*time.Second)
	if l0.ID() != ids[0] || l1.ID() != ids[1] || l0.Token() >= l1.Token() {
		t.Fatalf("admitted %s(%d), %s(%d); want %s then %s", l0.ID(), l0.Token(), l1.ID(), l1.Token(), ids[0], ids[1])
	}
	pending(t, chans[2], "third waiter")
	st := status(t, ctx, s1)
	if st.Limit != 3 || len(st.Holders) != 3 {
		t.Fatalf("status after SetLimit(3): %+v", st)
	}
	if got := waiterIDs(t, st); len(got) != 2 || got[0] != ids[2] || got[1] != ids[3] {
		t.Fatalf("waiters %v, want [%s %s]", got, ids[2], ids[3])
	}
	slots := map[int]bool{}
	for _, h := range st.Holders {
		if h.Slot < 0 || h.Slot >= 3 || slots[h.Slot] {
			t.Fatalf("bad or repeated slot in %+v", st.Holders)
		}
		slots[h.Slot] = true
	}

	// Lower to 1: the three holders keep their slots, and releases admit
	// nobody until no holder is left.
	if err := admin.SetLimit(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, ctx, s0); st.Limit != 1 || len(st.Holders) != 1 || len(st.Waiters) != 2 {
		t.Fatalf("after lowering to 1 and two releases: %+v", st)
	}
	pending(t, chans[2], "third waiter")
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := got(t, chans[2], 10*time.Second)
	if l2.Slot() != 0 {
		t.Fatalf("slot %d with limit 1", l2.Slot())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := got(t, chans[3], 10*time.Second)
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, c, name)
	if v, err := c.Get(ctx, keysOf(name).List[core.KeyOverride]).Result(); err != nil || v != "1" {
		t.Fatalf("override key: %q, %v", v, err)
	}
}

// Status lists holders by deadline and live waiters in admission order with
// positions 0..n-1.
func TestStatusOrder(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	const limit = 3
	var holders []redsem.Lease
	for _, ttl := range []time.Duration{60 * time.Second, 20 * time.Second, 40 * time.Second} {
		s := newSem(t, redistest.Client(t), name, limit, fair.Options{LeaseTTL: ttl, DisableAutoRenew: true})
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, l)
	}
	s := newSem(t, redistest.Client(t), name, limit, quiet)
	var chans []<-chan result
	for i := 0; i < 3; i++ {
		chans = append(chans, acquireAsync(ctx, s))
		waitWaiters(t, ctx, s, i+1)
	}
	st := status(t, ctx, s)
	if st.Limit != limit || len(st.Holders) != 3 || len(st.Waiters) != 3 {
		t.Fatalf("status %+v", st)
	}
	if !sort.SliceIsSorted(st.Holders, func(a, b int) bool { return st.Holders[a].Deadline.Before(st.Holders[b].Deadline) }) {
		t.Fatalf("holders not by deadline: %+v", st.Holders)
	}
	for i, want := range []int{1, 2, 0} { // 20s, 40s, 60s
		h := st.Holders[i]
		if h.ID != holders[want].ID() || h.Slot != holders[want].Slot() || h.Token != holders[want].Token() {
			t.Fatalf("holder %d is %+v, want lease %d", i, h, want)
		}
	}
	waiterIDs(t, st) // checks positions 0..n-1
	for _, w := range st.Waiters {
		if w.Deadline.Before(time.Now().Add(30 * time.Second)) {
			t.Fatalf("waiter deadline %v, want about a minute (QueueTTL) ahead", w.Deadline)
		}
	}
	// Ordered by arrival: releasing admits them in this order.
	for i, h := range holders {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		st2 := status(t, ctx, s)
		if len(st2.Waiters) != 2-i || (i < 2 && st2.Waiters[0].ID != st.Waiters[i+1].ID) {
			t.Fatalf("after %d releases: %+v", i+1, st2)
		}
	}
	for i, ch := range chans {
		l := got(t, ch, 10*time.Second)
		if l.ID() != st.Waiters[i].ID {
			t.Fatalf("waiter %d got lease %s, want %s", i, l.ID(), st.Waiters[i].ID)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkClean(t, ctx, redistest.Client(t), name)
}

// Once everything is released or expired, the semaphore's keys vanish by
// themselves, except the SetLimit override, which never expires.
func TestKeysVanish(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	opts := fair.Options{LeaseTTL: 300 * time.Millisecond, QueueTTL: 300 * time.Millisecond}
	s0 := newSem(t, redistest.Client(t), name, 2, opts)
	opts.DisableAutoRenew = true
	s1 := newSem(t, redistest.Client(t), name, 2, opts)
	// The override as SetLimit leaves it once its call record is gone (the
	// record keeps every key alive for 15 s, longer than this test waits).
	if err := c.Set(ctx, keysOf(name).List[core.KeyOverride], 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := s0.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(ctx, s1)
	waitWaiters(t, ctx, s0, 1)
	checkTTLs(t, ctx, c, name)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// This lease is never released nor renewed: it expires.
	got(t, w, 10*time.Second)
	_ = s0.Close()
	_ = s1.Close()
	k := keysOf(name)
	waitFor(t, 15*time.Second, "all keys but the override to expire", func() (bool, error) {
		checkTTLs(t, ctx, c, name)
		n, err := c.Exists(ctx, k.List[:core.KeyOverride]...).Result()
		return n == 0, err
	})
	if v, err := c.Get(ctx, k.List[core.KeyOverride]).Result(); err != nil || v != "1" {
		t.Fatalf("override after expiry: %q, %v", v, err)
	}
	if ttl, _ := c.PTTL(ctx, k.List[core.KeyOverride]).Result(); ttl != -1 {
		t.Fatalf("override TTL %v, want none", ttl)
	}
}

// A grant delivered by message is claimed by its session's heartbeat and
// from then on lives by its lease alone: it survives the end of the session
// (the waiter left, the session's hub stopped and its deadline passed)
// although the first renewal is far off.
func TestClaimedGrantOutlivesSession(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	c := redistest.Client(t)
	opts := fair.Options{QueueTTL: 2 * time.Second, LeaseTTL: time.Minute}
	s0 := newSem(t, redistest.Client(t), name, 1, opts)
	s1 := newSem(t, redistest.Client(t), name, 1, opts)
	holder, err := s0.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(ctx, s1)
	waitWaiters(t, ctx, s0, 1)
	if err := holder.Release(ctx); err != nil { // grants by message to s1's session
		t.Fatal(err)
	}
	l := got(t, w, 10*time.Second)
	// Run scripts (TryAcquire runs expire) until no session is left.
	waitFor(t, 15*time.Second, "every session to expire", func() (bool, error) {
		if x, err := s0.TryAcquire(ctx); err == nil {
			_ = x.Release(ctx)
			return false, fmt.Errorf("TryAcquire got a slot while %s should hold the only one", l.ID())
		} else if !errors.Is(err, redsem.ErrNoSlot) {
			return false, err
		}
		r, err := core.Inspect(ctx, c, keysOf(name))
		return r.Sessions == 0, err
	})
	if st := status(t, ctx, s0); len(st.Holders) != 1 || st.Holders[0].ID != l.ID() {
		t.Fatalf("status %+v, want %s holding", st, l.ID())
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew after the session ended: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, c, name)
}
