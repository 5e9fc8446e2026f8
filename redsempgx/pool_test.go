package redsempgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsempgx"
	"github.com/redsem/redsem/unfair"
)

func newFair(t testing.TB, name string, limit int) *fair.Semaphore {
	t.Helper()
	s, err := fair.New(redistest.Client(t), name, limit, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestLimitAcrossPools: two pools (two processes: each its own Redis
// client and semaphore) of up to 10 connections share a limit of 3, fair
// and unfair, while 20 goroutines run queries: every query runs, and
// neither the sockets dialled nor pg_stat_activity exceed 3 at once.
func TestLimitAcrossPools(t *testing.T) {
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			const limit, workers, queries = 3, 20, 15
			e := newEnv(t)
			name := redistest.Name(t)
			var pools []*redsempgx.Pool
			for i := 0; i < 2; i++ {
				if variant == "fair" {
					pools = append(pools, e.pool(newFair(t, name, limit), 10, redsempgx.Options{}, nil))
					continue
				}
				sem, err := unfair.New(redistest.Client(t), name, limit, unfair.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sem.Close() })
				pools = append(pools, e.pool(sem, 10, redsempgx.Options{}, nil))
			}
			stop := e.watch()
			var wg sync.WaitGroup
			var failed atomic.Int64
			for w := 0; w < workers; w++ {
				p := pools[w%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					for q := 0; q < queries; q++ {
						ctx, cancel := context.WithTimeout(context.Background(), pooltest.QueryTimeout)
						_, err := p.Exec(ctx, "SELECT pg_sleep(0.002)")
						cancel()
						if err != nil {
							failed.Add(1)
							t.Errorf("a query failed: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			pooltest.CheckMost(t, limit, e.sockets.max.Load(), stop())
			if e.sockets.max.Load() < 1 {
				t.Error("no socket was counted")
			}
		})
	}
}

// TestRotation is issue 33's starved process through pgxpool
// (pooltest.Rotation): A runs a long burst with MaxConns 3 over a limit of
// 3, so its connections are never idle; B must get its first query while
// A's burst still runs. PostgreSQL never sees more than the limit.
func TestRotation(t *testing.T) {
	const limit = 3
	e := newEnv(t)
	name := redistest.Name(t)
	semA := newFair(t, name, limit)
	a := e.pool(semA, limit, redsempgx.Options{}, nil)
	b := e.pool(newFair(t, name, limit), limit, redsempgx.Options{}, nil)
	stop := e.watch()
	query := func(p *redsempgx.Pool, q string) func(context.Context) error {
		return func(ctx context.Context) error { _, err := p.Exec(ctx, q); return err }
	}
	pooltest.Rotation(t, query(a, "SELECT pg_sleep(0.02)"), query(b, "SELECT 1"), func(ctx context.Context) (bool, error) {
		st, err := semA.Status(ctx)
		if err != nil {
			return false, err
		}
		s := a.Stat()
		return len(st.Holders) == limit && s.AcquiredConns() == limit && s.EmptyAcquireCount() > 0, nil
	})
	pooltest.CheckMost(t, limit, e.sockets.max.Load(), stop())
}

// TestOneNoticeOneGiveBack: two processes each hold one of the two slots
// with an idle connection; a third, with no connection of its own, waits
// for a slot and so publishes demand notices. Each notice is answered by
// one give-back at most (pooltest.OneNoticeOneGiveBack), and a pool whose
// idle connection was given back runs its next query on a new one.
func TestOneNoticeOneGiveBack(t *testing.T) {
	const limit = 2
	e := newEnv(t)
	name := redistest.Name(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	var socks [3]sockets
	var pools [3]*redsempgx.Pool
	var sems [3]*fair.Semaphore
	for i := range pools {
		sems[i] = newFair(t, name, limit)
		pools[i] = e.pool(sems[i], 1, redsempgx.Options{}, &socks[i])
	}
	for _, p := range pools[1:] {
		if _, err := p.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 3; i++ {
		// Release hands the connection back through AfterRelease in a
		// goroutine of pgxpool's: wait until it is idle.
		deadline := time.Now().Add(10 * time.Second)
		for pools[i].Stat().IdleConns() != 1 || socks[i].open.Load() != 1 {
			if time.Now().After(deadline) {
				s := pools[i].Stat()
				t.Fatalf("pool %d: %d idle, %d acquired, %d in all, %d sockets open; the case needs one idle connection each in pools 1 and 2",
					i, s.IdleConns(), s.AcquiredConns(), s.TotalConns(), socks[i].open.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	st, err := sems[0].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != limit {
		t.Fatalf("Redis shows %d holders; the case needs pools 1 and 2 to hold all %d slots", len(st.Holders), limit)
	}
	pooltest.OneNoticeOneGiveBack(t, name, func(ctx context.Context) error {
		_, err := pools[0].Exec(ctx, "SELECT 1")
		return err
	}, func() int64 { return 2 - socks[1].open.Load() - socks[2].open.Load() })
	// Each pool still runs queries (a given-back connection is destroyed
	// and replaced, under a new slot).
	for i, p := range pools {
		qctx, cancel := context.WithTimeout(ctx, pooltest.QueryTimeout)
		_, err := p.Exec(qctx, "SELECT 1")
		cancel()
		if err != nil {
			t.Errorf("pool %d after the give-back: %v", i, err)
		}
	}
}

// TestConnectBounded: a dial waits for a slot at most
// Options.ConnectTimeout, whatever its context, and says why it failed.
func TestConnectBounded(t *testing.T) {
	e := newEnv(t)
	ctx := redistest.Ctx(t, time.Minute)
	sem := newFair(t, redistest.Name(t), 1)
	l, err := sem.Acquire(ctx) // the only slot, held elsewhere
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	const bound = 300 * time.Millisecond
	p := e.pool(sem, 2, redsempgx.Options{ConnectTimeout: bound}, nil)
	start := time.Now()
	c, err := p.Acquire(context.Background())
	took := time.Since(start)
	if err == nil {
		c.Release()
		t.Fatal("Acquire got a connection while the only slot was held")
	}
	t.Logf("Acquire with a context that never ends returned after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, redsempgx.ErrConnectTimeout) || !strings.Contains(err.Error(), "redsempgx: ") {
		t.Fatalf("Acquire: %v, want a redsempgx error wrapping ErrConnectTimeout", err)
	}
	if took < bound {
		t.Fatalf("Acquire gave up after %v, before the bound of %v", took, bound)
	}
	if n, err := backends(ctx, e.mon, e.app); err != nil || n != 0 {
		t.Fatalf("%d connections (%v) opened without a slot", n, err)
	}
}

// TestMinConnsGiveBack: the connections that pgxpool opens in the
// background for MinConns hold every slot without ever being acquired;
// another process's query still gets one (they count as idle).
func TestMinConnsGiveBack(t *testing.T) {
	const limit = 2
	e := newEnv(t)
	name := redistest.Name(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	semA := newFair(t, name, limit)
	cfg, err := pgxpool.ParseConfig(pgURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = e.app
	cfg.MaxConns, cfg.MinConns = limit, limit
	a, err := redsempgx.NewPool(ctx, cfg, semA, redsempgx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	redistest.WaitFor(t, 20*time.Second, "pool A's MinConns connections holding every slot", func() (bool, error) {
		st, err := semA.Status(ctx)
		if err != nil {
			return false, err
		}
		return len(st.Holders) == limit && a.Stat().IdleConns() == limit, nil
	})
	b := e.pool(newFair(t, name, limit), limit, redsempgx.Options{ConnectTimeout: 5 * time.Second}, nil)
	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, pooltest.QueryTimeout)
	_, err = b.Exec(qctx, "SELECT 1")
	cancel()
	t.Logf("B's query after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err != nil {
		t.Fatalf("B's query while A's unused MinConns connections held every slot: %v", err)
	}
}

// TestLostLeases: when every lease is lost, the pool's idle connections
// close at once (their sockets; the pool destroys them when next
// acquired), the pool dials new ones under new leases, and queries keep
// working.
func TestLostLeases(t *testing.T) {
	const limit = 2
	e := newEnv(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	// Renewed every 200 ms: a deleted lease is found lost within that.
	us, err := unfair.New(redistest.Client(t), name, limit, unfair.Options{LeaseTTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = us.Close() })
	sem := &pooltest.Recording{Semaphore: us}
	p := e.pool(sem, limit, redsempgx.Options{}, nil)
	var held []*pgxpool.Conn
	for i := 0; i < limit; i++ {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	old := sem.Granted()
	if len(old) != limit {
		t.Fatalf("%d leases for %d connections", len(old), limit)
	}
	pooltest.LoseAll(t, ctx, name, old)
	// The idle connections close as soon as their leases are found lost,
	// not at their next use (issue 44: PostgreSQL saw more backends than
	// the limit meanwhile).
	redistest.WaitFor(t, 5*time.Second, "the idle connections whose leases were lost closed, without a query", func() (bool, error) {
		n, err := backends(ctx, e.mon, e.app)
		return e.sockets.open.Load() == 0 && n == 0, err
	})
	for i := 0; i < 5; i++ {
		var one int
		if err := p.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("query %d after the loss: %d, %v", i, one, err)
		}
	}
	// The pool releases in a goroutine (AfterRelease): wait for it to
	// settle, then every open connection holds a fresh, live lease.
	redistest.WaitFor(t, 10*time.Second, "the pool's connections all idle", func() (bool, error) {
		s := p.Stat()
		return s.AcquiredConns() == 0 && s.IdleConns() == s.TotalConns(), nil
	})
	pooltest.CheckFresh(t, ctx, sem, len(old), int(p.Stat().TotalConns()), e.sockets.open.Load())
}

// TestDialFails: a dial that fails releases its slot at once.
func TestDialFails(t *testing.T) {
	e := newEnv(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	sem := newFair(t, redistest.Name(t), 1)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable&connect_timeout=2", port)) // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = e.sockets.dial
	p, err := redsempgx.NewPool(ctx, cfg, sem, redsempgx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Ping(ctx); err == nil {
		t.Fatal("ping through a closed port succeeded")
	}
	st, err := sem.Status(ctx)
	if err != nil || len(st.Holders) != 0 {
		t.Fatalf("%d holders (%v) after a failed dial, want 0", len(st.Holders), err)
	}
}
