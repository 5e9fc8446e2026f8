package fair_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestFIFOOrder(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	s, err := fair.New(c, name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			_ = l.Release(ctx)
		}(i)
		// wait until waiter i is queued before starting the next
		for {
			st, err := s.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Waiters) == i+1 {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquire with a queue: %v", err)
	}
	_ = first.Release(ctx)
	wg.Wait()
	if len(order) != n {
		t.Fatalf("%d of %d waiters admitted", len(order), n)
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("admission order %v, want 0..%d", order, n-1)
		}
	}
	checkClean(t, ctx, c, name)
}

func TestFairCancel(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	s, err := fair.New(c, name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The undo runs detached from the ended context, right after Acquire
	// returned.
	waitFor(t, 5*time.Second, "the cancelled waiter to leave the queue", func() (bool, error) {
		st, err := s.Status(ctx)
		return err == nil && len(st.Waiters) == 0 && len(st.Holders) == 1, err
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, c, name)
}
