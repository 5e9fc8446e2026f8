package unfair_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

type result struct {
	l   redsem.Lease
	err error
}

func acquireN(ctx context.Context, s redsem.Semaphore, n int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.AcquireN(ctx, n)
		ch <- result{l, err}
	}()
	return ch
}

func gotLease(t *testing.T, ch <-chan result) redsem.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("acquire: %v", r.err)
		}
		return r.l
	case <-time.After(15 * time.Second):
		t.Fatal("acquire did not return")
	}
	return nil
}

// AcquireN takes n slots at once or none; the slots are distinct,
// ascending and below the limit; n outside [1, limit] is refused at once.
func TestWeighted(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	s := newSem(t, 5, unfair.Options{})
	for _, n := range []int{0, 6} {
		if _, err := s.AcquireN(ctx, n); !errors.Is(err, redsem.ErrWeight) {
			t.Fatalf("AcquireN(%d): %v, want ErrWeight", n, err)
		}
	}
	a, err := s.TryAcquireN(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if sl := a.Slots(); len(sl) != 4 || !slices.IsSorted(sl) || sl[0] != a.Slot() || sl[3] > 4 {
		t.Fatalf("slots %v", sl)
	}
	if _, err := s.TryAcquireN(ctx, 2); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("TryAcquireN(2) with 1 free: %v, want ErrNoSlot", err)
	}
	st, err := s.Status(ctx)
	if err != nil || len(st.Holders) != 1 || !slices.Equal(st.Holders[0].Slots, a.Slots()) {
		t.Fatalf("status %+v, %v", st, err)
	}
	_ = a.Release(ctx)
}

// A weighted waiter is woken when enough slots come free: by releases, by
// the expiry of a holder, and by SetLimit raising the limit.
func TestWeightedWaiterWoken(t *testing.T) {
	for _, how := range []string{"release", "expiry", "set-limit"} {
		t.Run(how, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			opts := unfair.Options{}
			if how == "expiry" {
				opts = unfair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true}
			}
			hs, err := unfair.New(redistest.Client(t), name, 3, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer hs.Close()
			ws, err := unfair.New(redistest.Client(t), name, 3, unfair.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			h1, err := hs.TryAcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			w := acquireN(ctx, ws, 3)
			select {
			case r := <-w:
				t.Fatalf("AcquireN(3) with 2 of 3 held returned %v, %v", r.l, r.err)
			case <-time.After(50 * time.Millisecond):
			}
			switch how {
			case "release":
				_ = h1.Release(ctx)
			case "set-limit":
				if err := ws.SetLimit(ctx, 5); err != nil {
					t.Fatal(err)
				}
			}
			l := gotLease(t, w)
			if len(l.Slots()) != 3 {
				t.Fatalf("slots %v", l.Slots())
			}
			_ = l.Release(ctx)
			_ = h1.Release(ctx)
		})
	}
}
