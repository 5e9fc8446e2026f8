package faults_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// The scale benchmarks run one fixed scenario per iteration; run them with
//
//	go test -run '^$' -bench Scale -benchtime 1x ./internal/testkit/faults/
//
// They report throughput, latency percentiles and Redis memory (INFO memory
// used_memory deltas) as custom metrics; docs/reliability.md quotes them.

const scaleN = 10000

// percentile returns the p-th percentile (0..100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

func usedMemoryAll(b *testing.B, ctx context.Context, nodes []*redis.Client) int64 {
	b.Helper()
	var sum int64
	for _, n := range nodes {
		u, err := usedMemory(ctx, n)
		if err != nil {
			b.Fatal(err)
		}
		sum += u
	}
	return sum
}

// runAll calls op(i) for i in [0,n) on workers goroutines and returns each
// call's latency.
func runAll(b *testing.B, n, workers int, op func(i int) error) ([]time.Duration, time.Duration) {
	b.Helper()
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	next := make(chan int, n)
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				if err := op(i); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("op %d: %w", i, err) })
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return lat, time.Since(start)
}

// 10 000 distinct semaphores over a local 3-primary cluster: first use
// (which also reads maxmemory-policy once per semaphore), memory per
// semaphore with one holder, release, and steady-state acquire+release.
func BenchmarkScaleDistinctSemaphores(b *testing.B) {
	cl := redistest.StartCluster(b, 3, 0)
	cc := cl.Client(b)
	var nodes []*redis.Client
	for _, p := range cl.Primaries {
		nodes = append(nodes, p.Client(b))
	}
	ctx := context.Background()
	const workers = 32
	for b.Loop() {
		base := redistest.Name(b)
		sems := make([]*unfair.Semaphore, scaleN)
		for i := range sems {
			s, err := unfair.New(cc, fmt.Sprintf("%s-%d", base, i), 1, unfair.Options{LeaseTTL: time.Minute, DisableAutoRenew: true})
			if err != nil {
				b.Fatal(err)
			}
			sems[i] = s
		}
		leases := make([]redsem.Lease, scaleN)
		mem0 := usedMemoryAll(b, ctx, nodes)
		first, firstTook := runAll(b, scaleN, workers, func(i int) (err error) {
			leases[i], err = sems[i].TryAcquire(ctx)
			return err
		})
		mem1 := usedMemoryAll(b, ctx, nodes)
		rel, relTook := runAll(b, scaleN, workers, func(i int) error { return leases[i].Release(ctx) })
		cycle, cycleTook := runAll(b, scaleN, workers, func(i int) error {
			l, err := sems[i].TryAcquire(ctx)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
		b.ReportMetric(float64(scaleN)/firstTook.Seconds(), "first-acquires/s")
		b.ReportMetric(float64(percentile(first, 50).Microseconds()), "first-acquire-p50-µs")
		b.ReportMetric(float64(percentile(first, 99).Microseconds()), "first-acquire-p99-µs")
		b.ReportMetric(float64(scaleN)/relTook.Seconds(), "releases/s")
		b.ReportMetric(float64(percentile(rel, 99).Microseconds()), "release-p99-µs")
		b.ReportMetric(float64(scaleN)/cycleTook.Seconds(), "acquire+release/s")
		b.ReportMetric(float64(percentile(cycle, 50).Microseconds()), "cycle-p50-µs")
		b.ReportMetric(float64(percentile(cycle, 99).Microseconds()), "cycle-p99-µs")
		b.ReportMetric(float64(mem1-mem0)/scaleN, "redis-B/semaphore-with-holder")
	}
}

// One hot fair semaphore (limit 10) with 10 000 waiters queued by one
// process: enqueue rate, Redis memory per queued waiter, then the drain
// (each grantee releases at once) with its handoff rate.
func BenchmarkScaleHotQueue(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(func() *redis.Options { o := srv.Options(); o.PoolSize = 64; return o }())
	defer c.Close()
	ctx := context.Background()
	const limit = 10
	for b.Loop() {
		name := redistest.Name(b)
		s, err := fair.New(c, name, limit, fair.Options{LeaseTTL: time.Minute, QueueTTL: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		var held []redsem.Lease
		for i := 0; i < limit; i++ {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			held = append(held, l)
		}
		mem0, _ := usedMemory(ctx, c)
		start := time.Now()
		var wg sync.WaitGroup
		waits := make([]time.Duration, scaleN)
		var queuedAt time.Time
		var errMu sync.Mutex
		var firstErr error
		for i := 0; i < scaleN; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := s.Acquire(ctx)
				if err == nil {
					waits[i] = time.Since(queuedAt)
					err = l.Release(ctx)
				}
				if err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
				}
			}()
		}
		var st redsem.Status
		for {
			if st, err = s.Status(ctx); err != nil {
				b.Fatal(err)
			}
			if len(st.Waiters) == scaleN {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		queuedAt = time.Now()
		enqueue := queuedAt.Sub(start)
		mem1, _ := usedMemory(ctx, c)
		for _, l := range held {
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
		drain := time.Since(queuedAt)
		if firstErr != nil {
			b.Fatal(firstErr)
		}
		_ = s.Close()
		b.ReportMetric(float64(scaleN)/enqueue.Seconds(), "enqueued/s")
		b.ReportMetric(float64(mem1-mem0)/scaleN, "redis-B/waiter")
		b.ReportMetric(float64(scaleN)/drain.Seconds(), "grants/s")
		b.ReportMetric(drain.Seconds(), "drain-s")
		b.ReportMetric(float64(percentile(waits, 50).Milliseconds()), "wait-p50-ms")
		b.ReportMetric(float64(percentile(waits, 99).Milliseconds()), "wait-p99-ms")
	}
}

// Holders of one semaphore: Redis memory per holder, and how grant latency
// grows with the number of holders (slots come from the free set, and
// high-water slots once it is empty).
func BenchmarkScaleManyHolders(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	const n = 2000
	for b.Loop() {
		s, err := unfair.New(c, redistest.Name(b), n, unfair.Options{LeaseTTL: time.Minute, DisableAutoRenew: true})
		if err != nil {
			b.Fatal(err)
		}
		mem0, _ := usedMemory(ctx, c)
		lat := make([]time.Duration, n)
		leases := make([]redsem.Lease, n)
		for i := range leases {
			t0 := time.Now()
			if leases[i], err = s.TryAcquire(ctx); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		mem1, _ := usedMemory(ctx, c)
		for _, l := range leases {
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(mem1-mem0)/n, "redis-B/holder")
		b.ReportMetric(float64(percentile(lat[:100], 50).Microseconds()), "grant-p50-first100-µs")
		b.ReportMetric(float64(percentile(lat[n-100:], 50).Microseconds()), "grant-p50-last100-µs")
	}
}
