// Package stale stages states in which news reaches a process late, for
// tests that check what a caller is told then.
package stale

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// RateRemoved brings s, a semaphore whose rate in force has a smaller
// limit than its own and on whose client c the Delayer d is installed
// (holding nothing by itself), to this state: SetRate removed the rate
// while a freed-slot notice of its full window, published by a release
// that ran before SetRate, is still held on the subscription's connection
// (it arrives within redistest.MaxDelay); and every slot is taken. A
// caller that waits now is held back by the slots alone.
//
// wait is a caller that the window holds back (a slot is free) until its
// context ends or it is granted (then it lets its slot go before it
// returns): the waiter that makes a release publish the notice. The
// leases RateRemoved holds are released when the test ends.
func RateRemoved(t testing.TB, ctx context.Context, s redsem.Semaphore, c *redis.Client, d *redistest.Delayer, wait func(ctx context.Context)) {
	t.Helper()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rate.IsZero() || st.Rate.Limit >= st.Limit {
		t.Fatalf("stale.RateRemoved: rate %v with limit %d: want a rate whose limit is below the semaphore's", st.Rate, st.Limit)
	}
	var held []redsem.Lease
	t.Cleanup(func() {
		for _, l := range held {
			_ = l.Release(context.Background())
		}
	})
	for range st.Rate.Limit - st.RateGranted {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if len(held) == 0 {
		t.Fatal("stale.RateRemoved: the window is full already: no lease to release")
	}
	wctx, stop := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() { wait(wctx); close(waited) }()
	AwaitWaiter(t, ctx, s, c)
	d.HoldPubSub(redistest.MaxDelay)
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held = held[1:]
	if err := s.SetRate(ctx, redsem.Rate{}); err != nil {
		t.Fatal(err)
	}
	stop()
	<-waited
	for {
		l, err := s.TryAcquire(ctx)
		if errors.Is(err, redsem.ErrNoSlot) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
}

// AwaitWaiter waits (at most 5 s) until a caller waits on s, whose keys
// client c reads: unfair, it asked for freed-slot notices; fair, it queued.
func AwaitWaiter(t testing.TB, ctx context.Context, s redsem.Semaphore, c *redis.Client) {
	t.Helper()
	meta := core.EngineOf(s).Keys().List[core.KeyMeta]
	redistest.WaitFor(t, 5*time.Second, "a caller to wait", func() (bool, error) {
		if asked, err := c.HExists(ctx, meta, "_want").Result(); err != nil || asked {
			return asked, err
		}
		st, err := s.Status(ctx)
		return err == nil && len(st.Waiters) > 0, err
	})
}
