package redsemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemsql"
)

// TestRotation is issue 33's starved process (pooltest.Rotation): A runs
// a long burst with SetMaxOpenConns(3) over a limit of 3, so its
// connections are never idle; B must get its first query while A's burst
// still runs. PostgreSQL never sees more than the limit.
func TestRotation(t *testing.T) {
	const limit = 3
	pools, conns, app := newPools(t, "fair", 2, limit, poolSettings{maxOpen: limit, maxIdle: limit})
	a, b := pools[0], pools[1]
	stop := watchBackends(t, app)
	query := func(db *sql.DB, q string) func(context.Context) error {
		return func(ctx context.Context) error { _, err := db.ExecContext(ctx, q); return err }
	}
	pooltest.Rotation(t, query(a.db, "SELECT pg_sleep(0.02)"), query(b.db, "SELECT 1"), func(ctx context.Context) (bool, error) {
		st, err := a.sem.Status(ctx)
		if err != nil {
			return false, err
		}
		s := a.db.Stats()
		return len(st.Holders) == limit && s.InUse == limit && s.WaitCount > 0, nil
	})
	pooltest.CheckMost(t, limit, conns.max.Load(), stop())
}

// TestOneNoticeOneGiveBack: two processes each hold one of the two slots
// with an idle connection; a third, with no connection of its own, waits
// for a slot and so publishes demand notices. Each notice is answered by
// one give-back at most (pooltest.OneNoticeOneGiveBack), not one per
// process.
func TestOneNoticeOneGiveBack(t *testing.T) {
	const limit = 2
	monitor := pgDB(t)
	cfg, _ := appConfig(t)
	name := redistest.Name(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	type proc struct {
		db    *sql.DB
		conns *counting
		sem   *fair.Semaphore
	}
	procs := make([]proc, 3)
	for i := range procs {
		sem, err := fair.New(redistest.Client(t), name, limit, fair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sem.Close() })
		conns := &counting{base: stdlib.GetConnector(*cfg), monitor: monitor}
		db := sql.OpenDB(redsemsql.NewConnector(conns, sem))
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		t.Cleanup(func() { _ = db.Close() })
		procs[i] = proc{db: db, conns: conns, sem: sem}
	}
	// Processes 1 and 2 each open a connection (subscribing to demand
	// notices) and leave it idle.
	for _, p := range procs[1:] {
		if _, err := p.db.ExecContext(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range procs[1:] {
		if s := p.db.Stats(); s.Idle != 1 || p.conns.open.Load() != 1 {
			t.Fatalf("process %d has %d idle connections (%d open); the case needs one idle each", i+1, s.Idle, p.conns.open.Load())
		}
	}
	st, err := procs[0].sem.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != limit {
		t.Fatalf("Redis shows %d holders; the case needs processes 1 and 2 to hold all %d slots", len(st.Holders), limit)
	}
	pooltest.OneNoticeOneGiveBack(t, name, func(ctx context.Context) error {
		_, err := procs[0].db.ExecContext(ctx, "SELECT 1")
		return err
	}, func() int64 { return 2 - procs[1].conns.open.Load() - procs[2].conns.open.Load() })
}

// TestStmtOnReturnedConn: database/sql returns a connection with
// putConn(dc, err, false) when the query that waited for it gave up as it
// arrived (sql.go, DB.conn): IsValid marks it idle but database/sql does
// not set needReset, so its next use through a prepared *sql.Stmt calls no
// ResetSession and runs the driver statement directly. The statement must
// mark the connection in use, or a waiting Connect takes its slot and
// closes it mid-statement. The test makes database/sql's calls itself, in
// that order, since the race that leads to them cannot be staged.
func TestStmtOnReturnedConn(t *testing.T) {
	monitor := pgDB(t)
	cfg, app := appConfig(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	sem, err := fair.New(redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	connector := redsemsql.NewConnector(stdlib.GetConnector(*cfg), sem)
	t.Cleanup(func() { _ = connector.(interface{ Close() error }).Close() })

	// A session holds the advisory lock that the statement will wait for.
	blocker, err := monitor.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	const key = 33033
	if _, err := blocker.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := blocker.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()

	dc, err := connector.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	ds, err := dc.(driver.ConnPrepareContext).PrepareContext(ctx, "SELECT pg_advisory_xact_lock($1)")
	if err != nil {
		t.Fatal(err)
	}
	if !dc.(driver.Validator).IsValid() { // putConn(dc, err, false)
		t.Fatal("a fresh connection reports itself invalid")
	}
	time.Sleep(pooltest.IdleAge)
	execErr := make(chan error, 1)
	go func() {
		_, err := ds.(driver.StmtExecContext).ExecContext(ctx, []driver.NamedValue{{Ordinal: 1, Value: int64(key)}})
		execErr <- err
	}()
	redistest.WaitFor(t, 10*time.Second, "the statement waiting for the advisory lock in PostgreSQL", func() (bool, error) {
		var n int
		err := monitor.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&n)
		return n == 1, err
	})
	// Another Connect waits for the only slot: after 10 ms it asks the
	// connector's idle connections to give one back, every 100 ms.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	other, err := connector.Connect(cctx)
	cancel()
	if err == nil {
		_ = other.Close()
		t.Errorf("a Connect took the only slot while a prepared statement ran on its connection: the connection was given back mid-statement")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the waiting Connect: %v, want DeadlineExceeded", err)
	}
	unlock()
	if err := <-execErr; err != nil {
		t.Errorf("the prepared statement: %v", err)
	}
}

// TestConnectBounded: database/sql's opener goroutine calls Connect with a
// context that never ends (Driver().Open too); the wait for a slot is
// bounded all the same, so that a blocked opener does not hold one of
// MaxOpenConns forever, and the error says so.
func TestConnectBounded(t *testing.T) {
	pgDB(t)
	cfg, _ := appConfig(t)
	ctx := redistest.Ctx(t, time.Minute)
	sem, err := fair.New(redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	l, err := sem.Acquire(ctx) // the only slot, held elsewhere
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	db := sql.OpenDB(redsemsql.NewConnector(stdlib.GetConnector(*cfg), sem))
	t.Cleanup(func() { _ = db.Close() })
	start := time.Now()
	res := make(chan error, 1)
	go func() {
		c, err := db.Driver().Open(pgURL())
		if err == nil {
			_ = c.Close()
		}
		res <- err
	}()
	select {
	case err := <-res:
		took := time.Since(start)
		t.Logf("Open with a context that never ends returned after %v: %v", took.Round(time.Millisecond), err)
		if err == nil {
			t.Fatal("Open got a slot that was held")
		}
		if !errors.Is(err, redsemsql.ErrConnectTimeout) || !strings.Contains(err.Error(), "10s") {
			t.Fatalf("Open: %v, want redsemsql.ErrConnectTimeout, naming the bound (10s)", err)
		}
		if took < 10*time.Second {
			t.Fatalf("Open gave up after %v, before the default bound of 10s", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Open with a context that never ends still waits for a slot after 20s (the default bound is 10s)")
	}
}
