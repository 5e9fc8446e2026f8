package connslots

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// newPools makes n pools (n processes: each its own Redis client and fair
// semaphore) sharing a semaphore of limit slots.
func newPools(t *testing.T, n, limit int) []*Pool {
	return newPoolsOptions(t, n, limit, Options{})
}

// newPoolsOptions is newPools with the pools' options.
func newPoolsOptions(t *testing.T, n, limit int, opts Options) []*Pool {
	t.Helper()
	name := redistest.Name(t)
	var pools []*Pool
	for i := 0; i < n; i++ {
		sem, err := fair.New(redistest.Client(t), name, limit, fair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sem.Close() })
		p, err := New(sem, "test", opts)
		if err != nil {
			t.Fatal(err)
		}
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
		ch := pools[0].demand.Channel
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
	clear(pools[0].owed) // the waiter was served; what it still owes expires
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
	p, err := New(sem, "test", Options{ConnectTimeout: 200 * time.Millisecond, MinHold: -1})
	if err != nil {
		t.Fatal(err)
	}
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
	always, err := New(sem, "test", Options{ConnectTimeout: 200 * time.Millisecond, BoundAll: true, MinHold: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(always.Close)
	dctx, dcancel = context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if _, err := always.Acquire(dctx); !errors.Is(err, ErrConnectTimeout) || dctx.Err() != nil {
		t.Fatalf("Acquire with a 5s deadline from a pool that bounds every wait: %v, want ErrConnectTimeout after 200ms", err)
	}
}

// subscribed waits until p listens to demand notices.
func subscribed(t *testing.T, ctx context.Context, p *Pool) {
	t.Helper()
	redistest.WaitFor(t, 5*time.Second, "the pool subscribed to demand notices", func() (bool, error) {
		ch := p.demand.Channel
		n, err := redistest.Client(t).PubSubNumSub(ctx, ch).Result()
		return n[ch] >= 1, err
	})
}

// TestMinHold: a connection gives its slot back to another pool's waiter
// only once it has held it MinHold: an idle one then, at once; one in use
// that its pool owes a waiter is kept when it returns before then, and
// pays when it returns after.
func TestMinHold(t *testing.T) {
	const minHold = 300 * time.Millisecond
	ctx := redistest.Ctx(t, 20*time.Second)
	pools := newPoolsOptions(t, 2, 1, Options{MinHold: minHold})
	var closes atomic.Int64
	a := open(t, ctx, pools[0], &closes)
	if !a.Returned(true) { // idle from now on
		t.Fatal("a connection returned with nothing owed was not kept")
	}
	subscribed(t, ctx, pools[0])
	b, err := pools[1].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Closed()
	if held := time.Since(a.held); held < minHold {
		t.Fatalf("pool 0's idle connection gave its slot back after %v, before MinHold (%v)", held, minHold)
	}
	if !a.Gone() || closes.Load() != 1 {
		t.Fatalf("pool 1 got the only slot; pool 0's connection gone %v, closed %d times", a.Gone(), closes.Load())
	}

	// Pool 1 owes a waiter: its young connection is kept, an old one pays.
	pools[1].mu.Lock()
	pools[1].owed["waiter"] = time.Now().Add(time.Minute)
	pools[1].mu.Unlock()
	if time.Since(b.held) < minHold && !b.Returned(true) {
		t.Fatal("a connection younger than MinHold paid a give-back")
	}
	b.Use()
	time.Sleep(time.Until(b.held.Add(minHold)))
	if b.Returned(true) {
		t.Fatal("a connection older than MinHold, returning while its pool owed a waiter, was kept")
	}
}

// TestMinHoldNegative: with a negative MinHold an idle connection gives
// its slot back to another pool's waiter at once (as before MinHold).
func TestMinHoldNegative(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	pools := newPoolsOptions(t, 2, 1, Options{MinHold: -1})
	if pools[0].minHold != 0 {
		t.Fatalf("MinHold -1 gives a hold of %v, want 0", pools[0].minHold)
	}
	for _, c := range []struct{ timeout, want time.Duration }{
		{0, DefaultMinHold}, {-1, DefaultMinHold}, {time.Minute, DefaultMinHold}, {400 * time.Millisecond, 200 * time.Millisecond},
	} {
		p, err := New(pools[0].sem, "test", Options{ConnectTimeout: c.timeout})
		if err != nil {
			t.Errorf("ConnectTimeout %v, MinHold 0: %v", c.timeout, err)
			continue
		}
		if p.minHold != c.want {
			t.Errorf("ConnectTimeout %v, MinHold 0: hold %v, want %v", c.timeout, p.minHold, c.want)
		}
		p.Close()
	}
	var closes atomic.Int64
	a := open(t, ctx, pools[0], &closes)
	a.Returned(true)
	subscribed(t, ctx, pools[0])
	b, err := pools[1].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.Closed()
	if closes.Load() != 1 {
		t.Fatalf("pool 0's idle connection closed %d times, want once", closes.Load())
	}
}

// TestOptionsInvalid: a nil semaphore, and a MinHold that is not shorter
// than a bounded ConnectTimeout, are *redsem.ConfigErrors naming the field.
func TestOptionsInvalid(t *testing.T) {
	sem, err := fair.New(redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	for _, c := range []struct {
		sem   redsem.Semaphore
		opts  Options
		field string // "": valid
	}{
		{sem, Options{}, ""},
		{sem, Options{MinHold: -1}, ""},
		{sem, Options{MinHold: time.Hour, ConnectTimeout: -1}, ""},
		{sem, Options{MinHold: 9 * time.Second}, ""},
		{sem, Options{MinHold: 10 * time.Second}, "test.Options.MinHold"},
		{sem, Options{MinHold: time.Second, ConnectTimeout: time.Second}, "test.Options.MinHold"},
		{sem, Options{ConnectTimeout: 400 * time.Millisecond}, ""}, // the default, half of it
		{sem, Options{ConnectTimeout: 400 * time.Millisecond, MinHold: 400 * time.Millisecond}, "test.Options.MinHold"},
		{nil, Options{}, "sem"},
	} {
		p, err := New(c.sem, "test", c.opts)
		if c.field == "" {
			if err != nil {
				t.Errorf("%+v: %v, want valid", c.opts, err)
			} else {
				p.Close()
			}
			continue
		}
		if p != nil {
			t.Errorf("%+v: a pool beside the error %v", c.opts, err)
		}
		var ce *redsem.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, redsem.ErrInvalidConfig) || ce.Field != c.field {
			t.Errorf("%+v: %v, want a *redsem.ConfigError for %s", c.opts, err, c.field)
			continue
		}
		t.Logf("%+v: %v", c.opts, err)
	}
}
