package redsempgx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/pooltest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsempgx"
)

// shareQuery is issue 44's query: 2 ms in PostgreSQL, run back to back.
const shareQuery = "SELECT pg_sleep(0.002)"

// TestShareAtLimit is issue 44's first finding: two pools at MaxConns
// equal to the limit (3), each with 6 workers running a 2 ms query back to
// back, share a fair semaphore, as two processes (each its own Redis client
// and semaphore) and as two pools of one process on one semaphore. Each
// pool must run its 1000 queries (neither starved), with few dials: a slot
// rotates to the other pool once a connection has served Options.MinHold,
// not after a query or a few. Before MinHold, both shapes dialled about
// once every 6 queries here (the issue saw once a query across real
// processes, and no query at all in the one-semaphore shape). Neither the
// sockets nor pg_stat_activity exceed the limit.
func TestShareAtLimit(t *testing.T) {
	for _, shape := range []string{"processes", "one-semaphore"} {
		t.Run(shape, func(t *testing.T) {
			const limit, workers, want = 3, 6, 1000
			e := newEnv(t)
			name := redistest.Name(t)
			semA := newFair(t, name, limit)
			var semB redsem.Semaphore = semA
			if shape == "processes" {
				semB = newFair(t, name, limit)
			}
			a := e.pool(semA, limit, redsempgx.Options{}, nil)
			b := e.pool(semB, limit, redsempgx.Options{}, nil)
			stop := e.watch()
			ctx := redistest.Ctx(t, time.Minute)
			start := time.Now()
			ran, err := pooltest.Share(ctx, []func(context.Context) error{exec(a), exec(b)}, workers, want)
			took := time.Since(start)
			most := stop()
			dials := e.sockets.dials.Load()
			t.Logf("pool A ran %d queries, pool B %d, in %v, with %d dials", ran[0], ran[1], took.Round(time.Millisecond), dials)
			if err != nil {
				t.Fatalf("pools sharing the limit: %v", err)
			}
			pooltest.CheckMost(t, limit, e.sockets.max.Load(), most)
			// Each slot changes hands at most once a slice: after its
			// first connections (one per slot and pool), at most one dial
			// per slot per MinHold that the run lasted.
			if bound := 2*limit + limit*int64(took/defaultMinHold); dials > bound {
				t.Errorf("%d dials for %d queries in %v, more than %d (one per slot per %v slice): a connection rotates to the other pool after a query or two",
					dials, ran[0]+ran[1], took.Round(time.Millisecond), bound, defaultMinHold)
			}
		})
	}
}

// defaultMinHold is Options.MinHold's default.
const defaultMinHold = 500 * time.Millisecond

// exec runs shareQuery on p.
func exec(p *redsempgx.Pool) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := p.Exec(ctx, shareQuery)
		return err
	}
}

// BenchmarkShare is issue 44's throughput: pools at MaxConns equal to the
// limit (3), 6 workers each running a 2 ms query back to back, alone and
// two (two processes: each its own Redis client and fair semaphore). One
// op is one query of either pool, so ns/op of two against alone is what
// sharing costs; q/s is queries a second, dials/kq new connections per
// 1000 queries, and min-share the least served pool's share of the
// queries over its even share (1: even; 0: starved). Run it for a few
// slices: go test -run '^$' -bench Share -benchtime 3000x.
func BenchmarkShare(b *testing.B) {
	for _, bc := range []struct {
		name  string
		pools int
		opts  redsempgx.Options
	}{
		{"alone", 1, redsempgx.Options{}},
		{"two", 2, redsempgx.Options{}},
		{"two-minhold=-1", 2, redsempgx.Options{MinHold: -1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const limit, workers = 3, 6
			e := newEnv(b)
			e.fast = true
			name := redistest.Name(b)
			var queries []func(context.Context) error
			for range bc.pools {
				queries = append(queries, exec(e.pool(newFair(b, name, limit), limit, bc.opts, nil)))
			}
			pooltest.Bench(b, queries, workers, e.sockets.dials.Load)
		})
	}
}

// TestOptionsInvalid: NewPool refuses a MinHold that is not shorter than a
// bounded ConnectTimeout (a waiting dial would give up before a slot
// rotated), and a nil semaphore, with a *redsem.ConfigError naming the
// field, before it touches cfg; a negative MinHold is valid (give back at
// once).
func TestOptionsInvalid(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	sem := newFair(t, redistest.Name(t), 1)
	for _, c := range []struct {
		sem   redsem.Semaphore
		opts  redsempgx.Options
		field string // "": valid
	}{
		{sem, redsempgx.Options{MinHold: -1}, ""},
		{sem, redsempgx.Options{MinHold: time.Hour, ConnectTimeout: -1}, ""},
		{sem, redsempgx.Options{MinHold: 10 * time.Second}, "redsempgx.Options.MinHold"},
		{sem, redsempgx.Options{MinHold: time.Second, ConnectTimeout: time.Second}, "redsempgx.Options.MinHold"},
		{nil, redsempgx.Options{}, "sem"},
	} {
		cfg, err := pgxpool.ParseConfig(pgURL())
		if err != nil {
			t.Fatal(err)
		}
		p, err := redsempgx.NewPool(ctx, cfg, c.sem, c.opts)
		if c.field == "" {
			if err != nil {
				t.Errorf("%+v: %v, want valid", c.opts, err)
			} else {
				p.Close()
			}
			continue
		}
		var ce *redsem.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, redsem.ErrInvalidConfig) || ce.Field != c.field || p != nil {
			t.Errorf("%+v: %v, want a *redsem.ConfigError for %s and no pool", c.opts, err, c.field)
			continue
		}
		if cfg.AfterConnect != nil || cfg.PrepareConn != nil {
			t.Errorf("%+v: NewPool failed but set cfg's hooks", c.opts)
		}
		t.Logf("%+v: %v", c.opts, err)
	}
}
