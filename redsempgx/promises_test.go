package redsempgx_test

// Tests of promises that docs/promises.md listed as gaps for redsempgx, each
// through NewPool and the pool it returns, on a real redis-server and
// PostgreSQL, for both variants.

import (
	"context"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsempgx"
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

// TestPromiseFailedNewPoolHoldsNothing: a NewPool that pgxpool refuses (a
// config with MaxConns 0) returns pgxpool's own error and no pool, and
// holds nothing: no lease, no demand subscription (NewPool doc).
func TestPromiseFailedNewPoolHoldsNothing(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			monitor(t)
			ctx := redistest.Ctx(t, 10*time.Second)
			client := redistest.Client(t)
			name := redistest.Name(t)
			sem := newVariant(t, v, client, name, 1, 0)
			refused := func() *pgxpool.Config {
				cfg, err := pgxpool.ParseConfig(pgURL())
				if err != nil {
					t.Fatal(err)
				}
				cfg.MaxConns = 0
				return cfg
			}
			_, plainErr := pgxpool.NewWithConfig(ctx, refused())
			if plainErr == nil {
				t.Fatal("pgxpool took MaxConns 0: the case needs a config it refuses")
			}
			p, err := redsempgx.NewPool(ctx, refused(), sem, redsempgx.Options{})
			if err == nil || p != nil {
				t.Fatalf("NewPool with MaxConns 0: %v, %v; want pgxpool's error and no pool", p, err)
			}
			if err.Error() != plainErr.Error() {
				t.Errorf("NewPool's error %q, want pgxpool's %q", err, plainErr)
			}
			st, err := sem.Status(ctx)
			if err != nil || len(st.Holders) != 0 || len(st.Waiters) != 0 {
				t.Fatalf("status after a failed NewPool: %+v, %v; want nothing held", st, err)
			}
			want := "redsem:{" + name + "}:want"
			if n, err := client.PubSubNumSub(ctx, want).Result(); err != nil || n[want] != 0 {
				t.Fatalf("%d subscribers (%v) of the demand channel after a failed NewPool, want 0", n[want], err)
			}
			// The semaphore still grants its only slot.
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Release(ctx)
		})
	}
}

// TestPromiseAcquiredConnLostLease: a connection acquired when its lease
// is lost (the keys deleted, the loss found by a renewal) is destroyed
// when it is released (package doc: "else it is destroyed when released
// to the pool"): its socket closes, PostgreSQL drops its backend, and the
// pool's next query runs on a new connection under a new lease.
func TestPromiseAcquiredConnLostLease(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			// Renewed every 200 ms: a deleted lease is found lost within that.
			sem := &pooltest.Recording{Semaphore: newVariant(t, v, redistest.Client(t), name, 2, 600*time.Millisecond)}
			p := e.pool(sem, 2, redsempgx.Options{}, nil)
			c, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			old := sem.Granted()
			if len(old) != 1 {
				t.Fatalf("%d leases for one connection", len(old))
			}
			pooltest.LoseAll(t, ctx, name, old)
			if n := e.sockets.open.Load(); n != 1 {
				t.Fatalf("%d sockets open after the loss, want the acquired connection's still open", n)
			}
			c.Release()
			redistest.WaitFor(t, 10*time.Second, "the released connection whose lease was lost destroyed", func() (bool, error) {
				n, err := backends(ctx, e.mon, e.app)
				return e.sockets.open.Load() == 0 && p.Stat().TotalConns() == 0 && n == 0, err
			})
			var one int
			if err := p.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("a query after the loss: %d, %v", one, err)
			}
			redistest.WaitFor(t, 10*time.Second, "the pool's connection idle", func() (bool, error) {
				s := p.Stat()
				return s.AcquiredConns() == 0 && s.IdleConns() == s.TotalConns(), nil
			})
			pooltest.CheckFresh(t, ctx, sem, len(old), int(p.Stat().TotalConns()), e.sockets.open.Load())
		})
	}
}

// TestPromiseCloseEndsSubscription: Pool.Close ends the pool's demand
// subscription (Pool.Close doc) and leaves the semaphore open, its slots
// free (NewPool doc: "sem stays open: it is the caller's").
func TestPromiseCloseEndsSubscription(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			monitor(t)
			ctx := redistest.Ctx(t, 20*time.Second)
			client := redistest.Client(t)
			name := redistest.Name(t)
			sem := newVariant(t, v, client, name, 1, 0)
			cfg, err := pgxpool.ParseConfig(pgURL())
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			p, err := redsempgx.NewPool(ctx, cfg, sem, redsempgx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Exec(ctx, "SELECT 1"); err != nil { // the first dial subscribes
				p.Close()
				t.Fatal(err)
			}
			want := "redsem:{" + name + "}:want"
			subscribers := func() (int64, error) {
				n, err := client.PubSubNumSub(ctx, want).Result()
				return n[want], err
			}
			redistest.WaitFor(t, 5*time.Second, "the pool's demand subscription", func() (bool, error) {
				n, err := subscribers()
				return n == 1, err
			})
			p.Close()
			redistest.WaitFor(t, 5*time.Second, "the subscription ended by Close", func() (bool, error) {
				n, err := subscribers()
				return n == 0, err
			})
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire after the pool's Close: %v, want the slot (the semaphore stays open)", err)
			}
			_ = l.Release(ctx)
		})
	}
}

// hookCounts counts the calls of a config's own hooks.
type hookCounts struct {
	dial, afterConnect, prepare, beforeAcquire, afterRelease, beforeClose atomic.Int64
	// releaseFalseAt: the afterRelease call (1-based) that answers false.
	releaseFalseAt int64
}

func (h *hookCounts) snapshot() [6]int64 {
	return [6]int64{h.dial.Load(), h.afterConnect.Load(), h.prepare.Load(), h.beforeAcquire.Load(), h.afterRelease.Load(), h.beforeClose.Load()}
}

const hookNames = "[DialFunc AfterConnect PrepareConn BeforeAcquire AfterRelease BeforeClose]"

// config returns a config of pgURL with h's hooks: all of them, or
// (beforeAcquire) DialFunc, BeforeAcquire and nothing else.
func (h *hookCounts) config(t *testing.T, beforeAcquire bool) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dial.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	if beforeAcquire {
		cfg.BeforeAcquire = func(context.Context, *pgx.Conn) bool { h.beforeAcquire.Add(1); return true }
		return cfg
	}
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { h.afterConnect.Add(1); return nil }
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { h.prepare.Add(1); return true, nil }
	cfg.AfterRelease = func(*pgx.Conn) bool { return h.afterRelease.Add(1) != h.releaseFalseAt }
	cfg.BeforeClose = func(*pgx.Conn) { h.beforeClose.Add(1) }
	return cfg
}

// TestPromiseOwnHooksCalled: NewPool wraps the config's own DialFunc,
// AfterConnect, PrepareConn, AfterRelease and BeforeClose (and
// BeforeAcquire when PrepareConn is nil), calling each as pgxpool calls it
// without redsempgx (NewPool doc; package doc): the same run (three
// acquires, the second's AfterRelease answering false so that pgxpool
// destroys the connection, then Close) counts the same calls on a plain
// pgxpool and on a redsempgx pool, whose slot is free once the connection
// is destroyed.
func TestPromiseOwnHooksCalled(t *testing.T) {
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			monitor(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			sem := newVariant(t, v, redistest.Client(t), redistest.Name(t), 1, 0)
			held := func() int {
				st, err := sem.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return len(st.Holders)
			}
			for _, beforeAcquire := range []bool{false, true} {
				run := func(newPool func(*pgxpool.Config) (*pgxpool.Pool, func()), counted bool) [6]int64 {
					h := &hookCounts{releaseFalseAt: 2}
					pool, closePool := newPool(h.config(t, beforeAcquire))
					for i := 1; i <= 3; i++ {
						c, err := pool.Acquire(ctx)
						if err != nil {
							t.Fatal(err)
						}
						if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
							t.Fatal(err)
						}
						if counted && held() != 1 {
							t.Fatalf("acquire %d: %d holders with one connection open, want 1", i, held())
						}
						c.Release()
						// pgxpool releases in a goroutine of its own.
						redistest.WaitFor(t, 10*time.Second, "the connection back in the pool or destroyed", func() (bool, error) {
							s := pool.Stat()
							return s.AcquiredConns() == 0 && (beforeAcquire || h.afterRelease.Load() == int64(i)), nil
						})
						if counted && !beforeAcquire && i == 2 {
							redistest.WaitFor(t, 10*time.Second, "the slot of the connection destroyed after AfterRelease said false", func() (bool, error) {
								return held() == 0, nil
							})
						}
					}
					closePool()
					if counted && held() != 0 {
						t.Fatalf("%d holders after Close, want 0", held())
					}
					return h.snapshot()
				}
				plain := run(func(cfg *pgxpool.Config) (*pgxpool.Pool, func()) {
					p, err := pgxpool.NewWithConfig(ctx, cfg)
					if err != nil {
						t.Fatal(err)
					}
					return p, p.Close
				}, false)
				wrapped := run(func(cfg *pgxpool.Config) (*pgxpool.Pool, func()) {
					p, err := redsempgx.NewPool(ctx, cfg, sem, redsempgx.Options{})
					if err != nil {
						t.Fatal(err)
					}
					return p.Pool, p.Close
				}, true)
				t.Logf("BeforeAcquire only: %v: calls %s: plain pgxpool %v, redsempgx %v", beforeAcquire, hookNames, plain, wrapped)
				if plain != wrapped {
					t.Errorf("BeforeAcquire only: %v: calls %s: plain pgxpool %v, redsempgx %v; want the same", beforeAcquire, hookNames, plain, wrapped)
				}
				if beforeAcquire && (wrapped[0] == 0 || wrapped[3] == 0) || !beforeAcquire && (wrapped[0] == 0 || wrapped[1] == 0 || wrapped[2] == 0 || wrapped[4] == 0 || wrapped[5] == 0) {
					t.Errorf("BeforeAcquire only: %v: a hook was never called: %s %v", beforeAcquire, hookNames, wrapped)
				}
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

// TestPromiseNothingSentWithoutDemand: while no dial waits, queries on the
// pool's connections send nothing to Redis (package doc): the semaphore's
// dedicated server runs no command (INFO commandstats) across a stretch of
// queries long enough for several 100 ms demand periods. The leases' TTL
// (1 minute) puts their renewals outside the stretch.
func TestPromiseNothingSentWithoutDemand(t *testing.T) {
	const leaseTTL = time.Minute
	for _, v := range promiseVariants {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			srv := redistest.Start(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			stats := srv.Client(t)
			const limit = 2
			name := redistest.Name(t)
			sem := newVariant(t, v, srv.Client(t), name, limit, leaseTTL)
			p := e.pool(sem, limit, redsempgx.Options{}, nil) // MaxConns at the limit: no dial waits

			// Two connections, dialled at once (each gets a slot at once),
			// then idle; the pool has subscribed by then.
			granted := time.Now()
			var conns []*pgxpool.Conn
			for range limit {
				c, err := p.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				c.Release()
			}
			redistest.WaitFor(t, 10*time.Second, "both connections idle", func() (bool, error) {
				s := p.Stat()
				return s.IdleConns() == limit && s.TotalConns() == limit, nil
			})
			redistest.WaitFor(t, 5*time.Second, "the pool's demand subscription", func() (bool, error) {
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
			dials := e.sockets.dials.Load()

			start := time.Now()
			queries := 0
			for time.Since(start) < 600*time.Millisecond {
				var wg sync.WaitGroup
				for range limit {
					wg.Go(func() {
						var one int
						if err := p.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
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
			if d := e.sockets.dials.Load() - dials; d != 0 {
				t.Fatalf("%d dials during the stretch", d)
			}
			if sent := callsSince(before, after); len(sent) > 0 {
				t.Errorf("Redis ran %v during %d queries with no dial waiting; want nothing", sent, queries)
			}
		})
	}
}
