package redsem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Issue 19, found 5: the engine's own bugs, one test each (the scripts'
// are in lua/records_test.go). Each failed on 521bc1f as its comment
// quotes; docs/testing.md lists them.

// A call whose context has already ended sends nothing: no acquire, and no
// undo of an acquire that was never sent (which would add write load
// exactly when an overloaded Redis makes callers give up). Before: each
// such call sent an undo (release.lua) in the background.
func TestEndedContextSendsNothing(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		c := redistest.Client(t)
		rec := &spans{}
		c.AddHook(rec)
		ctx := redistest.Ctx(t, 10*time.Second)
		s := mustNew(t, v, c, redistest.Name(t), 2, opts{})
		l, err := s.TryAcquire(ctx) // the engine's first call: clock, scripts, policy check
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		settled(ctx, t, s)
		time.Sleep(50 * time.Millisecond) // the policy check beside the first call
		rec.take()
		ended, cancel := context.WithCancel(ctx)
		cancel()
		for _, call := range []func() error{
			func() error { _, err := s.Acquire(ended); return err },
			func() error { _, err := s.TryAcquire(ended); return err },
			func() error { _, err := s.AcquireN(ended, 2); return err },
		} {
			if err := call(); err == nil {
				t.Fatal("a call with an ended context succeeded")
			}
		}
		time.Sleep(200 * time.Millisecond) // an undo runs in the background
		if got := rec.take(); len(got) != 0 {
			var names []string
			for _, sp := range got {
				names = append(names, sp.name)
			}
			t.Fatalf("calls with an ended context sent %v; want nothing", names)
		}
	})
}

// A family member whose Release failed (Redis unreachable) is dropped from
// memory once idle, like any other: its lease, no longer renewed, ends at
// its deadline, and the member goes IdleAfter later. Before: the failed
// Release never marked the member idle, so it stayed in the family's map
// for ever.
func TestFailedReleaseLeavesNoMember(t *testing.T) {
	srv := redistest.Start(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	f, err := fair.NewFamily(srv.Client(t), redistest.Name(t), 1, fair.FamilyOptions{
		Options: fair.Options{LeaseTTL: 500 * time.Millisecond}, IdleAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := f.Get("tenant")
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = l.Release(rctx)
	cancel()
	if err == nil {
		t.Fatal("Release succeeded with Redis down")
	}
	redistest.WaitFor(t, 5*time.Second, "the member dropped once idle", func() (bool, error) {
		return f.Len() == 0, nil
	})
}

// An Observer that calls Close from an event does not deadlock: an
// operator removes a fair waiter from the queue (redsem release NAME ID:
// release.lua in force mode, an "r id" message to the waiter's process),
// and the Observer closes the semaphore on the EventWaiterEvicted that
// reports it. Before: the hub emitted that event on its own goroutine and
// Close waited for the hub: the Observer, Close and the Acquire hung for
// good.
func TestObserverMayClose(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	name := redistest.Name(t)
	var sem redsem.Semaphore
	var once sync.Once
	closed := make(chan error, 1)
	s, err := fair.New(redistest.Client(t), name, 1, fair.Options{Observer: func(ev redsem.Event) {
		if ev.Kind == redsem.EventWaiterEvicted {
			once.Do(func() { closed <- sem.Close() })
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	sem = s
	c := redistest.Client(t)
	other, err := fair.New(c, name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	holder, err := other.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	got := make(chan error, 1)
	go func() {
		l, err := s.Acquire(ctx)
		if l != nil {
			_ = l.Release(ctx)
		}
		got <- err
	}()
	var waiter string
	redistest.WaitFor(t, 5*time.Second, "the waiter queued", func() (bool, error) {
		st, err := other.Status(ctx)
		if len(st.Waiters) == 1 {
			waiter = st.Waiters[0].ID
		}
		return waiter != "", err
	})
	k := core.KeysFor("redsem", name)
	if err := core.Script(lua.Release).Run(ctx, c, k.List, k.Chan, "PUBLISH", 1, waiter, "force").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close called from an Observer's event did not return: deadlock")
	}
	select {
	case err := <-got:
		if !errors.Is(err, redsem.ErrClosed) {
			t.Fatalf("the waiter after Close: %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter's Acquire did not return after Close")
	}
}

// A heartbeat that runs early (a holder is due to expire, so that the beat
// admits the next waiter) and fails is not run again at once: while Redis
// refuses, a process sends a few requests a second, not a spinning stream.
// Before: a failed early beat kept its due time, so the hub ran it back to
// back (with go-redis retries off: a core busy on refused dials).
func TestFailedEarlyBeatDoesNotSpin(t *testing.T) {
	srv := redistest.Start(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	opt := srv.Options()
	opt.MaxRetries = -1 // every failed command comes back at once
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	rec := &spans{}
	c.AddHook(rec)
	name := redistest.Name(t)
	s, err := fair.New(c, name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	other, err := fair.New(srv.Client(t), name, 1, fair.Options{LeaseTTL: 400 * time.Millisecond, DisableAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	if _, err := other.TryAcquire(ctx); err != nil { // expires in 400 ms: the waiter's process beats early then
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = s.Acquire(wctx) }()
	redistest.WaitFor(t, 5*time.Second, "the waiter queued", func() (bool, error) {
		st, err := other.Status(ctx)
		return len(st.Waiters) == 1, err
	})
	// Before the holder's deadline, Redis starts refusing every write (out
	// of memory): the early beat fails at once.
	admin := srv.Client(t)
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(context.Background(), "maxmemory", "0")
	rec.take()
	time.Sleep(time.Second)
	n := len(rec.take())
	t.Logf("%d commands in the second after Redis began refusing", n)
	if n > 100 {
		t.Fatalf("%d commands in one second while Redis refused: the failed early beat spins", n)
	}
}
