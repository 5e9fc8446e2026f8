package fair_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Many goroutines on several Semaphore instances (separate sessions)
// acquire, hold briefly and release, some with TryAcquire and some giving up
// after a short wait. The recorded holds never exceed the limit at any
// instant, slots are unique among overlapping holds, tokens unique and
// increasing in real time, and nothing is left behind.
func TestHammerSafety(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	name := redistest.Name(t)
	const limit, workers, instances = 3, 16, 4
	run := 2 * time.Second
	if testing.Short() {
		run = 500 * time.Millisecond
	}
	var sems []*fair.Semaphore
	for i := 0; i < instances; i++ {
		sems = append(sems, newSem(t, redistest.Client(t), name, limit, fair.Options{}))
	}

	var mu sync.Mutex
	var holds []interval
	var tries, noSlot, gaveUp int
	var wg sync.WaitGroup
	stop := time.Now().Add(run)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(s *fair.Semaphore) {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				called := time.Now()
				var l redsem.Lease
				var err error
				switch r := rand.IntN(8); {
				case r == 0:
					l, err = s.TryAcquire(ctx)
					mu.Lock()
					tries++
					if errors.Is(err, redsem.ErrNoSlot) {
						noSlot++
						err = nil
					}
					mu.Unlock()
				case r == 1:
					// Give up soon: exercises cancellation at every stage.
					wctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
					l, err = s.Acquire(wctx)
					cancel()
					if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
						mu.Lock()
						gaveUp++
						mu.Unlock()
						err = nil
					}
				default:
					l, err = s.Acquire(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if l == nil {
					continue
				}
				start := time.Now()
				time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
				end := time.Now()
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
					return
				}
				done := time.Now()
				mu.Lock()
				holds = append(holds, interval{l.ID(), l.Slot(), l.Token(), called, start, end, done})
				mu.Unlock()
			}
		}(sems[w%instances])
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	checkIntervals(t, limit, holds)
	t.Logf("%d TryAcquire (%d ErrNoSlot), %d Acquire gave up", tries, noSlot, gaveUp)
	if len(holds) < workers {
		t.Fatalf("only %d holds in %v", len(holds), run)
	}
	c := redistest.Client(t)
	checkClean(t, ctx, c, name)
	// No slot leaked: all limit slots can be taken at once.
	for i := 0; i < limit; i++ {
		l, err := sems[0].TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire %d after the hammer: %v", i, err)
		}
		defer func() { _ = l.Release(ctx) }()
	}
}
