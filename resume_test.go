package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// resumeOpts are the options of the semaphores of the Resume tests.
type resumeOpts struct {
	LeaseTTL, QueueTTL, MaxHold time.Duration
	DisableAutoRenew            bool
	Observer                    redsem.Observer
	Logger                      *slog.Logger
}

// newResumeSem returns a semaphore of variant v on c, closed when the test
// ends.
func newResumeSem(t *testing.T, v variant, c redis.UniversalClient, name string, limit int, o resumeOpts) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	if v.name == "fair" {
		s, err = fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, QueueTTL: o.QueueTTL, MaxHold: o.MaxHold,
			DisableAutoRenew: o.DisableAutoRenew, Observer: o.Observer, Logger: o.Logger})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, MaxHold: o.MaxHold,
			DisableAutoRenew: o.DisableAutoRenew, Observer: o.Observer, Logger: o.Logger})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// eventLog keeps the events of one semaphore.
type eventLog struct {
	mu  sync.Mutex
	evs []redsem.Event
}

func (l *eventLog) observe(ev redsem.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

// count returns how many events of kind concern lease id.
func (l *eventLog) count(kind redsem.EventKind, id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.evs {
		if ev.Kind == kind && ev.LeaseID == id {
			n++
		}
	}
	return n
}

// A lease acquired by one engine (its own client, as another process
// would have) and resumed and released by a second frees its slot at once:
// a waiter of a third engine is admitted long before the first engine's
// lease could have lapsed (it renews it, and its deadline is seconds
// away). The first engine stops renewing at its next renewal, quietly: its
// lease ends as released, with one EventReleased, no EventLeaseLost, and
// nothing logged at Warn.
func TestResumeReleaseElsewhereFreesSlot(t *testing.T) {
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		const ttl = 3 * time.Second // renewed every second
		evA := &eventLog{}
		logA := &recorder{}
		a := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttl, Observer: evA.observe, Logger: slog.New(logA)})
		evB := &eventLog{}
		b := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttl, Observer: evB.observe})
		c := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttl})

		la, err := a.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := handOver(t, ctx, v, b, c, la.ID(), la.Token(), la.Slots())
		if n := evB.count(redsem.EventResumed, la.ID()); n != 1 {
			t.Errorf("%d EventResumed in the resuming engine, want 1", n)
		}
		// a learns at its next renewal (every ttl/3), before its deadline.
		select {
		case <-la.Done():
		case <-time.After(2 * ttl):
			t.Fatalf("the original lease still open %v after its release elsewhere", 2*ttl)
		}
		if err := la.Err(); err != nil {
			t.Errorf("original lease Err %v after a release elsewhere, want nil", err)
		}
		if cause := context.Cause(la.Context()); !errors.Is(cause, context.Canceled) {
			t.Errorf("original lease's context cause %v, want context.Canceled", cause)
		}
		if err := la.Release(ctx); err != nil {
			t.Errorf("Release of the original handle after the release elsewhere: %v, want nil", err)
		}
		if err := la.Renew(ctx); !errors.Is(err, redsem.ErrReleased) {
			t.Errorf("Renew of the original handle: %v, want ErrReleased", err)
		}
		// Two more renewal periods: nothing more is reported.
		time.Sleep(2 * ttl / 3)
		if n := evA.count(redsem.EventReleased, la.ID()); n != 1 {
			t.Errorf("%d EventReleased for the original lease, want 1", n)
		}
		if n := evA.count(redsem.EventLeaseLost, la.ID()); n != 0 {
			t.Errorf("%d EventLeaseLost for the original lease, want 0", n)
		}
		for _, m := range strings.Split(logA.all(), "; ") {
			if strings.HasPrefix(m, "WARN") || strings.HasPrefix(m, "ERROR") {
				t.Errorf("the original engine logged %q", m)
			}
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// handOver hands the lease id (granted with token and slots) to b: while c
// waits to acquire (fair: queued), b resumes it, checks that it is the
// grant's, and releases it; c must then be admitted before the deadline
// that Redis held for the lease (read after the Resume), with a later
// token: the release freed the slot, not the lease's expiry. It returns
// c's lease.
func handOver(t *testing.T, ctx context.Context, v variant, b, c redsem.Semaphore, id string, token int64, slots []int) redsem.Lease {
	t.Helper()
	type result struct {
		l   redsem.Lease
		err error
		at  time.Time
	}
	waiter := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx)
		waiter <- result{l, err, time.Now()}
	}()
	if v.name == "fair" {
		redistest.WaitFor(t, 10*time.Second, "the waiter to queue", func() (bool, error) {
			st, err := c.Status(ctx)
			return err == nil && len(st.Waiters) == 1, err
		})
	}
	lb, err := b.Resume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if lb.ID() != id || lb.Token() != token || !slices.Equal(lb.Slots(), slots) {
		t.Fatalf("resumed lease %s token %d slots %v, granted %s token %d slots %v", lb.ID(), lb.Token(), lb.Slots(), id, token, slots)
	}
	st, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].ID != id {
		t.Fatalf("holders %+v, want the resumed lease", st.Holders)
	}
	held := st.Holders[0].Deadline // the slot is held at least until then unless released
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.at.Before(held) {
		t.Errorf("waiter admitted at %v, not before the lease's deadline %v: the release did not free the slot", r.at, held)
	}
	if r.l.Token() <= token {
		t.Errorf("waiter's token %d not above the handed lease's %d", r.l.Token(), token)
	}
	return r.l
}

// Resume of an id with no live lease returns ErrLeaseLost (released,
// expired, never granted, a fair waiter's); an id that cannot be a lease's
// returns a *redsem.ConfigError. None of them writes anything: Resume of
// ids on a name never used leaves no key.
func TestResumeNoLease(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		rdb := redistest.Client(t)
		unused := newResumeSem(t, v, rdb, redistest.Name(t)+"-unused", 1, resumeOpts{})
		for _, id := range []string{"", "a b", "x{y}", "lease:1", "ü", strings.Repeat("a", 129)} {
			_, err := unused.Resume(ctx, id)
			var ce *redsem.ConfigError
			if !errors.As(err, &ce) || ce.Field != "id" || !errors.Is(err, redsem.ErrInvalidConfig) {
				t.Errorf("Resume(%q): %v, want a *ConfigError for field id", id, err)
			}
		}
		if _, err := unused.Resume(ctx, uuid.NewString()); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume of an unknown id: %v, want ErrLeaseLost", err)
		}
		if n, err := rdb.Keys(ctx, "*"+unused.Name()+"*").Result(); err != nil || len(n) != 0 {
			t.Errorf("keys after Resume calls on an unused name: %v (%v)", n, err)
		}

		name := redistest.Name(t)
		a := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: 200 * time.Millisecond, DisableAutoRenew: true})
		b := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: 5 * time.Second})
		if _, err := b.Resume(ctx, uuid.NewString()); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume of an unknown id: %v, want ErrLeaseLost", err)
		}
		l, err := a.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Resume(ctx, l.ID()); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume of a released lease: %v, want ErrLeaseLost", err)
		}
		l, err = a.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		<-l.Done() // not renewed: lost at its deadline, then given up in Redis
		// Done says "stop", not "gone from Redis": the give-up runs right
		// after it, in the background (until then another process could
		// still resume the lease, as a renewal of it).
		redistest.WaitFor(t, 5*time.Second, "the expired lease gone from Redis", func() (bool, error) {
			st, err := b.Status(ctx)
			return err == nil && len(st.Holders) == 0, err
		})
		if _, err := b.Resume(ctx, l.ID()); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume of an expired lease: %v, want ErrLeaseLost", err)
		}
		if v.name == "fair" {
			held, err := b.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = a.Acquire(ctx) }() // queues behind held
			var st redsem.Status
			redistest.WaitFor(t, 10*time.Second, "a waiter", func() (bool, error) {
				st, err = b.Status(ctx)
				return err == nil && len(st.Waiters) == 1, err
			})
			if _, err := b.Resume(ctx, st.Waiters[0].ID); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Errorf("Resume of a waiter's id: %v, want ErrLeaseLost", err)
			}
			if st2, err := b.Status(ctx); err != nil || len(st2.Waiters) != 1 || st2.Waiters[0].ID != st.Waiters[0].ID {
				t.Errorf("the waiter after Resume of its id: %+v (%v)", st2.Waiters, err)
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		_ = b.Close()
		if _, err := b.Resume(ctx, uuid.NewString()); !errors.Is(err, redsem.ErrClosed) {
			t.Errorf("Resume after Close: %v, want ErrClosed", err)
		}
	})
}

// Resume of a lease that the semaphore holds already returns that lease,
// renewed; a weighted lease comes back with all its slots; a resumed lease
// renews itself in the background and reports its own deadline.
func TestResumeSameLease(t *testing.T) {
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		const ttl = 600 * time.Millisecond
		a := newResumeSem(t, v, redistest.Client(t), name, 3, resumeOpts{LeaseTTL: 5 * time.Second})
		b := newResumeSem(t, v, redistest.Client(t), name, 3, resumeOpts{LeaseTTL: ttl})
		la, err := a.AcquireN(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		d0 := la.Deadline()
		again, err := a.Resume(ctx, la.ID())
		if err != nil {
			t.Fatal(err)
		}
		if again != la {
			t.Errorf("Resume by the semaphore that holds the lease returned another lease")
		}
		if !la.Deadline().After(d0) {
			t.Errorf("Resume did not renew the held lease: deadline %v -> %v", d0, la.Deadline())
		}
		before := time.Now()
		lb, err := b.Resume(ctx, la.ID())
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(lb.Slots()) != fmt.Sprint(la.Slots()) || lb.Slot() != la.Slot() {
			t.Errorf("resumed slots %v, granted %v", lb.Slots(), la.Slots())
		}
		// The lease's deadline in Redis stays a's (5 s): a renewal never
		// moves it earlier, so neither handle's Deadline is later than
		// Redis's (b's TTL is shorter than a's).
		st, err := b.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 1 {
			t.Fatalf("holders %+v", st.Holders)
		}
		for who, d := range map[string]time.Time{"first": la.Deadline(), "resumed": lb.Deadline()} {
			if d.After(st.Holders[0].Deadline) {
				t.Errorf("the %s handle's Deadline %v is later than Redis's %v", who, d, st.Holders[0].Deadline)
			}
		}
		if d := lb.Deadline(); d.Before(before) {
			t.Errorf("resumed Deadline %v before the call %v", d, before)
		}
		if lb2, err := b.Resume(ctx, la.ID()); err != nil || lb2 != lb {
			t.Errorf("second Resume by b: %v, %v; want the same lease", lb2, err)
		}
		// b renews it in the background, a too: both hold it.
		target := time.Now().Add(3 * ttl)
		redistest.WaitFor(t, 10*time.Second, "b to renew the lease", func() (bool, error) {
			select {
			case <-lb.Done():
				return false, fmt.Errorf("resumed lease ended: %v", lb.Err())
			default:
			}
			return time.Now().After(target), nil
		})
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lb.Done():
		case <-time.After(10 * ttl):
			t.Fatal("the resumed lease did not end after the release by its first holder")
		}
		if lb.Err() != nil {
			t.Errorf("resumed lease Err %v after its release elsewhere, want nil", lb.Err())
		}
		if _, err := b.Resume(ctx, la.ID()); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume after the release: %v, want ErrLeaseLost", err)
		}
	})
}

// A handle that stops renewing (DisableAutoRenew, MaxHold) gives the lease
// up at its deadline without ending it for a process that resumed it: the
// lease lives on, renewed by that process, and the first handle ends as
// lost at its own deadline (its holder must stop then). Before the "expire" mode of release.lua, the first handle's
// forced release at its deadline took the slot from the resumed lease.
func TestResumeOutlivesFirstHandle(t *testing.T) {
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	forEach(t, func(t *testing.T, v variant) {
		for _, mode := range []string{"DisableAutoRenew", "MaxHold"} {
			t.Run(mode, func(t *testing.T) {
				ctx := redistest.Ctx(t, 20*time.Second)
				name := redistest.Name(t)
				// A TTL of 1 s gives the give-up at the deadline its
				// longest bound (100 ms): one that gets no answer within
				// it cannot tell whether the lease lives on, and reports
				// it lost.
				o := resumeOpts{LeaseTTL: time.Second}
				if mode == "MaxHold" {
					o.MaxHold = 200 * time.Millisecond
				} else {
					o.DisableAutoRenew = true
				}
				evA := &eventLog{}
				o.Observer = evA.observe
				a := newResumeSem(t, v, redistest.Client(t), name, 1, o)
				const ttlB = 600 * time.Millisecond
				b := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttlB})
				la, err := a.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				lb, err := b.Resume(ctx, la.ID())
				if err != nil {
					t.Fatal(err)
				}
				select {
				case <-la.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the first handle did not end after its deadline")
				}
				// Its holder's time is up at its Deadline: the handle ends
				// lost (Err with Done; the event right after, outside the
				// lease's lock), while the lease lives on for the process
				// that resumed it.
				redistest.WaitFor(t, time.Second, "EventLeaseLost", func() (bool, error) {
					return evA.count(redsem.EventLeaseLost, la.ID()) > 0, nil
				})
				if !errors.Is(la.Err(), redsem.ErrLeaseLost) || evA.count(redsem.EventLeaseLost, la.ID()) != 1 {
					t.Errorf("first handle: Err %v, %d EventLeaseLost; want ErrLeaseLost, once", la.Err(), evA.count(redsem.EventLeaseLost, la.ID()))
				}
				// Past b's TTL too: b keeps the lease, renewing it.
				time.Sleep(ttlB + 100*time.Millisecond)
				select {
				case <-lb.Done():
					t.Fatalf("the resumed lease ended with the first handle: %v", lb.Err())
				default:
				}
				st, err := b.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Holders) != 1 || st.Holders[0].ID != la.ID() {
					t.Fatalf("holders %+v, want the resumed lease", st.Holders)
				}
				if _, err := a.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatalf("TryAcquire while the resumed lease is held: %v, want ErrNoSlot", err)
				}
				if err := lb.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// lateSend holds back the next call of one script before it is sent (every
// call while every is set): the request reaches Redis d late (a slow
// network, a retry), while the caller counts the lease's deadline from when
// it asked.
type lateSend struct {
	lateReply
	every bool
}

func (h *lateSend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.matches(cmd) {
			d := h.d.Load()
			if !h.every {
				d = h.d.Swap(0)
			}
			if d > 0 {
				h.held.Add(1)
				time.Sleep(time.Duration(d))
			}
		}
		return next(ctx, cmd)
	}
}

// Two handles of one lease, and the first one's give-up at its deadline.
// P1's acquire reached Redis 400 ms late, so P1's Deadline() is 400 ms
// earlier than Redis's; P2 resumed the lease with a shorter LeaseTTL, which
// did not move Redis's deadline, and was told that deadline. P1's give-up at
// its own deadline must not free the slot while P2's handle reports it held:
// before issue 42 it did (release.lua's "expire" mode compared deadlines,
// and Redis's had not moved), and a third client was granted the slot with
// P2's deadline still ~400 ms ahead.
func TestResumeLateAcquireGiveUp(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		late := &lateSend{lateReply: lateReply{script: lua.Acquire}}
		c1 := redistest.Client(t)
		c1.AddHook(late)
		p1 := newResumeSem(t, v, c1, name, 1, resumeOpts{LeaseTTL: time.Second, DisableAutoRenew: true})
		p2 := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true})
		p3 := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: time.Second})
		late.arm(400 * time.Millisecond)
		l1, err := p1.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if late.held.Load() == 0 {
			t.Fatal("the acquire was not held back: the test tests nothing")
		}
		l2, err := p2.Resume(ctx, l1.ID())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("P1's Deadline() %v ahead, P2's %v ahead", time.Until(l1.Deadline()), time.Until(l2.Deadline()))
		if !l2.Deadline().After(l1.Deadline().Add(200 * time.Millisecond)) {
			t.Fatalf("P2's Deadline() %v is not well after P1's %v: the late acquire did not make the case", l2.Deadline(), l1.Deadline())
		}
		select {
		case <-l1.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("P1's handle did not end at its deadline")
		}
		// From P1's give-up until P2's deadline, P2 reports the lease held:
		// nobody else may be granted the slot.
		for {
			l3, err := p3.TryAcquire(ctx)
			now := time.Now()
			if err == nil {
				_ = l3.Release(ctx)
				if l2.Err() == nil && now.Before(l2.Deadline()) {
					t.Fatalf("a third client was granted the slot while P2's handle reports the lease held (its deadline %v ahead)", l2.Deadline().Sub(now))
				}
				break
			}
			if !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatal(err)
			}
			if !now.Before(l2.Deadline().Add(500 * time.Millisecond)) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}
