package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// totalFamily is what both variants' families offer that these tests use.
type totalFamily interface {
	SetTotal(ctx context.Context, total int) error
	Status(ctx context.Context) (redsem.FamilyStatus, error)
	Get(key string) (redsem.Semaphore, error)
	Close() error
}

type fairFamily struct{ *fair.Family }

func (f fairFamily) Get(key string) (redsem.Semaphore, error) { return f.Family.Get(key) }

type unfairFamily struct{ *unfair.Family }

func (f unfairFamily) Get(key string) (redsem.Semaphore, error) { return f.Family.Get(key) }

// newTotalFamily builds variant v's family of name on c with limit per
// member and total, closed when the test ends.
func newTotalFamily(t *testing.T, variant string, c redis.UniversalClient, name string, limit, total int, o fair.Options) totalFamily {
	t.Helper()
	var f totalFamily
	if variant == "fair" {
		ff, err := fair.NewFamily(c, name, limit, fair.FamilyOptions{Options: o, Total: total})
		if err != nil {
			t.Fatal(err)
		}
		f = fairFamily{ff}
	} else {
		uf, err := unfair.NewFamily(c, name, limit, unfair.FamilyOptions{Options: unfair.Options{LeaseTTL: o.LeaseTTL,
			DisableAutoRenew: o.DisableAutoRenew, KeyPrefix: o.KeyPrefix}, Total: total})
		if err != nil {
			t.Fatal(err)
		}
		f = unfairFamily{uf}
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// A SetTotal whose reply was lost, re-sent by go-redis after another
// client's later SetTotal returned: the re-sent copy must not undo it.
// Before issue 43 SetTotal had no call id: A's SetTotal(4), re-sent after
// B's SetTotal(1) returned nil, left the total at 4.
func TestResentSetTotalDoesNotUndoLaterSetTotal(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			srv := redistest.Shared(t)
			proxy := redistest.StartProxy(t, srv.Addr)
			opt := srv.Options()
			opt.Addr = proxy.Addr
			opt.MaxRetries = 1
			opt.MinRetryBackoff, opt.MaxRetryBackoff = 500*time.Millisecond, 500*time.Millisecond
			ca := redis.NewClient(opt)
			t.Cleanup(func() { _ = ca.Close() })
			name := redistest.Name(t)
			o := fair.Options{KeyPrefix: uniquePrefix(), LeaseTTL: 10 * time.Second}
			a := newTotalFamily(t, variant, ca, name, 2, 3, o)
			b := newTotalFamily(t, variant, redistest.Client(t), name, 2, 3, o)
			// A first SetTotal opens A's connection and loads the script, so
			// that the reply lost below is the one of the call that counts.
			if err := a.SetTotal(ctx, 3); err != nil {
				t.Fatal(err)
			}
			m, err := a.Get("k")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Status(ctx); err != nil {
				t.Fatal(err)
			}
			settled(ctx, t, m)                       // and loads the function library (whose text names f:total), if the server takes it
			proxy.DropMatching([]byte("f:total"), 1) // the reply of settotal.lua (its KEYS name f:total)
			aDone := make(chan error, 1)
			go func() { aDone <- a.SetTotal(ctx, 4) }()
			waitUntil(ctx, t, "A's SetTotal(4) took effect", func() bool {
				st, err := b.Status(ctx)
				return err == nil && st.Total == 4
			})
			if err := b.SetTotal(ctx, 1); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-aDone:
				t.Fatalf("A's SetTotal returned (%v) before B's SetTotal: the retry backoff is too short to arrange the case", err)
			default:
			}
			if err := <-aDone; err != nil && !errors.Is(err, redis.ErrClosed) {
				t.Logf("A's SetTotal: %v", err)
			}
			st, err := b.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Total != 1 {
				t.Errorf("total in force %d after A's SetTotal(4) (seen by B) and then B's SetTotal(1): the re-sent SetTotal(4) undid B's", st.Total)
			}
		})
	}
}

// Waiters queued in eight members that hold nothing, only because the
// family's total is full, wait longer than the keys of an idle member live
// (and than QueueTTL): none may lose its place, and once the total frees
// they are all granted, in their arrival order. Before issue 43 a member
// whose keys nobody extended (queueing did not, and the process's beat ran
// on one member at random) expired with its queue entry: 5 of 8 entries
// vanished within 5 s and their Acquire calls never returned.
func TestFamilyTotalIdleWaitersKeepTheirPlace(t *testing.T) {
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	ctx := redistest.Ctx(t, 60*time.Second)
	name := redistest.Name(t)
	f := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 1,
		fair.Options{LeaseTTL: 10 * time.Second, QueueTTL: 3 * time.Second})
	holdSem, err := f.Get("holder")
	if err != nil {
		t.Fatal(err)
	}
	hold, err := holdSem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	type grant struct {
		i  int
		at time.Time
	}
	granted := make(chan grant, n)
	errs := make(chan error, n)
	for i := range n {
		m, err := f.Get(fmt.Sprintf("m%d", i))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			l, err := m.Acquire(ctx)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			granted <- grant{i, time.Now()}
			if err := l.Release(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d: release: %w", i, err)
			}
		}()
		// Queued before the next one arrives: arrival order is i's.
		waitUntil(ctx, t, fmt.Sprintf("waiter %d queued", i), func() bool {
			st, err := f.Status(ctx)
			return err == nil && st.Waiting == i+1
		})
	}
	// Idle: longer than an idle member's keys live (2 s) and than QueueTTL.
	idle := 5 * time.Second
	time.Sleep(idle)
	st, err := f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Waiting != n {
		t.Errorf("after %v idle, %d of %d queue entries are left", idle, st.Waiting, n)
	}
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var order []int
	for len(order) < n {
		select {
		case g := <-granted:
			order = append(order, g.i)
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("after the total freed, only %v of %d waiters were granted within 10 s", order, n)
		}
	}
	for k, i := range order {
		if i != k {
			t.Fatalf("granted in the order %v, want the arrival order", order)
		}
	}
}

// A member's head passed over at its limit, and a later head of another
// member: when the first member's holder expires (its process cut off, so
// no call on that member tells the family), the earlier head must go first.
// P0 holds member A's only slot and is cut off; P3 holds member B's; the
// total (2) is full. P1 queues W1 in A (at its limit: its f:heads entry is
// negated), then P2 queues W2 in C. P1's heartbeats reach Redis 300 ms late,
// so P2's beat is the first call after A's holder expired. Before issue 43
// that beat's admit_total counted the expired lease out of the total but
// never looked at A again, and granted W2 ahead of W1 (who then waited for
// the total behind it).
func TestFamilyTotalEarliestHeadAfterExpiry(t *testing.T) {
	ctx := redistest.Ctx(t, 60*time.Second)
	srv := redistest.Start(t)
	name := redistest.Name(t)
	o := fair.Options{LeaseTTL: 900 * time.Millisecond, QueueTTL: 900 * time.Millisecond}
	proxy := redistest.StartProxy(t, srv.Addr)
	opt := srv.Options()
	opt.Addr = proxy.Addr
	c0 := redis.NewClient(opt)
	t.Cleanup(func() { _ = c0.Close() })
	p0 := newTotalFamily(t, "fair", c0, name, 1, 2, o)
	p3 := newTotalFamily(t, "fair", srv.Client(t), name, 1, 2, o)
	late := &lateSend{lateReply: lateReply{script: lua.Heartbeat}, every: true}
	c1 := srv.Client(t)
	c1.AddHook(late)
	p1 := newTotalFamily(t, "fair", c1, name, 1, 2, o)
	p2 := newTotalFamily(t, "fair", srv.Client(t), name, 1, 2, o)
	get := func(f totalFamily, key string) redsem.Semaphore {
		s, err := f.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hA, err := get(p0, "A").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hB, err := get(p3, "B").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hB.Release(ctx) }()
	type res struct {
		l   redsem.Lease
		err error
	}
	w1, w2 := make(chan res, 1), make(chan res, 1)
	go func() { l, err := get(p1, "A").Acquire(ctx); w1 <- res{l, err} }()
	waitUntil(ctx, t, "W1 queued", func() bool { st, err := p3.Status(ctx); return err == nil && st.Waiting == 1 })
	go func() { l, err := get(p2, "C").Acquire(ctx); w2 <- res{l, err} }()
	waitUntil(ctx, t, "W2 queued", func() bool { st, err := p3.Status(ctx); return err == nil && st.Waiting == 2 })
	late.arm(300 * time.Millisecond)
	proxy.SetBlackhole(true) // P0 cut off: A's holder expires in Redis, unreleased
	var first res
	select {
	case first = <-w1:
	case r := <-w2:
		if r.err == nil {
			_ = r.l.Release(ctx)
		}
		t.Fatalf("W2 (later, member C) granted before W1 (earlier, member A) after A's holder expired: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatalf("W1 not granted within 10 s of A's holder's expiry (A's holder lost: %v)", hA.Err())
	}
	if first.err != nil {
		t.Fatal(first.err)
	}
	select {
	case r := <-w2:
		t.Fatalf("W2 granted while W1 and B's holder fill the total of 2: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-w2:
		if r.err != nil {
			t.Fatal(r.err)
		}
		_ = r.l.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("W2 not granted after W1 released")
	}
}

// A client built without a Total, beside clients of the family built with
// one: it must not push the family past its total. It is refused
// (ErrLimitMismatch, naming the total) while the family counts a total,
// whether SetTotal set it or live clients established it, and whether the
// member it asks for is used already or new. Before issue 43 it counted
// nothing: with Total 3, two members at limit 2 held 5 slots in all.
func TestFamilyWithoutTotalCannotBypass(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			o := fair.Options{LeaseTTL: 10 * time.Second}
			a := newTotalFamily(t, variant, redistest.Client(t), name, 2, 3, o)
			b := newTotalFamily(t, variant, redistest.Client(t), name, 2, 0, o)
			get := func(f totalFamily, key string) redsem.Semaphore {
				s, err := f.Get(key)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			l1, err := get(a, "x").AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			l2, err := get(a, "y").TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The total (3) is full. The client without a total asks in a
			// used member and in a new one, both with room of their own.
			for _, key := range []string{"y", "z"} {
				l, err := get(b, key).TryAcquire(ctx)
				if err == nil {
					_ = l.Release(ctx)
					t.Fatalf("the client without a total was granted a slot of member %q with the total of 3 full", key)
				}
				if !errors.Is(err, redsem.ErrLimitMismatch) || !strings.Contains(err.Error(), "without a total") {
					t.Fatalf("member %q: %v, want ErrLimitMismatch saying the client has no total", key, err)
				}
			}
			st, err := a.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held != 3 {
				t.Fatalf("family holds %d, want 3", st.Held)
			}
			// SetTotal's total, once nothing is held (counting goes on).
			_ = l1.Release(ctx)
			_ = l2.Release(ctx)
			if err := a.SetTotal(ctx, 5); err != nil {
				t.Fatal(err)
			}
			if _, err := get(b, "w").TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
				t.Fatalf("after SetTotal(5): %v, want ErrLimitMismatch", err)
			}
		})
	}
}

// A client built without a Total grants nothing, admits nothing and takes
// over no lease while its family counts a total, whatever it calls; the
// acquire refusal above was its only guard before (outside review of
// 2026-12-07, 3 of 3 runs each):
//   - fair: its SetLimit raised a member's limit and admitted a waiter there
//     without counting it (3 leases held under a total of 2);
//   - both: its Resume took over a counted lease, whose renewals then did
//     not move the family's copy of the deadline: the lease was counted out
//     at its old deadline while it lived;
//   - fair: its waiter queued before the family counted a total was
//     admitted, uncounted, by its own Release;
//   - fair (found while fixing those, 3 of 3): admitted by a client with
//     the total, that waiter's lease was counted, but its renewals did not
//     keep it counted: counted out at its first deadline while it lived.
func TestFamilyWithoutTotalGrantsNothing(t *testing.T) {
	get := func(t *testing.T, f totalFamily, key string) redsem.Semaphore {
		t.Helper()
		s, err := f.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// background acquires in s and reports its lease (or error) on the
	// channel it returns.
	type result struct {
		l   redsem.Lease
		err error
	}
	background := func(ctx context.Context, s redsem.Semaphore) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := s.Acquire(ctx)
			ch <- result{l, err}
		}()
		return ch
	}
	t.Run("fair/SetLimit", func(t *testing.T) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		o := fair.Options{LeaseTTL: 10 * time.Second}
		a := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 2, o)
		nt := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 0, o)
		if err := a.SetTotal(ctx, 2); err != nil {
			t.Fatal(err)
		}
		held, err := get(t, a, "a").TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(ctx)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waiter := background(wctx, get(t, a, "a"))
		waitUntil(ctx, t, "the waiter queued in member a", func() bool {
			st, err := get(t, a, "a").Status(ctx)
			return err == nil && len(st.Waiters) == 1
		})
		// The client without a total raises member a's limit: the total
		// (2) still bounds what the family holds, whoever is admitted.
		if err := get(t, nt, "a").SetLimit(ctx, 2); err != nil {
			t.Fatal(err)
		}
		var leases []redsem.Lease
		defer func() {
			for _, l := range leases {
				_ = l.Release(ctx)
			}
		}()
		select {
		case r := <-waiter:
			if r.err != nil {
				t.Fatal(r.err)
			}
			leases = append(leases, r.l)
		case <-time.After(300 * time.Millisecond):
		}
		if l, err := get(t, a, "b").TryAcquire(ctx); err == nil {
			leases = append(leases, l)
		} else if !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatal(err)
		}
		if n := 1 + len(leases); n > 2 {
			t.Fatalf("%d leases held under a total of 2 after SetLimit from a client without a total", n)
		}
		st, err := a.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held != 1+len(leases) {
			t.Fatalf("the family counts %d held, its holders %d", st.Held, 1+len(leases))
		}
	})
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant+"/Resume", func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			o := fair.Options{LeaseTTL: 10 * time.Second}
			a := newTotalFamily(t, variant, redistest.Client(t), name, 2, 2, o)
			nt := newTotalFamily(t, variant, redistest.Client(t), name, 2, 0, o)
			l, err := get(t, a, "a").TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			r, err := get(t, nt, "a").Resume(ctx, l.ID())
			if err == nil {
				_ = r.Release(ctx)
				t.Fatal("a client without a total resumed a lease its family counts")
			}
			if !errors.Is(err, redsem.ErrLimitMismatch) || !strings.Contains(err.Error(), "without a total") {
				t.Fatalf("Resume: %v, want ErrLimitMismatch saying the client has no total", err)
			}
			if err := l.Renew(ctx); err != nil {
				t.Fatalf("the lease after the refused Resume: %v", err)
			}
			st, err := a.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held != 1 {
				t.Fatalf("the family counts %d held, want 1", st.Held)
			}
		})
	}
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant+"/ResumeUncounted", func(t *testing.T) {
			// The rolling introduction of a total: a lease granted before
			// the family counted one is not counted, and its holders renew
			// and release it without the family's keys. A client with the
			// total must not take it over: counting it in (as ca2303e did)
			// left the count stale after a release through the old handle,
			// and dropped it while the old handle renewed it on once the
			// new one stopped: 4 slots under a total of 2 (outside review
			// of 2026-12-07, 4 of 4 runs each).
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			o := fair.Options{LeaseTTL: 10 * time.Second}
			nt := newTotalFamily(t, variant, redistest.Client(t), name, 2, 0, o)
			old, err := get(t, nt, "a").TryAcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Release(ctx)
			a := newTotalFamily(t, variant, redistest.Client(t), name, 2, 3, o)
			if err := a.SetTotal(ctx, 3); err != nil {
				t.Fatal(err)
			}
			r, err := get(t, a, "a").Resume(ctx, old.ID())
			if err == nil {
				_ = r.Release(ctx)
				t.Fatal("a client with the total took over a lease its family does not count")
			}
			if !errors.Is(err, redsem.ErrLimitMismatch) || !strings.Contains(err.Error(), "not in the count") {
				t.Fatalf("Resume: %v, want ErrLimitMismatch saying the lease is not counted", err)
			}
			// Nothing changed: the old handle renews and releases it, and
			// the family's count never saw it.
			if err := old.Renew(ctx); err != nil {
				t.Fatalf("the old handle after the refused Resume: %v", err)
			}
			st, err := a.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held != 0 {
				t.Fatalf("the family counts %d held, want 0 (the lease is not counted)", st.Held)
			}
			if err := old.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := get(t, a, "b").TryAcquireN(ctx, 2)
			if err != nil {
				t.Fatalf("after the old handle's release: %v", err)
			}
			_ = l.Release(ctx)
		})
	}
	t.Run("fair/AdmittedByTotal", func(t *testing.T) {
		// The rolling introduction of a total (operations.md): a process
		// without a total has a waiter queued, a process with one queues
		// behind it in the same member. The waiter without a total must not
		// be admitted by the process with one: its renewals would not keep
		// its lease counted.
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		// The process with the total beats often, the one without seldom:
		// the first has the chance to admit the waiter of the second.
		o := fair.Options{LeaseTTL: time.Second, QueueTTL: 3 * time.Second, FallbackInterval: 300 * time.Millisecond}
		a := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 1, o)
		nt := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 0,
			fair.Options{LeaseTTL: time.Second, QueueTTL: 30 * time.Second, FallbackInterval: 10 * time.Second})
		l, err := get(t, nt, "a").TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ntWaiter := background(ctx, get(t, nt, "a"))
		waitUntil(ctx, t, "the waiter without a total queued in member a", func() bool {
			st, err := get(t, nt, "a").Status(ctx)
			return err == nil && len(st.Waiters) == 1
		})
		if err := a.SetTotal(ctx, 1); err != nil {
			t.Fatal(err)
		}
		aWaiter := background(ctx, get(t, a, "a"))
		waitUntil(ctx, t, "the waiter with the total queued behind it", func() bool {
			st, err := get(t, nt, "a").Status(ctx)
			return err == nil && len(st.Waiters) == 2
		})
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var held []redsem.Lease
		defer func() {
			for _, l := range held {
				_ = l.Release(ctx)
			}
		}()
		select {
		case r := <-ntWaiter:
			if r.err == nil {
				held = append(held, r.l)
				// Its renewals must keep it counted: past its first
				// deadline, the total (1) must still be full.
				time.Sleep(2500 * time.Millisecond)
				if l2, err := get(t, a, "b").TryAcquire(ctx); err == nil {
					held = append(held, l2)
					t.Fatal("2 leases held under a total of 1: the lease of the client without a total was counted out while it lived")
				}
			} else if !errors.Is(r.err, redsem.ErrLimitMismatch) {
				t.Fatalf("the waiter without a total: %v, want ErrLimitMismatch", r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter without a total still waits after 10 s")
		}
		select {
		case r := <-aWaiter:
			if r.err != nil {
				t.Fatal(r.err)
			}
			held = append(held, r.l)
		case <-time.After(10 * time.Second):
			if len(held) == 0 {
				t.Fatal("the waiter with the total not admitted within 10 s, nothing held")
			}
		}
	})
	t.Run("fair/Release", func(t *testing.T) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		o := fair.Options{LeaseTTL: 10 * time.Second, FallbackInterval: 300 * time.Millisecond}
		a := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 1, o)
		nt := newTotalFamily(t, "fair", redistest.Client(t), name, 1, 0, o)
		// Before the family counts a total: the client without one holds
		// member a and queues a waiter there.
		l, err := get(t, nt, "a").TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiter := background(ctx, get(t, nt, "a"))
		waitUntil(ctx, t, "the waiter queued in member a", func() bool {
			st, err := get(t, nt, "a").Status(ctx)
			return err == nil && len(st.Waiters) == 1
		})
		if err := a.SetTotal(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		other, err := get(t, a, "b").TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Release(ctx)
		// The waiter must not hold a lease beside other (total 1): it ends
		// refused at its next look, and leaves the queue.
		select {
		case r := <-waiter:
			if r.err == nil {
				_ = r.l.Release(ctx)
				t.Fatal("the waiter of a client without a total was granted a lease under a total of 1, full")
			}
			if !errors.Is(r.err, redsem.ErrLimitMismatch) {
				t.Fatalf("the waiter: %v, want ErrLimitMismatch", r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter of a client without a total still waits 10 s after the family counted a total")
		}
		st, err := get(t, a, "a").Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Waiters) != 0 || len(st.Holders) != 0 {
			t.Fatalf("member a holds %d and queues %d, want none", len(st.Holders), len(st.Waiters))
		}
	})
}
