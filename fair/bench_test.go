package fair_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/redisinfo"
	"github.com/redsem/redsem/internal/testkit/benchtest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Compare two commits with benchstat: see docs/benchmarks.md.

// BenchmarkTryAcquireRelease is one uncontended TryAcquire+Release cycle:
// two scripts, two round trips; redis-µs/op is the time Redis spent in them.
func BenchmarkTryAcquireRelease(b *testing.B) {
	c := redistest.Client(b)
	s, err := fair.New(c, redistest.Name(b), 1, fair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchtest.TryAcquireRelease(b, c, s)
}

// BenchmarkHandoff is a contended loop: limit 1, 4 x GOMAXPROCS goroutines
// in one process acquiring and releasing at once with no hold. One op is one
// hold, so ns/op is the time from one release to the next grant.
func BenchmarkHandoff(b *testing.B) {
	s, err := fair.New(redistest.Client(b), redistest.Name(b), 1, fair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchtest.Handoff(b, s)
}

// BenchmarkQueued measures the scripts' cost as the queue grows: with n
// waiters queued (limit 1), one op releases the holder, which grants the
// head waiter inside release.lua, and queues a new waiter at the back with
// acquire.lua, so the queue stays at n. The waiters are raw script calls of
// one live session (kept alive by heartbeat.lua with a long QueueTTL), so
// no goroutine per waiter is needed. Both scripts should be O(log n).
func BenchmarkQueued(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) { benchQueued(b, n) })
	}
}

const longMs = 10 * 60 * 1000 // lease and session TTL: outlives the benchmark

func benchQueued(b *testing.B, n int) {
	ctx := context.Background()
	c := redistest.Client(b)
	keys := core.KeysFor(core.DefaultPrefix, redistest.Name(b))
	defer c.Del(ctx, keys.List...)
	sid := strings.ReplaceAll(uuid.NewString(), "-", "")
	// The session is live for longMs.
	if err := core.Script(lua.Heartbeat).Run(ctx, c, keys.List, keys.Chan, "PUBLISH", 1, sid, longMs, "new").Err(); err != nil {
		b.Fatal(err)
	}
	acquire := func(id, mode string) ([]any, error) {
		return core.Script(lua.Acquire).Run(ctx, c, keys.List, keys.Chan, "PUBLISH", 1, id, 1, longMs, mode, sid, 1000, "bench", 0).Slice()
	}
	holder := uuid.NewString()
	if v, err := acquire(holder, "try"); err != nil || v[0].(int64) != 1 {
		b.Fatalf("first acquire: %v %v", v, err)
	}
	if err := core.Script(lua.Acquire).Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	for done := 0; done < n; {
		p := c.Pipeline()
		for k := 0; k < 1000 && done < n; k, done = k+1, done+1 {
			p.EvalSha(ctx, lua.Acquire.Hash(), keys.List, keys.Chan, "PUBLISH", 1, uuid.NewString(), 1, longMs, "queue", sid, 1000, "bench", 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if r, _ := core.Inspect(ctx, c, keys); r.Queue != int64(n) {
		b.Fatalf("queue length %d, want %d", r.Queue, n)
	}
	ids := make([]string, 0, 1024)
	before, err := redisinfo.ReadStats(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	ops := 0
	for b.Loop() {
		ops++
		if len(ids) == 0 {
			b.StopTimer()
			for range cap(ids) {
				ids = append(ids, uuid.NewString())
			}
			b.StartTimer()
		}
		v, err := core.Script(lua.Release).Run(ctx, c, keys.List, keys.Chan, "PUBLISH", 1, holder, "owner", 10000).Slice()
		if err != nil || len(v) < 6 || v[0].(int64) != 1 {
			b.Fatalf("release: %v %v", v, err)
		}
		holder = v[2].(string) // the head waiter, granted by the release
		id := ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		if v, err := acquire(id, "queue"); err != nil || v[0].(int64) != 0 {
			b.Fatalf("queue: %v %v", v, err)
		}
	}
	b.StopTimer()
	after, err := redisinfo.ReadStats(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	// Redis-side script time per op (both scripts): what the queue length
	// may change, without the client's scheduling noise. Another package's
	// tests running on the same server would add to it; the benchmarks of a
	// package run one at a time.
	b.ReportMetric(float64(after.Sub(before).ScriptUsec)/float64(ops), "redis-µs/op")
	if r, _ := core.Inspect(ctx, c, keys); r.Queue != int64(n) {
		b.Fatalf("queue length %d after the loop, want %d", r.Queue, n)
	}
}

// BenchmarkAcquireBlockedWaiters is the contended loop of BenchmarkHandoff
// with n goroutines (10 or 1000) all blocked in Acquire at once: it shows
// what the per-process session costs as waiters grow in one process.
func BenchmarkAcquireBlockedWaiters(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := fair.New(redistest.Client(b), redistest.Name(b), 1, fair.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ops := make(chan struct{})
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						l, err := s.Acquire(ctx)
						if err != nil {
							if !errors.Is(err, context.Canceled) {
								b.Error(err)
							}
							return
						}
						select {
						case ops <- struct{}{}:
						case <-ctx.Done():
						}
						_ = l.Release(context.Background())
					}
				}()
			}
			// Let the waiters queue up before timing.
			waitQueued(b, s, n-1)
			b.ResetTimer()
			for b.Loop() {
				<-ops
			}
			b.StopTimer()
			cancel()
			wg.Wait()
		})
	}
}

func waitQueued(b *testing.B, s redsem.Semaphore, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.Status(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if len(st.Waiters) >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatalf("fewer than %d waiters queued after 30s", n)
}
