package unfair_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

func newSem(t *testing.T, limit int, opts unfair.Options) *unfair.Semaphore {
	t.Helper()
	s, err := unfair.New(redistest.Client(t), redistest.Name(t), limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestTryAcquireUpToLimit(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	s := newSem(t, 3, unfair.Options{})
	var leases []redsem.Lease
	slots := map[int]bool{}
	var last int64
	for i := 0; i < 3; i++ {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if slots[l.Slot()] || l.Slot() < 0 || l.Slot() >= 3 {
			t.Fatalf("slot %d reused or out of range (have %v)", l.Slot(), slots)
		}
		slots[l.Slot()] = true
		if l.Token() <= last {
			t.Fatalf("token %d not above %d", l.Token(), last)
		}
		last = l.Token()
		leases = append(leases, l)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("4th TryAcquire: got %v, want ErrNoSlot", err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 3 || len(st.Holders) != 3 || len(st.Waiters) != 0 {
		t.Fatalf("status %+v", st)
	}
	if err := leases[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leases[1].Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	select {
	case <-leases[1].Done():
	default:
		t.Fatal("Done not closed after release")
	}
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Slot() != leases[1].Slot() {
		t.Fatalf("freed slot %d not reused, got %d", leases[1].Slot(), l.Slot())
	}
	if l.Token() <= last {
		t.Fatal("token did not increase")
	}
}

func TestAcquireWakesOnRelease(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	s := newSem(t, 1, unfair.Options{FallbackInterval: 5 * time.Second})
	l1, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan redsem.Lease)
	go func() {
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// The waiter subscribes to the semaphore's wake-up channel once its
	// first attempt found no slot: wait until Redis shows the subscription,
	// so that the release below is one the waiter must be woken for.
	admin := redistest.Client(t)
	redistest.WaitFor(t, 5*time.Second, "the waiter to subscribe", func() (bool, error) {
		// SUBSCRIBE outside a cluster, SSUBSCRIBE on one.
		chans, err := admin.PubSubChannels(ctx, "*"+s.Name()+"*").Result()
		if err != nil || len(chans) > 0 {
			return len(chans) > 0, err
		}
		chans, err = admin.PubSubShardChannels(ctx, "*"+s.Name()+"*").Result()
		return len(chans) > 0, err
	})
	released := time.Now()
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	// The fallback is 5s: getting the slot well before it proves the
	// release notice woke the waiter.
	if d := time.Since(released); d > 2*time.Second {
		t.Fatalf("waiter took %v to get a released slot", d)
	}
	_ = l2.Release(ctx)
}

func TestAcquireCancelLeavesNothing(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	s := newSem(t, 1, unfair.Options{})
	l1, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(cctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	st, _ := s.Status(ctx)
	if len(st.Holders) != 1 || st.Holders[0].ID != l1.ID() {
		t.Fatalf("status after cancel: %+v", st)
	}
}

func TestHammerNeverExceedsLimit(t *testing.T) {
	ctx := redistest.Ctx(t, 60*time.Second)
	const limit, workers, rounds = 3, 12, 15
	s := newSem(t, limit, unfair.Options{})
	var cur, peak atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				err := redsem.Do(ctx, s, func(ctx context.Context, l redsem.Lease) error {
					n := cur.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					time.Sleep(time.Millisecond)
					cur.Add(-1)
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p < 1 {
		t.Fatalf("peak concurrent holders %d, limit %d", p, limit)
	}
}

// scriptCalls returns how many scripts the server has run (EVALSHA, EVAL
// and FCALL).
func scriptCalls(t *testing.T, ctx context.Context, c interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}) int64 {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				var n int64
				fmt.Sscanf(rest, "calls=%d", &n)
				total += n
			}
		}
	}
	return total
}

// Blocked waiters do not poll Redis: with the slot held and no release,
// each waiter runs about one attempt per FallbackInterval, not hundreds.
func TestWaitersDoNotHammerRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	const waiters, fallback, window = 5, 200 * time.Millisecond, time.Second
	s, err := unfair.New(c, redistest.Name(t), 1, unfair.Options{FallbackInterval: fallback, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	before := scriptCalls(t, ctx, c)
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("waiter: %v", err)
			}
		}()
	}
	wg.Wait()
	calls := scriptCalls(t, ctx, c) - before
	// Per waiter: two attempts around the subscription, then one per
	// fallback period (jitter down to 0.8x), and the undo on give-up.
	periods := int64(window / (fallback * 8 / 10)) // fallback with the lowest jitter
	limit := waiters * (2 + periods + 1 + 2)
	if calls > limit {
		t.Fatalf("%d script calls by %d waiters in %v, want <= %d", calls, waiters, window, limit)
	}
	if calls < waiters {
		t.Fatalf("%d script calls: the waiters did not try at all", calls)
	}
	_ = l.Release(ctx)
}
