package redsemsql_test

// Tests of promises that docs/promises.md listed as gaps for redsemsql, each
// through database/sql over a connector of NewConnector, on a real
// redis-server and PostgreSQL, for both variants.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemsql"
	"github.com/redsem/redsem/unfair"
)

var promiseVariants = []string{"fair", "unfair"}

// newVariant builds a semaphore of variant v ("fair" or "unfair") on
// client, closed when the test ends.
func newVariant(t *testing.T, v string, client redis.UniversalClient, name string, limit int, leaseTTL time.Duration) redsem.Semaphore {
	t.Helper()
	var (
		s   redsem.Semaphore
		err error
	)
	if v == "fair" {
		s, err = fair.New(client, name, limit, fair.Options{LeaseTTL: leaseTTL})
	} else {
		s, err = unfair.New(client, name, limit, unfair.Options{LeaseTTL: leaseTTL})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestPromiseTxOnLostLease: a transaction whose connection's lease is lost
// (the keys deleted, the loss found by a renewal) sees driver.ErrBadConn on
// its next statement (package doc); the lost connection is discarded and a
// new transaction runs under a new lease.
func TestPromiseTxOnLostLease(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			monitor := pgDB(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			cfg, app := appConfig(t)
			name := redistest.Name(t)
			// Renewed every 200 ms: a deleted lease is found lost within that.
			sem := &pooltest.Recording{Semaphore: newVariant(t, v, redistest.Client(t), name, 2, 600*time.Millisecond)}
			conns := &counting{base: stdlib.GetConnector(*cfg), monitor: monitor}
			db := sql.OpenDB(redsemsql.NewConnector(conns, sem))
			db.SetMaxOpenConns(2)
			t.Cleanup(func() { _ = db.Close() })

			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
				t.Fatalf("a statement of the transaction while its lease is held: %v", err)
			}
			old := sem.Granted()
			if len(old) != 1 {
				t.Fatalf("%d leases for the transaction's one connection", len(old))
			}
			pooltest.LoseAll(t, ctx, name, old)

			_, err = tx.ExecContext(ctx, "SELECT 1")
			if !errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("the transaction's next statement after its lease was lost: %v, want driver.ErrBadConn", err)
			}
			_ = tx.Rollback() // whatever it says: the transaction is over

			// A new transaction runs on a new connection under a new lease.
			tx2, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatalf("a new transaction after the loss: %v", err)
			}
			var one int
			if err := tx2.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("a statement of the new transaction: %d, %v", one, err)
			}
			if err := tx2.Commit(); err != nil {
				t.Fatal(err)
			}
			// The lost connection is gone (closed when the first transaction
			// returned it), the new one holds a fresh lease.
			redistest.WaitFor(t, 5*time.Second, "the lost connection closed", func() (bool, error) {
				n, err := countBackends(ctx, monitor, app)
				return conns.open.Load() == 1 && n == 1, err
			})
			pooltest.CheckFresh(t, ctx, sem, len(old), db.Stats().OpenConnections, conns.open.Load())
		})
	}
}

// closerConnector is a base connector that is an io.Closer and records
// its Close calls.
type closerConnector struct {
	driver.Connector
	closed atomic.Int64
	err    error // what Close returns
}

func (c *closerConnector) Close() error {
	c.closed.Add(1)
	return c.err
}

// TestPromiseCloseClosesBaseNotSemaphore: sql.DB.Close closes the base
// connector when it is an io.Closer (once, its error returned) and leaves
// the semaphore open: it grants afterwards, and the pool's lease was
// released (NewConnector doc).
func TestPromiseCloseClosesBaseNotSemaphore(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			pgDB(t)
			ctx := redistest.Ctx(t, 20*time.Second)
			cfg, _ := appConfig(t)
			sem := newVariant(t, v, redistest.Client(t), redistest.Name(t), 1, 0)
			baseErr := errors.New("the base connector's own Close error")
			base := &closerConnector{Connector: stdlib.GetConnector(*cfg), err: baseErr}
			db := sql.OpenDB(redsemsql.NewConnector(base, sem))
			if err := db.PingContext(ctx); err != nil { // a connection, holding the only slot
				t.Fatal(err)
			}
			if st, err := sem.Status(ctx); err != nil || len(st.Holders) != 1 {
				t.Fatalf("%d holders (%v) with the pool's connection open, want 1", len(st.Holders), err)
			}
			if err := db.Close(); !errors.Is(err, baseErr) {
				t.Errorf("db.Close: %v, want the base connector's Close error", err)
			}
			if n := base.closed.Load(); n != 1 {
				t.Errorf("the base connector's Close was called %d times, want once", n)
			}
			// The semaphore is open: the slot the pool held is free, and
			// it grants.
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire after db.Close: %v, want a lease (the semaphore stays open)", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// commandCalls returns the calls of every command the server has run, by
// command (INFO commandstats), leaving out INFO itself.
func commandCalls(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if n, ok := strings.CutPrefix(f, "calls="); ok {
				calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls, nil
}

// callsSince lists the commands run since before (by name, with counts).
func callsSince(before, after map[string]int64) []string {
	var out []string
	for name, n := range after {
		if d := n - before[name]; d != 0 {
			out = append(out, name+"="+strconv.FormatInt(d, 10))
		}
	}
	sort.Strings(out)
	return out
}

// TestPromiseNothingSentWithoutDemand: while no Connect waits, queries on
// the pool's idle connections send nothing to Redis (package doc;
// NewConnector doc): the semaphore's dedicated server runs no command (INFO
// commandstats) across a stretch of queries long enough for several of the
// connector's 100 ms demand periods. The leases' TTL (1 minute) puts their
// renewals outside the stretch.
func TestPromiseNothingSentWithoutDemand(t *testing.T) {
	const leaseTTL = time.Minute
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			monitor := pgDB(t)
			cfg, _ := appConfig(t)
			srv := redistest.Start(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			stats := srv.Client(t)
			const limit = 2
			name := redistest.Name(t)
			sem := newVariant(t, v, srv.Client(t), name, limit, leaseTTL)
			conns := &counting{base: stdlib.GetConnector(*cfg), monitor: monitor}
			db := sql.OpenDB(redsemsql.NewConnector(conns, sem))
			db.SetMaxOpenConns(limit) // a query never needs more: no Connect waits
			db.SetMaxIdleConns(limit)
			t.Cleanup(func() { _ = db.Close() })

			// Two connections, opened at once (each Connect gets a slot at
			// once), then idle; the connector has subscribed by then.
			granted := time.Now()
			var wg sync.WaitGroup
			for range limit {
				wg.Go(func() {
					if _, err := db.ExecContext(ctx, "SELECT pg_sleep(0.05)"); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if n := conns.open.Load(); n != limit {
				t.Fatalf("%d connections open, want %d", n, limit)
			}
			redistest.WaitFor(t, 5*time.Second, "the connector's demand subscription", func() (bool, error) {
				n, err := stats.PubSubNumSub(ctx, "redsem:{"+name+"}:want").Result()
				return n["redsem:{"+name+"}:want"] == 1, err
			})
			if _, err := commandCalls(ctx, stats); err != nil { // the stats client's own connection set up
				t.Fatal(err)
			}
			before, err := commandCalls(ctx, stats)
			if err != nil {
				t.Fatal(err)
			}
			dials := conns.dials.Load()

			// The stretch: queries back to back on the idle connections,
			// at most two at once, for at least 600 ms.
			start := time.Now()
			queries := 0
			for time.Since(start) < 600*time.Millisecond {
				var wg sync.WaitGroup
				for range limit {
					wg.Go(func() {
						var one int
						if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				queries += limit
				if t.Failed() {
					return
				}
			}
			after, err := commandCalls(ctx, stats)
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(granted) >= leaseTTL/3 {
				t.Fatalf("the stretch ended %v after the grants, past the first renewal (LeaseTTL/3): the machine is too slow for this check", time.Since(granted))
			}
			t.Logf("%d queries in %v on %d connections", queries, time.Since(start).Round(time.Millisecond), limit)
			if d := conns.dials.Load() - dials; d != 0 {
				t.Fatalf("%d new connections during the stretch: a Connect ran", d)
			}
			if sent := callsSince(before, after); len(sent) > 0 {
				t.Errorf("Redis ran %v during %d queries on idle connections with no Connect waiting; want nothing", sent, queries)
			}
		})
	}
}
