package redsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// An idle semaphore is not live: once nothing is held or queued, the limit
// that earlier clients were built with binds nobody, so a client built with
// another limit is admitted (no ErrLimitMismatch) and its limit is the one
// in force. Only SetLimit outlives idle periods. While a lease of the
// earlier clients is held, the new limit is refused.
func TestIdleSemaphoreTakesNewLimit(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			o := prefixed{Prefix: uniquePrefix(), LeaseTTL: 10 * time.Second}
			s5 := newPrefixed(t, variant, redistest.Client(t), name, 5, o)
			s3 := newPrefixed(t, variant, redistest.Client(t), name, 3, o)

			l, err := s5.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Live: a lease of the limit-5 clients is held.
			if _, err := s3.TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
				t.Fatalf("limit-3 client while a limit-5 lease is held: got %v, want ErrLimitMismatch", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}

			if variant == "fair" {
				queueAndLeave(ctx, t, s5, 5)
			}
			// The cancelled waiter's undo runs in the background: until it
			// did, a release may have granted it the slot (undone then).
			waitUntil(ctx, t, "the semaphore idle", func() bool {
				st, err := s5.Status(ctx)
				return err == nil && len(st.Holders) == 0 && len(st.Waiters) == 0
			})

			// Idle: the limit-3 client is admitted and sets the limit.
			l3, err := s3.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("limit-3 client on an idle semaphore: got %v, want a lease", err)
			}
			defer func() { _ = l3.Release(ctx) }()
			st, err := s3.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Limit != 3 {
				t.Fatalf("Status().Limit = %d after the limit-3 client's grant, want 3", st.Limit)
			}
			// And now the limit-5 clients are the ones that disagree.
			if _, err := s5.TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
				t.Fatalf("limit-5 client while a limit-3 lease is held: got %v, want ErrLimitMismatch", err)
			}
		})
	}
}

// queueAndLeave fills all limit slots of s, queues a waiter, waits until
// Status shows it queued, cancels it, and releases the slots: a waiter that
// queued and left, and nothing held or queued afterwards.
func queueAndLeave(ctx context.Context, t *testing.T, s redsem.Semaphore, limit int) {
	t.Helper()
	var held []redsem.Lease
	for range limit {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		l, err := s.Acquire(wctx)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the waiter was granted a slot, though all were held")
		}
		done <- err
	}()
	waitUntil(ctx, t, "the waiter is queued", func() bool {
		st, err := s.Status(ctx)
		return err == nil && len(st.Waiters) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitUntil polls cond until it holds; it fails the test when ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting until %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}
