package redsempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsempgx"
)

func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// pgURL is the PostgreSQL that this machine kind and CI run (env PGURL
// overrides it).
func pgURL() string {
	if u := os.Getenv("PGURL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// monitor returns a plain pgxpool to PostgreSQL, to watch
// pg_stat_activity, closed when the test ends. When none answers it skips
// the test loudly, except in CI (env CI=true), where it fails.
func monitor(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := pgxpool.New(ctx, pgURL())
	if err == nil {
		err = m.Ping(ctx)
	}
	if err != nil {
		msg := fmt.Sprintf("!!! PostgreSQL unreachable at %s: %v: redsempgx NOT TESTED "+
			"(start one on 127.0.0.1:5432 with user postgres and db test, or set PGURL)", pgURL(), err)
		if m != nil {
			m.Close()
		}
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(m.Close)
	return m
}

// backends returns how many PostgreSQL backends serve app.
func backends(ctx context.Context, m *pgxpool.Pool, app string) (int, error) {
	var n int
	err := m.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
	return n, err
}

// sockets counts the sockets that pools dial (under the slot wrapper: the
// pool's own DialFunc is this one), open and most open at once. A socket's
// Close returns once PostgreSQL has dropped its backend, as a strict
// server-side limit needs (a given-back connection's socket is closed
// without the terminate message, and its backend exits when it reads the
// end of the stream): the slot is released after that.
type sockets struct {
	e                *env
	open, max, dials atomic.Int64
}

func (s *sockets) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	s.dials.Add(1)
	n := s.open.Add(1)
	for m := s.max.Load(); n > m && !s.max.CompareAndSwap(m, n); m = s.max.Load() {
	}
	return &countedConn{Conn: nc, s: s}, nil
}

type countedConn struct {
	net.Conn
	s      *sockets
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		if pid, ok := c.s.e.pids.Load(c.LocalAddr().String()); ok && !c.s.e.fast {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for ctx.Err() == nil {
				var n int
				if c.s.e.mon.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n) == nil && n == 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			cancel()
		}
		c.s.open.Add(-1)
	}
	return err
}

// env is one test's PostgreSQL side: an application_name of its own (by
// which pg_stat_activity finds its connections), the monitor and the
// socket count of every pool it makes.
type env struct {
	t       testing.TB
	app     string
	mon     *pgxpool.Pool
	sockets sockets
	pids    sync.Map // a socket's local address: its backend's PID
	fast    bool     // sockets close without waiting for their backends (benchmarks)
}

func newEnv(t testing.TB) *env {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	e := &env{t: t, app: "redsempgx_" + hex.EncodeToString(b[:]), mon: monitor(t)}
	e.sockets.e = e
	return e
}

// pool makes a redsempgx pool over sem (its own Redis client's semaphore:
// one process) of up to maxConns connections, closed when the test ends;
// socks counts its sockets (nil: the env's count).
func (e *env) pool(sem redsem.Semaphore, maxConns int32, opts redsempgx.Options, socks *sockets) *redsempgx.Pool {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(pgURL())
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = e.app
	if socks == nil {
		socks = &e.sockets
	}
	socks.e = e
	cfg.ConnConfig.DialFunc = socks.dial
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		e.pids.Store(c.PgConn().Conn().LocalAddr().String(), c.PgConn().PID())
		return nil
	}
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := redsempgx.NewPool(ctx, cfg, sem, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// watch samples pg_stat_activity for the env's app until stop is called,
// which returns the most backends seen at once (pooltest.Watch).
func (e *env) watch() (stop func() int64) {
	e.t.Helper()
	return pooltest.Watch(e.t, func(ctx context.Context) (int, error) { return backends(ctx, e.mon, e.app) })
}
