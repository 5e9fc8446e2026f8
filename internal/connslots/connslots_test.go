package connslots

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// newPools makes n pools (n processes: each its own Redis client and fair
// semaphore) sharing a semaphore of limit slots.
func newPools(t *testing.T, n, limit int) []*Pool {
	t.Helper()
	name := redistest.Name(t)
	var pools []*Pool
	for i := 0; i < n; i++ {
		sem, err := fair.New(redistest.Client(t), name, limit, fair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sem.Close() })
		p := New(sem, "test", 0, false)
		t.Cleanup(p.Close)
		pools = append(pools, p)
	}
	return pools
}

// open takes a slot in p for a connection whose close is counted.
func open(t *testing.T, ctx context.Context, p *Pool, closes *atomic.Int64) *Slot {
	t.Helper()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Attach(func() error { closes.Add(1); return nil })
	t.Cleanup(func() { s.Closed() })
	return s
}

// TestOwedGiveBack: a pool that claims a notice while its only connection
// is in use owes the waiter a slot, and pays it with that connection when
// it returns (Returned answers false once, then true again).
func TestOwedGiveBack(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	pools := newPools(t, 2, 1)
	var closes atomic.Int64
	a := open(t, ctx, pools[0], &closes) // in use
	redistest.WaitFor(t, 5*time.Second, "pool 0 subscribed to demand notices", func() (bool, error) {
		ch := pools[0].eng.Keys().Want
		n, err := redistest.Client(t).PubSubNumSub(ctx, ch).Result()
		return n[ch] >= 1, err
	})
	got := make(chan error, 1)
	go func() {
		s, err := pools[1].Acquire(ctx)
		if err == nil {
			s.Closed()
		}
		got <- err
	}()
	redistest.WaitFor(t, 10*time.Second, "pool 0 owing pool 1's waiter a slot", func() (bool, error) {
		pools[0].mu.Lock()
		defer pools[0].mu.Unlock()
		return len(pools[0].owed) > 0, nil
	})
	if a.Returned(true) {
		t.Fatal("a connection returned while its pool owed a waiter a slot was kept")
	}
	if n := closes.Load(); n != 0 {
		t.Fatalf("the in-use connection was closed %d times by the give-back; the pool closes it", n)
	}
	a.Closed() // what the pool does with it
	if err := <-got; err != nil {
		t.Fatalf("pool 1's waiter after pool 0 paid: %v", err)
	}
	b := open(t, ctx, pools[0], &closes)
	pools[0].mu.Lock()
	pools[0].owed = nil // the waiter was served; what it still owes expires
	pools[0].mu.Unlock()
	if !b.Returned(true) {
		t.Fatal("a connection returned with nothing owed was not kept")
	}
}

// TestConnectTimeout: Acquire with a context that never ends gives up
// after the pool's bound, with an error that says so; a context with a
// deadline is bound by that deadline only.
func TestConnectTimeout(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	sem, err := fair.New(redistest.Client(t), name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	l, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	p := New(sem, "test", 200*time.Millisecond, false)
	t.Cleanup(p.Close)
	start := time.Now()
	_, err = p.Acquire(context.Background())
	if !errors.Is(err, ErrConnectTimeout) || time.Since(start) < 200*time.Millisecond {
		t.Fatalf("Acquire after %v: %v, want ErrConnectTimeout after 200ms", time.Since(start), err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Acquire(cctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrConnectTimeout) {
		t.Fatalf("Acquire with a cancelled context: %v, want context.Canceled, not ErrConnectTimeout", err)
	}
	// A context with a deadline is the caller's bound: the connect
	// timeout does not cut it short.
	dctx, dcancel := context.WithTimeout(ctx, 600*time.Millisecond)
	defer dcancel()
	start = time.Now()
	_, err = p.Acquire(dctx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrConnectTimeout) || dctx.Err() == nil {
		t.Fatalf("Acquire with a 600ms deadline, after %v: %v, want its context's deadline, not ErrConnectTimeout (200ms)", time.Since(start), err)
	}
	// Unless the pool bounds every wait (redsempgx: pgx's dial deadline
	// is its own, not the caller's).
	always := New(sem, "test", 200*time.Millisecond, true)
	t.Cleanup(always.Close)
	dctx, dcancel = context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if _, err := always.Acquire(dctx); !errors.Is(err, ErrConnectTimeout) || dctx.Err() != nil {
		t.Fatalf("Acquire with a 5s deadline from a pool that bounds every wait: %v, want ErrConnectTimeout after 200ms", err)
	}
}
