package redsemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemsql"
	"github.com/redsem/redsem/unfair"
)

func newUnfair(t *testing.T, client redis.UniversalClient, name string, limit int, opts unfair.Options) *unfair.Semaphore {
	t.Helper()
	s, err := unfair.New(client, name, limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestLimitAcrossPools: two pools of up to 10 connections each, sharing a
// semaphore of limit 3 through two Redis clients (as two processes would),
// never have more than 3 connections open, counted by the driver and by
// PostgreSQL itself, while 20 goroutines run queries.
func TestLimitAcrossPools(t *testing.T) {
	const limit, workers, queries = 3, 20, 15
	monitor := pgDB(t)
	// The unfair semaphore promises no order between the two pools: under
	// load one pool's Connect has waited over 10 s while the other's
	// connections rotated; the context, not a connect timeout, bounds it.
	ctx := redistest.Ctx(t, 90*time.Second)
	cfg, app := appConfig(t)
	conns := &counting{base: stdlib.GetConnector(*cfg), monitor: monitor}
	name := redistest.Name(t)
	var dbs []*sql.DB
	for i := 0; i < 2; i++ {
		sem := newUnfair(t, redistest.Client(t), name, limit, unfair.Options{})
		db := sql.OpenDB(redsemsql.NewConnector(conns, sem))
		db.SetMaxOpenConns(10)
		db.SetMaxIdleConns(1) // so neither pool keeps every slot idle
		t.Cleanup(func() { _ = db.Close() })
		dbs = append(dbs, db)
	}

	// The monitor samples pg_stat_activity until the workers are done.
	stop := watchBackends(t, app)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		db := dbs[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := 0; q < queries; q++ {
				if _, err := db.ExecContext(ctx, "SELECT pg_sleep(0.002)"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	pgMax := stop()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("most connections open at once: %d by the driver, %d in pg_stat_activity",
		conns.max.Load(), pgMax)
	if m := conns.max.Load(); m != limit {
		t.Fatalf("at most %d connections were open at once; want exactly the limit, %d", m, limit)
	}
	if m := pgMax; m > limit || m < 1 {
		t.Fatalf("PostgreSQL saw up to %d connections; want 1..%d", m, limit)
	}
}

// TestLostLeases: when every lease is lost, idle connections close at once
// (and answer driver.ErrBadConn when database/sql next takes them), a
// pinned connection answers driver.ErrBadConn, database/sql opens new
// connections under new leases, and queries keep working.
func TestLostLeases(t *testing.T) {
	monitor := pgDB(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	cfg, app := appConfig(t)
	name := redistest.Name(t)
	// Renewed every 200ms: a deleted lease is found lost within that.
	sem := &pooltest.Recording{Semaphore: newUnfair(t, redistest.Client(t), name, 3, unfair.Options{LeaseTTL: 600 * time.Millisecond})}
	conns := &counting{base: stdlib.GetConnector(*cfg), monitor: monitor}
	db := sql.OpenDB(redsemsql.NewConnector(conns, sem))
	db.SetMaxOpenConns(3)
	db.SetMaxIdleConns(3)
	t.Cleanup(func() { _ = db.Close() })

	var pinned []*sql.Conn
	for i := 0; i < 3; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		pinned = append(pinned, c)
	}
	// Two go back to the pool, idle; the third stays in use.
	for _, c := range pinned[:2] {
		_ = c.Close()
	}
	inUse := pinned[2]
	old := sem.Granted()
	if len(old) != 3 {
		t.Fatalf("%d leases for 3 connections", len(old))
	}

	pooltest.LoseAll(t, ctx, name, old)

	// The idle ones close as soon as their leases are found lost, not at
	// their next use (issue 44: PostgreSQL saw more backends than the
	// limit meanwhile); the one in use stays open until its next call.
	redistest.WaitFor(t, 5*time.Second, "the idle connections whose leases were lost closed, without a query", func() (bool, error) {
		n, err := countBackends(ctx, monitor, app)
		return conns.open.Load() == 1 && n == 1, err
	})

	// The connection in use fails without sending anything.
	if _, err := inUse.ExecContext(ctx, "SELECT 1"); !errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("query on a connection whose lease is lost: %v, want driver.ErrBadConn", err)
	}
	_ = inUse.Close()

	// The pool discards its bad connections and opens new ones.
	for i := 0; i < 5; i++ {
		var one int
		if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("query %d after the loss: %d, %v", i, one, err)
		}
	}
	open := db.Stats().OpenConnections
	pooltest.CheckFresh(t, ctx, sem, len(old), open, conns.open.Load())
	if n, err := countBackends(ctx, monitor, app); err != nil || n != open {
		t.Fatalf("PostgreSQL sees %d connections (%v), the pool %d", n, err, open)
	}
}

// TestConnectWaits: Connect waits for a slot within its context and leaves
// nothing behind when it gives up or when the base Connect fails.
func TestConnectWaits(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	sem := newUnfair(t, redistest.Client(t), redistest.Name(t), 1, unfair.Options{})

	t.Run("base connect fails", func(t *testing.T) {
		port, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1/test?sslmode=disable&connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Port = uint16(port) // nothing listens there
		var calls atomic.Int64
		db := sql.OpenDB(redsemsql.NewConnector(stdlib.GetConnector(*cfg, stdlib.OptionBeforeConnect(
			func(context.Context, *pgx.ConnConfig) error { calls.Add(1); return nil })), sem))
		t.Cleanup(func() { _ = db.Close() })
		if err := db.PingContext(ctx); err == nil {
			t.Fatal("ping through a closed port succeeded")
		}
		if calls.Load() == 0 {
			t.Fatal("the base connector was not called")
		}
		st, err := sem.Status(ctx)
		if err != nil || len(st.Holders) != 0 {
			t.Fatalf("%d holders (%v) after failed connects, want 0", len(st.Holders), err)
		}
	})

	t.Run("context ends while waiting", func(t *testing.T) {
		monitor := pgDB(t)
		cfg, app := appConfig(t)
		db := sql.OpenDB(redsemsql.NewConnector(stdlib.GetConnector(*cfg), sem))
		t.Cleanup(func() { _ = db.Close() })
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err = db.PingContext(waitCtx)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "redsemsql: ") {
			t.Fatalf("ping with every slot held: %v, want a redsemsql error matching DeadlineExceeded", err)
		}
		if n, err := countBackends(ctx, monitor, app); err != nil || n != 0 {
			t.Fatalf("%d connections (%v) opened without a slot", n, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil { // closes the connection: the slot comes back
			t.Fatal(err)
		}
		st, err := sem.Status(ctx)
		if err != nil || len(st.Holders) != 0 {
			t.Fatalf("%d holders (%v) after db.Close, want 0", len(st.Holders), err)
		}
	})
	t.Run("Driver().Open holds a lease", func(t *testing.T) {
		pgDB(t)
		cfg, _ := appConfig(t)
		db := sql.OpenDB(redsemsql.NewConnector(stdlib.GetConnector(*cfg), sem))
		t.Cleanup(func() { _ = db.Close() })
		c, err := db.Driver().Open(pgURL())
		if err != nil {
			t.Fatal(err)
		}
		st, err := sem.Status(ctx)
		if err != nil || len(st.Holders) != 1 {
			t.Fatalf("%d holders (%v) with a connection open, want 1", len(st.Holders), err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		st, err = sem.Status(ctx)
		if err != nil || len(st.Holders) != 0 {
			t.Fatalf("%d holders (%v) after Close, want 0", len(st.Holders), err)
		}
	})
}
