package redsemsql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // tests only: the PostgreSQL driver under the connector
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// defaultPGURL is the PostgreSQL that this machine kind and CI run.
const defaultPGURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func pgURL() string {
	if u := os.Getenv("PGURL"); u != "" {
		return u
	}
	return defaultPGURL
}

// pgDB returns a plain connection pool to PostgreSQL (env PGURL, else
// defaultPGURL), closed when the test ends. When none answers it skips the
// test with a loud message, except in CI (env CI=true), where it fails.
func pgDB(t testing.TB) *sql.DB {
	t.Helper()
	url := pgURL()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("redsemsql: PGURL %q: %v", url, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		msg := fmt.Sprintf("!!! PostgreSQL unreachable at %s: %v: redsemsql NOT TESTED "+
			"(start one on 127.0.0.1:5432 with user postgres and db test, e.g. bash .ci/postgres.sh, or set PGURL)", url, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return db
}

// appConfig returns the pgx configuration of PGURL with an application_name
// unique to this test, by which pg_stat_activity finds its connections.
func appConfig(t testing.TB) (*pgx.ConnConfig, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgURL())
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "redsemsql_" + hex.EncodeToString(b[:])
	cfg.RuntimeParams["application_name"] = app
	return cfg, app
}

// countBackends returns how many PostgreSQL backends serve app.
func countBackends(ctx context.Context, monitor *sql.DB, app string) (int, error) {
	var n int
	err := monitor.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
	return n, err
}

// counting opens pgx connections, counts those open and the most open at
// once, and closes each the way a strict server-side limit needs: Close
// returns only once PostgreSQL has dropped the backend (pgx's Close sends
// the terminate message and returns while the backend may still exist).
type counting struct {
	base             driver.Connector
	monitor          *sql.DB
	open, max, dials atomic.Int64
	fast             bool // Close does not wait for the backend to go (benchmarks)
}

func (c *counting) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	c.dials.Add(1)
	n := c.open.Add(1)
	for m := c.max.Load(); n > m && !c.max.CompareAndSwap(m, n); m = c.max.Load() {
	}
	return &waitClose{Conn: dc.(*stdlib.Conn), c: c}, nil
}

func (c *counting) Driver() driver.Driver { return c.base.Driver() }

// waitClose is a pgx connection (every method and optional interface of
// *stdlib.Conn) whose Close waits for the backend to go.
type waitClose struct {
	*stdlib.Conn
	c *counting
}

func (w *waitClose) Close() error {
	pid := w.Conn.Conn().PgConn().PID()
	err := w.Conn.Close()
	if w.c.fast {
		w.c.open.Add(-1)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		var n int
		err := w.c.monitor.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		if err == nil && n == 0 {
			break
		}
		if err != nil && strings.Contains(err.Error(), "database is closed") {
			// The test ended and closed its monitor (database/sql may
			// close a connection it opened for a DB closed meanwhile):
			// nobody counts any more.
			break
		}
		time.Sleep(time.Millisecond)
	}
	w.c.open.Add(-1)
	return err
}
