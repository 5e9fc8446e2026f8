package fair_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// waitFamily waits until the family shows n waiters in all members.
func waitFamily(t *testing.T, ctx context.Context, f *fair.Family, n int) redsem.FamilyStatus {
	t.Helper()
	var st redsem.FamilyStatus
	waitFor(t, 10*time.Second, fmt.Sprintf("%d waiters in the family", n), func() (bool, error) {
		var err error
		st, err = f.Status(ctx)
		return err == nil && st.Waiting == n, err
	})
	return st
}

// next returns which of the pending acquires is granted next (within 10
// s), and fails the test if none is.
func next(t *testing.T, pending map[string]<-chan acquired) (string, redsem.Lease) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for name, ch := range pending {
			select {
			case a := <-ch:
				if a.err != nil {
					t.Fatalf("%s: %v", name, a.err)
				}
				delete(pending, name)
				return name, a.l
			default:
			}
		}
		select {
		case <-deadline:
			t.Fatalf("none of %d waiters granted", len(pending))
		case <-time.After(time.Millisecond):
		}
	}
}

// With the total full and waiters of several tenants queued, grants follow
// the order of arrival across tenants: a tenant that queued more (a flood)
// does not push another tenant's waiter behind it.
func TestTotalArrivalOrderAcrossTenants(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	f := newFamily(t, c, redistest.Name(t), 3, fair.FamilyOptions{Total: 2})
	full := member(t, f, "x")
	l1, err := full.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := full.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Arrival: hot#1, cold#1, hot#2, hot#3, cold#2.
	order := []string{"hot#1", "cold#1", "hot#2", "hot#3", "cold#2"}
	pending := map[string]<-chan acquired{}
	for i, name := range order {
		tenant := name[:len(name)-2]
		pending[name] = waitAcquire(ctx, member(t, f, tenant))
		waitFamily(t, ctx, f, i+1)
	}
	if st, err := f.Status(ctx); err != nil || st.Total != 2 || st.Held != 2 || st.Waiting != 5 {
		t.Fatalf("status %+v (%v), want total 2, held 2, 5 waiting", st, err)
	}
	// Each release frees one slot of the total: the earliest waiter goes.
	held := []redsem.Lease{l1, l2}
	for _, want := range order {
		if err := held[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		held = held[1:]
		got, l := next(t, pending)
		if got != want {
			t.Fatalf("granted %s, want %s (arrival order %v)", got, want, order)
		}
		held = append(held, l)
	}
	for _, l := range held {
		_ = l.Release(ctx)
	}
}

// A tenant at its own limit does not block another tenant's waiter, though
// it queued earlier: the total's room goes to the earliest waiter whose
// member has room.
func TestTotalTenantAtLimitDoesNotBlock(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	f := newFamily(t, c, redistest.Name(t), 1, fair.FamilyOptions{Total: 2})
	a, b, cm := member(t, f, "a"), member(t, f, "b"), member(t, f, "c")
	la, err := a.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// a is at its limit; its next waiter queues first.
	pa := waitAcquire(ctx, a)
	waitFamily(t, ctx, f, 1)
	// The total has room: b is granted at once, a's waiter is no obstacle.
	lb, err := b.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("b with room in the total and a's waiter at a's limit: %v", err)
	}
	// Now the total is full too: c queues behind a's waiter.
	pc := waitAcquire(ctx, cm)
	waitFamily(t, ctx, f, 2)
	// b releases: the total has room, a is still at its limit: c goes.
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got, lc := next(t, map[string]<-chan acquired{"a": pa, "c": pc})
	if got != "c" {
		t.Fatalf("granted %s, want c (a is at its own limit)", got)
	}
	// a releases: its waiter has room in a, and the total has a's slot.
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, la2 := next(t, map[string]<-chan acquired{"a": pa})
	for _, l := range []redsem.Lease{la2, lc} {
		_ = l.Release(ctx)
	}
	if st, err := f.Status(ctx); err != nil || st.Held != 0 || st.Waiting != 0 {
		t.Fatalf("status %+v (%v), want nothing held or waiting", st, err)
	}
}

// SetTotal lowered holds at once; raised, it admits the waiters it has
// room for, in arrival order.
func TestSetTotalAdmits(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	f := newFamily(t, c, redistest.Name(t), 2, fair.FamilyOptions{Total: 3})
	la, err := member(t, f, "a").TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetTotal(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := member(t, f, "b").TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("b with the lowered total full: %v, want ErrNoSlot", err)
	}
	pb := waitAcquire(ctx, member(t, f, "b"))
	waitFamily(t, ctx, f, 1)
	pc := waitAcquire(ctx, member(t, f, "c"))
	waitFamily(t, ctx, f, 2)
	if err := f.SetTotal(ctx, 3); err != nil {
		t.Fatal(err)
	}
	got, lb := next(t, map[string]<-chan acquired{"b": pb, "c": pc})
	if got != "b" {
		t.Fatalf("SetTotal(3) granted %s first, want b", got)
	}
	select {
	case a := <-pc:
		t.Fatalf("c granted (%v) with the total full", a.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := f.SetTotal(ctx, 0); err != nil { // no bound: c goes
		t.Fatal(err)
	}
	_, lc := next(t, map[string]<-chan acquired{"c": pc})
	if st, err := f.Status(ctx); err != nil || st.Total != 0 || st.Held != 4 {
		t.Fatalf("status %+v (%v), want total 0 (none), held 4", st, err)
	}
	// A waiter heavier than the total in force ends with ErrWeight.
	if err := f.SetTotal(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := member(t, f, "d").AcquireN(ctx, 2); !errors.Is(err, redsem.ErrWeight) {
		t.Fatalf("AcquireN(2) with a total of 1: %v, want ErrWeight", err)
	}
	for _, l := range []redsem.Lease{la, lb, lc} {
		_ = l.Release(ctx)
	}
}
