package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Cases that these tests found escaping the context bound, each fixed in
// the engine since (docs/reliability.md has the diagnosis): calls that
// waited on something outside the engine's door (wire.Door.runScript), and an acquire request that ran
// after its caller gave up.

// The first acquire of an Engine reads maxmemory-policy (policyCheck.check)
// with a plain go-redis call, not through the engine's door (wire.Door.runScript): with a default client,
// whose reads ignore the context, a slow CONFIG GET holds the call past its
// context, and the call then returns a lease after its deadline.
func TestFirstAcquireEvictionCheckBounded(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			p := redistest.StartProxy(t, redistest.Shared(t).Addr)
			p.SetDelay(2*time.Second, []byte("maxmemory-policy"))
			e := v.engine(t, defaultClient(t, p.Addr), redistest.Name(t), 1)
			ctx, cancel := context.WithTimeout(context.Background(), boundCtx)
			defer cancel()
			start := time.Now()
			l, err := e.TryAcquire(ctx)
			took := time.Since(start)
			if l != nil {
				_ = l.Release(context.Background())
			}
			if took > boundCtx+boundSlack {
				t.Fatalf("TryAcquire returned %v after its %v context ended (lease %v, err %v)", took-boundCtx, boundCtx, l != nil, err)
			}
		})
	}
}

// Release stops the watchdog and waits for a renewal in progress
// (stopWatchdog takes l.renewing); that renewal is bounded by the lease's
// deadline, not by Release's context, so against a Redis that stopped
// answering Release waits until the lease's deadline (up to LeaseTTL).
func TestReleaseDuringStuckRenewalBounded(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			p := redistest.StartProxy(t, redistest.Shared(t).Addr)
			c := defaultClient(t, p.Addr)
			e, err := core.New(core.Config{Client: c, Name: redistest.Name(t), Limit: 1, Fair: v.fair, LeaseTTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			ctx := redistest.Ctx(t, 30*time.Second)
			l, err := e.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The first-use eviction check runs detached: let it finish, so
			// that the renewal below is the one request the hole swallows
			// (on a pooled connection, not a new one stuck in its handshake).
			_ = e.MaxMemoryPolicy()
			// Idle connections in the pool, so that the renewal does not
			// dial one whose handshake the hole would swallow before the
			// renewal is written (the fair session's heartbeat may hold one).
			var conns []*redis.Conn
			for i := 0; i < 4; i++ {
				cn := c.Conn()
				if err := cn.Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, cn)
			}
			for _, cn := range conns {
				_ = cn.Close()
			}
			// The hole opens right after a renewal was answered, so that
			// none is in flight (one sent before it opens would be stuck,
			// and the lease lost before another is sent).
			d0 := l.Deadline()
			p.Watch([]byte(l.ID())) // only the watchdog's renewal carries it now
			redistest.WaitFor(t, 5*time.Second, "a renewal answered", func() (bool, error) {
				return p.Watched() >= 1 && l.Deadline().After(d0), nil
			})
			p.SetBlackhole(true)
			p.Watch([]byte(l.ID()))
			defer p.SetBlackhole(false)
			redistest.WaitFor(t, 5*time.Second, "the watchdog's renewal sent", func() (bool, error) {
				return p.Watched() >= 1, nil
			})
			rctx, cancel := context.WithTimeout(context.Background(), boundCtx)
			defer cancel()
			start := time.Now()
			err = l.Release(rctx)
			took := time.Since(start)
			if took > boundCtx+boundSlack {
				t.Fatalf("Release returned %v after its %v context ended: %v", took-boundCtx, boundCtx, err)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Release: %v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// With MinReplicas, a grant waits for replicas with WAIT on a dedicated
// connection (waitReplicas), a plain go-redis call: WAIT blocks up to
// ReplicaTimeout whatever the caller's context (default client), and a
// failed check then releases the lease synchronously on a detached 2 s
// context (confirmReplicas). Here no replica exists, so WAIT blocks its
// full ReplicaTimeout (1 s).
func TestMinReplicasBounded(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			c := defaultClient(t, redistest.Shared(t).Addr)
			e, err := core.New(core.Config{Client: c, Name: redistest.Name(t), Limit: 1, Fair: v.fair,
				MinReplicas: 1, ReplicaTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), boundCtx)
			defer cancel()
			start := time.Now()
			l, err := e.TryAcquire(ctx)
			took := time.Since(start)
			if l != nil {
				_ = l.Release(context.Background())
			}
			if took > boundCtx+boundSlack {
				t.Fatalf("TryAcquire returned %v after its %v context ended: %v", took-boundCtx, boundCtx, err)
			}
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redsem.ErrNotReplicated) {
				t.Fatalf("TryAcquire: %v", err)
			}
		})
	}
}

// An acquire request that reaches Redis after its undo's cancellation
// record was pruned grants a lease that nobody holds. release.lua keeps the
// "C" record min(LeaseTTL, 15 s); acquire.lua refuses an id only while the
// record exists. A request held in the network longer than that after the
// undo ran (here: the proxy holds it 2.5 s, LeaseTTL 1 s; in production a
// TCP segment retransmitted after a partition, or one stuck behind a
// paused Redis while the undo ran elsewhere) is granted a fresh lease that
// takes a slot for a full LeaseTTL (or, fair, a queue entry) and that no
// undo removes.
//
// "first": the delayed request is the Engine's first script call (another
// engine loaded the scripts), so no earlier reply told it the server's time.
func TestAcquireDelayedPastCancellationRecord(t *testing.T) {
	for _, v := range variants {
		for _, first := range []bool{false, true} {
			sub := v.name
			if first {
				sub += "/first"
			}
			t.Run(sub, func(t *testing.T) {
				srv := redistest.Shared(t)
				p := redistest.StartProxy(t, srv.Addr)
				direct := srv.Client(t)
				name := redistest.Name(t)
				// e's owner label travels only in its acquire requests (EVALSHA
				// or, for an engine's first call of a script, EVAL with the
				// source): the proxy holds those by it.
				cfg := core.Config{Client: defaultClient(t, p.Addr), Name: name, Limit: 1, Fair: v.fair, LeaseTTL: time.Second,
					Owner: "held-acquire-owner"}
				e, err := core.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = e.Close() })
				cfg.Client, cfg.Owner = direct, ""
				check, err := core.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = check.Close() })
				ctx := redistest.Ctx(t, 30*time.Second)
				warmer := e // scripts loaded, eviction policy read
				if first {
					warmer = check // scripts loaded; e has seen no reply yet
				}
				warm, err := warmer.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := warm.Release(ctx); err != nil {
					t.Fatal(err)
				}

				const held = 2500 * time.Millisecond
				marker := []byte("held-acquire-owner")
				p.SetDelay(held, marker)
				p.Watch(marker)
				actx, cancel := context.WithTimeout(ctx, boundCtx)
				defer cancel()
				if _, err := e.Acquire(actx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Acquire: %v, want the deadline", err)
				}
				e.WaitBackground() // the undo's release is not held: it ran, and left "C"
				// Other clients' scripts prune the record once it is due.
				redistest.WaitFor(t, 5*time.Second, "the cancellation record pruned", func() (bool, error) {
					l, err := check.TryAcquire(ctx)
					if err != nil {
						return false, err
					}
					if err := l.Release(ctx); err != nil {
						return false, err
					}
					m, err := direct.HGetAll(ctx, e.Keys().List[core.KeyMeta]).Result()
					for _, rec := range m {
						if rec == "C" {
							return false, err
						}
					}
					return true, err
				})
				redistest.WaitFor(t, 5*time.Second, "the held acquire request forwarded", func() (bool, error) {
					return p.Watched() >= 1, nil
				})
				// Within a second (its lease) the phantom grant would show.
				deadline := time.Now().Add(time.Second)
				for time.Now().Before(deadline) {
					raw, err := core.Inspect(ctx, direct, e.Keys())
					if err != nil {
						t.Fatal(err)
					}
					if raw.Live() {
						t.Fatalf("the abandoned acquire, run %v late, left %+v: a lease nobody holds", held, raw)
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
	}
}
