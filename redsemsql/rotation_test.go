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

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemsql"
)

// idleAge is longer than the 5 ms a connection must have been idle before
// it may be given back (a connection passing from one query to the next
// is left alone): sleeping it makes a connection old enough, whatever the
// load, since time only moves forward.
const idleAge = 20 * time.Millisecond

// TestRotation is issue 33's starved process: A runs a long burst with
// SetMaxOpenConns(3) over a limit of 3, so its connections are never idle;
// B asks for one query once A holds every slot in use with queries queued.
// B must be served while A's burst still runs (a connection of A whose
// query ended goes back instead of taking A's next query), not after it.
// PostgreSQL never sees more than the limit.
func TestRotation(t *testing.T) {
	const limit, workers, perWorker = 3, 9, 100 // A: up to 900 queries of 20 ms over 3 connections
	pools, conns, app := newPools(t, "fair", 2, limit, poolSettings{maxOpen: limit, maxIdle: limit})
	a, b := pools[0], pools[1]
	ctx := redistest.Ctx(t, 2*time.Minute)
	stop := watchBackends(t, app)

	var done atomic.Int64
	var bServed atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := 0; q < perWorker && !bServed.Load(); q++ {
				qctx, cancel := context.WithTimeout(ctx, burstQueryTimeout)
				_, err := a.db.ExecContext(qctx, "SELECT pg_sleep(0.02)")
				cancel()
				if err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		}()
	}
	redistest.WaitFor(t, 30*time.Second, "A's burst holding every slot in use with queries queued", func() (bool, error) {
		st, err := a.sem.Status(ctx)
		if err != nil {
			return false, err
		}
		s := a.db.Stats()
		return len(st.Holders) == limit && s.InUse == limit && s.WaitCount > 0, nil
	})
	before := done.Load()
	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := b.db.ExecContext(qctx, "SELECT 1")
	cancel()
	wait := time.Since(start)
	during := done.Load() - before
	bServed.Store(true)
	wg.Wait()
	pgMax := stop()
	close(errs)
	for err := range errs {
		t.Errorf("a query of A failed: %v", err)
	}
	if err != nil {
		t.Fatalf("B's first query: %v", err)
	}
	t.Logf("B waited %v for its first query; A ran %d queries meanwhile (%d in all, of up to %d); most open at once: %d by the driver, %d in pg_stat_activity",
		wait.Round(time.Millisecond), during, done.Load(), workers*perWorker, conns.max.Load(), pgMax)
	if done.Load() >= workers*perWorker {
		t.Errorf("B was served only after A's whole burst of %d queries was done: no slot rotated to B", workers*perWorker)
	}
	if m := conns.max.Load(); m > limit {
		t.Errorf("%d connections were open at once; the limit is %d", m, limit)
	}
	if pgMax > limit {
		t.Errorf("PostgreSQL saw %d connections at once; the limit is %d", pgMax, limit)
	}
}

// TestOneNoticeOneGiveBack: two processes each hold one of the two slots
// with an idle connection; a third, with no connection of its own, waits
// for a slot and so publishes demand notices. Each notice is answered by
// one give-back at most (the first connector to claim it), not one per
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
	st, err := procs[0].sem.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range procs[1:] {
		if s := p.db.Stats(); s.Idle != 1 || p.conns.open.Load() != 1 {
			t.Fatalf("process %d has %d idle connections (%d open); the case needs one idle each", i+1, s.Idle, p.conns.open.Load())
		}
	}
	if len(st.Holders) != limit {
		t.Fatalf("Redis shows %d holders; the case needs processes 1 and 2 to hold all %d slots", len(st.Holders), limit)
	}
	// Count the notices as they are published.
	client := redistest.Client(t)
	channel := "redsem:{" + name + "}:want"
	sub := client.Subscribe(ctx, channel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription is confirmed
		t.Fatal(err)
	}
	var notices atomic.Int64
	go func() {
		for range sub.Channel() {
			notices.Add(1)
		}
	}()
	redistest.WaitFor(t, 10*time.Second, "processes 1 and 2 subscribed to demand notices", func() (bool, error) {
		n, err := client.PubSubNumSub(ctx, channel).Result()
		return n[channel] >= 3, err
	})
	time.Sleep(idleAge)

	// Process 0 has no connection of its own to take back: its Connect
	// publishes.
	if _, err := procs[0].db.ExecContext(ctx, "SELECT 1"); err != nil {
		t.Fatalf("process 0's query: %v", err)
	}
	givenBack := func() int64 { return 2 - procs[1].conns.open.Load() - procs[2].conns.open.Load() }
	// A second give-back for the same notice would follow the first at
	// once; give it a second to show.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && givenBack() <= notices.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	n, g := notices.Load(), givenBack()
	t.Logf("%d demand notices, %d idle connections given back", n, g)
	if n == 0 {
		t.Fatalf("process 0 got a slot but no demand notice was seen (%d given back): the case needs its Connect to publish", g)
	}
	if g == 0 {
		t.Fatalf("%d demand notices and no idle connection given back, yet process 0's query ran", n)
	}
	if g > n {
		t.Fatalf("%d demand notices, %d idle connections given back: a notice was answered by more than one process", n, g)
	}
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
	time.Sleep(idleAge)
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
