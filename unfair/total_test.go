package unfair_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

func famStatus(t *testing.T, ctx context.Context, f *unfair.Family) redsem.FamilyStatus {
	t.Helper()
	st, err := f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A grant needs room in its member and in the family's total; AcquireN
// counts n against both; Status shows the total and its use.
func TestTotalBoundsFamily(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	f := newFamily(t, redistest.Name(t), 3, unfair.FamilyOptions{Total: 4})
	a, b, c := member(t, f, "a"), member(t, f, "b"), member(t, f, "c")
	var held []redsem.Lease
	for i := 0; i < 3; i++ {
		l, err := a.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("a #%d: %v", i, err)
		}
		held = append(held, l)
	}
	if _, err := a.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("a over its limit: %v, want ErrNoSlot", err)
	}
	if _, err := b.TryAcquireN(ctx, 2); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("b for 2 with 1 left of the total: %v, want ErrNoSlot", err)
	}
	lb, err := b.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("b for the last slot of the total: %v", err)
	}
	if _, err := c.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("c with the total full: %v, want ErrNoSlot", err)
	}
	if st := famStatus(t, ctx, f); st.Total != 4 || st.Held != 4 {
		t.Fatalf("status %+v, want total 4, held 4", st)
	}
	if _, err := c.TryAcquireN(ctx, 5); !errors.Is(err, redsem.ErrWeight) {
		t.Fatalf("5 slots from a member of limit 3: %v, want ErrWeight", err)
	}
	for _, l := range held[:2] {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lc, err := c.TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatalf("c for 2 after a released 2: %v", err)
	}
	if st := famStatus(t, ctx, f); st.Held != 4 {
		t.Fatalf("status %+v, want held 4", st)
	}
	for _, l := range []redsem.Lease{held[2], lb, lc} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := famStatus(t, ctx, f); st.Held != 0 {
		t.Fatalf("status %+v after every release, want held 0", st)
	}
}

// A total above the members' limits, with FamilyOptions.Total = 0 the
// family counts nothing and SetTotal refuses; a total with Shards > 1 or
// below zero is refused at construction.
func TestTotalConfig(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	for _, opts := range []unfair.FamilyOptions{{Total: -1}, {Total: 5, Shards: 4}, {Total: 1 << 21}} {
		var ce *redsem.ConfigError
		if _, err := unfair.NewFamily(c, "x", 2, opts); !errors.As(err, &ce) || ce.Field != "FamilyOptions.Total" {
			t.Errorf("%+v: %v, want a ConfigError naming FamilyOptions.Total", opts, err)
		}
	}
	f := newFamily(t, redistest.Name(t), 2, unfair.FamilyOptions{})
	var ce *redsem.ConfigError
	if err := f.SetTotal(ctx, 3); !errors.As(err, &ce) {
		t.Fatalf("SetTotal on a family without a total: %v, want a ConfigError", err)
	}
	l, err := member(t, f, "a").TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if st := famStatus(t, ctx, f); st.Total != 0 || st.Held != 2 {
		t.Fatalf("status of a family without a total: %+v, want total 0, held 2", st)
	}
	_ = l.Release(ctx)
}

// SetTotal changes the total live: lowered, nothing is granted until the
// family is under it; raised, a waiter refused by the total is woken.
func TestSetTotalLive(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	f := newFamily(t, redistest.Name(t), 3, unfair.FamilyOptions{Total: 4})
	a, b := member(t, f, "a"), member(t, f, "b")
	la, err := a.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetTotal(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if st := famStatus(t, ctx, f); st.Total != 2 || st.Held != 3 {
		t.Fatalf("status %+v, want total 2, held 3", st)
	}
	if _, err := b.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("b above a lowered total: %v, want ErrNoSlot", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("b's Acquire returned %v with the total full", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := f.SetTotal(ctx, 4); err != nil {
		t.Fatal(err)
	}
	raised := time.Now()
	// The waiter learns of the room from the notice SetTotal publishes (or,
	// at worst, its fallback, 1 s by default).
	if err := <-got; err != nil {
		t.Fatalf("b after SetTotal raised the total: %v", err)
	}
	t.Logf("b granted %v after SetTotal raised the total", time.Since(raised))
	if err := f.SetTotal(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if st := famStatus(t, ctx, f); st.Total != 0 || st.Held != 3 {
		t.Fatalf("status %+v after SetTotal(0), want total 0 (none), held 3", st)
	}
	lb, err := b.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatalf("b with no total: %v", err)
	}
	_ = lb.Release(ctx)
	_ = la.Release(ctx)
}

// A lease that expires in a member nobody calls any more gives its slots
// back to the total: a waiter of another member gets them. The lease is
// taken by acquire.lua run directly, as by a holder that crashed at once
// (a client's own lease would be released by its client at its deadline).
func TestTotalExpiryFreesOtherMembers(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	name := redistest.Name(t)
	f := newFamily(t, name, 2, unfair.FamilyOptions{Total: 1})
	k := core.KeysForMember(core.DefaultPrefix, name, "a")
	keys := append(append([]string{}, k.List...), core.FamilyKeys(core.DefaultPrefix, name)...)
	v, err := core.Script(lua.Acquire).Run(ctx, redistest.Client(t), keys, k.Chan, "PUBLISH", "2+1:u",
		"crashed-holder", 1, 300, "try", "-", 1000, "", 0, 0).Slice()
	if err != nil || v[0] != int64(1) {
		t.Fatalf("the crashed holder's acquire: %v, %v", v, err)
	}
	if _, err := member(t, f, "b").TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("b with the total held by a: %v, want ErrNoSlot", err)
	}
	// Past the lease's deadline (and long before the family's keys could
	// expire, at least 2 s later, which would reset the count anyway), b
	// is granted at once: the count dropped the lease at its deadline,
	// although nobody called member a.
	time.Sleep(350 * time.Millisecond)
	l, err := member(t, f, "b").TryAcquire(ctx)
	if err != nil {
		t.Fatalf("b after a's lease expired: %v", err)
	}
	_ = l.Release(ctx)
}
