// Package pooltest holds the cases that redsemsql and redsempgx test alike
// (the pools of two or three processes sharing a semaphore): each package
// gives the queries through its own pool, and PostgreSQL's count through
// its own monitor.
package pooltest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// IdleAge is longer than the 5 ms a connection must have been idle before
// it may be given back: sleeping it makes a connection old enough, whatever
// the load, since time only moves forward.
const IdleAge = 20 * time.Millisecond

// QueryTimeout bounds each query of a burst: what a loaded 2-core machine
// needs to connect to PostgreSQL, not what a quiet one gives; a query that
// waits for a slot forever still fails.
const QueryTimeout = 15 * time.Second

// Rotation is issue 33's starved process: A runs a long burst (9 workers,
// up to 100 queries each, each query given QueryTimeout) over pools whose
// connections are never idle; once full reports that A holds every slot
// with queries queued, B runs one query, which must return while A's burst
// still runs (a slot rotated to B), not after it. It returns how long B
// waited.
func Rotation(t *testing.T, a, b func(context.Context) error, full func(context.Context) (bool, error)) time.Duration {
	t.Helper()
	const workers, perWorker = 9, 100
	ctx := redistest.Ctx(t, 2*time.Minute)
	var done atomic.Int64
	var bServed atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := 0; q < perWorker && !bServed.Load(); q++ {
				qctx, cancel := context.WithTimeout(ctx, QueryTimeout)
				err := a(qctx)
				cancel()
				if err != nil {
					t.Errorf("a query of A failed: %v", err)
					return
				}
				done.Add(1)
			}
		}()
	}
	redistest.WaitFor(t, 30*time.Second, "A's burst holding every slot in use with queries queued", func() (bool, error) {
		return full(ctx)
	})
	before := done.Load()
	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	err := b(qctx)
	cancel()
	wait := time.Since(start)
	during := done.Load() - before
	bServed.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("B's first query: %v", err)
	}
	t.Logf("B waited %v for its first query; A ran %d queries meanwhile (%d in all, of up to %d)",
		wait.Round(time.Millisecond), during, done.Load(), workers*perWorker)
	if done.Load() >= workers*perWorker {
		t.Errorf("B was served only after A's whole burst of %d queries was done: no slot rotated to B", workers*perWorker)
	}
	return wait
}

// OneNoticeOneGiveBack checks that each demand notice on the semaphore
// name's channel is answered by one give-back at most. The caller has set
// up two processes that hold every slot with one idle connection each
// (and checked it); query runs a query in a third process with no
// connection of its own, whose wait publishes; givenBack counts the idle
// connections of the first two that closed.
func OneNoticeOneGiveBack(t *testing.T, name string, query func(context.Context) error, givenBack func() int64) {
	t.Helper()
	ctx := redistest.Ctx(t, 30*time.Second)
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
	waitSubscribed(t, ctx, client, channel, 3)
	time.Sleep(IdleAge)

	if err := query(ctx); err != nil {
		t.Fatalf("the third process's query: %v", err)
	}
	// A second give-back for the same notice would follow the first at
	// once; give it a second to show.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && givenBack() <= notices.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	n, g := notices.Load(), givenBack()
	t.Logf("%d demand notices, %d idle connections given back", n, g)
	if n == 0 {
		t.Fatalf("the third process got a slot but no demand notice was seen (%d given back): the case needs its wait to publish", g)
	}
	if g == 0 {
		t.Fatalf("%d demand notices and no idle connection given back, yet the third process's query ran", n)
	}
	if g > n {
		t.Fatalf("%d demand notices, %d idle connections given back: a notice was answered by more than one process", n, g)
	}
}

// waitSubscribed waits until channel has n subscribers (the two holding
// processes' and the test's own).
func waitSubscribed(t *testing.T, ctx context.Context, client *redis.Client, channel string, n int64) {
	t.Helper()
	redistest.WaitFor(t, 10*time.Second, "the processes holding the slots subscribed to demand notices", func() (bool, error) {
		m, err := client.PubSubNumSub(ctx, channel).Result()
		return m[channel] >= n, err
	})
}

// CheckMost fails the test if more than limit connections were open at
// once, by the client's count (opened: connections or sockets) or by
// PostgreSQL's (pg, from pg_stat_activity), and logs both.
func CheckMost(t *testing.T, limit int, opened, pg int64) {
	t.Helper()
	t.Logf("most open at once: %d by the client, %d in pg_stat_activity", opened, pg)
	if opened > int64(limit) {
		t.Errorf("%d connections were open at once; the limit is %d", opened, limit)
	}
	if pg > int64(limit) {
		t.Errorf("PostgreSQL saw %d connections at once; the limit is %d", pg, limit)
	}
}

// Watch samples count (the backends PostgreSQL serves a test's pools)
// every 2 ms until stop is called, which returns the most seen at once. It
// samples rather than loops: a loop of queries took a core of a 2-core
// machine from the pools it watched.
func Watch(t testing.TB, count func(context.Context) (int, error)) (stop func() int64) {
	t.Helper()
	ctx := redistest.Ctx(t, 2*time.Minute)
	var most int64
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			n, err := count(ctx)
			if err != nil {
				done <- err
				return
			}
			most = max(most, int64(n))
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(quit)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return most
	}
}

// Recording is a real semaphore that remembers the leases it granted, so
// that tests can wait for their loss.
type Recording struct {
	redsem.Semaphore
	mu     sync.Mutex
	leases []redsem.Lease
}

// Acquire is the semaphore's, remembering the lease.
func (r *Recording) Acquire(ctx context.Context) (redsem.Lease, error) {
	l, err := r.Semaphore.Acquire(ctx)
	if err == nil {
		r.mu.Lock()
		r.leases = append(r.leases, l)
		r.mu.Unlock()
	}
	return l, err
}

// TryAcquire is the semaphore's, remembering the lease.
func (r *Recording) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	l, err := r.Semaphore.TryAcquire(ctx)
	if err == nil {
		r.mu.Lock()
		r.leases = append(r.leases, l)
		r.mu.Unlock()
	}
	return l, err
}

// Granted returns the leases granted so far.
func (r *Recording) Granted() []redsem.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]redsem.Lease(nil), r.leases...)
}

// CheckFresh fails the test unless the semaphore's holders are exactly the
// open connections (open, by the pool's count, and opened, by the
// client's), every one a live lease granted after the first lost ones.
func CheckFresh(t *testing.T, ctx context.Context, sem *Recording, lost int, open int, opened int64) {
	t.Helper()
	st, err := sem.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != open || open < 1 || opened != int64(open) {
		t.Fatalf("%d holders, %d connections in the pool, %d open by the client; want equal and > 0",
			len(st.Holders), open, opened)
	}
	fresh := sem.Granted()[lost:]
	for _, h := range st.Holders {
		found := false
		for _, l := range fresh {
			if l.ID() == h.ID && l.Err() == nil {
				found = true
			}
		}
		if !found {
			t.Fatalf("holder %s is not a fresh, live lease", h.ID)
		}
	}
}

// LoseAll deletes every Redis key of the semaphore name (default prefix)
// and waits until each of leases has found itself lost (at its next
// renewal).
func LoseAll(t *testing.T, ctx context.Context, name string, leases []redsem.Lease) {
	t.Helper()
	client := redistest.Client(t)
	keys, err := client.Keys(ctx, "redsem:{"+name+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("the semaphore's keys to delete: %v, %v", keys, err)
	}
	if err := client.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lease not found lost within 5s of deleting the keys")
		}
		if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
			t.Fatalf("lease err %v", l.Err())
		}
	}
}

// Share runs workers goroutines per pool, each running its pool's query
// back to back (each given QueryTimeout), until every pool has run want
// queries, ctx ends or a query fails; a pool that has run its want stops,
// and its connections go idle. It returns how many queries each pool ran
// and the first failure (ctx's error if it ended first).
func Share(ctx context.Context, queries []func(context.Context) error, workers int, want int64) ([]int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ran := make([]atomic.Int64, len(queries))
	var wg sync.WaitGroup
	for i, query := range queries {
		for range workers {
			wg.Go(func() {
				for ctx.Err() == nil && ran[i].Load() < want {
					qctx, qcancel := context.WithTimeout(ctx, QueryTimeout)
					err := query(qctx)
					qcancel()
					if err != nil {
						if ctx.Err() == nil {
							cancel(fmt.Errorf("a query of pool %d: %w", i, err))
						}
						return
					}
					ran[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	out := make([]int64, len(queries))
	for i := range ran {
		out[i] = ran[i].Load()
	}
	return out, context.Cause(ctx)
}

// Bench runs b.N queries over workers goroutines per pool (queries: each
// pool's), and reports q/s (queries a second, all pools), dials/kq (new
// connections per 1000 queries, by dials' count) and min-share (the least
// served pool's queries over an even share: 1 even, 0 starved).
func Bench(b *testing.B, queries []func(context.Context) error, workers int, dials func() int64) {
	ctx := redistest.Ctx(b, 5*time.Minute)
	var left atomic.Int64
	left.Store(int64(b.N))
	ran := make([]atomic.Int64, len(queries))
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, query := range queries {
		for range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					qctx, cancel := context.WithTimeout(ctx, QueryTimeout)
					err := query(qctx)
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
					ran[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	least := int64(b.N)
	for i := range ran {
		least = min(least, ran[i].Load())
	}
	b.ReportMetric(float64(b.N)/took.Seconds(), "q/s")
	b.ReportMetric(float64(dials())*1000/float64(b.N), "dials/kq")
	b.ReportMetric(float64(least)*float64(len(queries))/float64(b.N), "min-share")
}
