package redsem_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Released-lease bookkeeping stays bounded under steady load: whatever a
// release leaves in Redis (a tombstone so that a re-sent Release still
// reports success, say) is pruned once the lease's deadline has passed, so
// the semaphore's keys hold at most what the releases of the last LeaseTTL
// may keep, not one entry per release ever made.
//
// The bound. A lease granted by a TryAcquire that returned at time a has a
// deadline no later than a + LeaseTTL (the grant happened before the reply
// came back). Whatever its release keeps may be kept until that deadline,
// so at a measurement made just after the last release (at time e), only
// the cycles whose TryAcquire returned after e - LeaseTTL may still have
// something in Redis. We allow two members for each (a record and the
// entry that indexes it for pruning), for those cycles and the releases of
// another pruneSlack (an engine may prune lazily or keep a safety margin; a
// loaded machine delays replies), plus fixedMembers for everything that
// does not grow with releases (limit, meta, sessions, live holders). The
// cycles are paced so that a run spans many windows: the 4000 cycles take
// at least 2.7 s while the window is LeaseTTL + pruneSlack = 0.6 s, so the
// bound is at most about 1 800 + 64 members (fewer on a slow machine, whose
// releases are fewer per window too), and an engine that never prunes
// keeps one or two entries per release: 4000-8000 members at the end, far
// above it (and about four times what it kept after 1000 cycles, which the
// memory check catches too).
func TestReleasedLeaseBookkeepingBounded(t *testing.T) {
	const (
		ttl          = 200 * time.Millisecond
		pruneSlack   = 400 * time.Millisecond
		fixedMembers = 64
		// membersPerRelease is what one release may keep until pruned: an
		// engine may keep a record and an index entry for it.
		membersPerRelease = 2
		firstCycles       = 1000
		totalCycles       = 4000
		rate              = 1500 // cycles per second at most, over all workers
		workers           = 4    // each with its own client and semaphore object
		limit             = workers
	)
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			o := prefixed{Prefix: uniquePrefix(), LeaseTTL: ttl, DisableAutoRenew: true}
			inspect := redistest.Client(t)

			var (
				mu       sync.Mutex
				acquired []time.Time // when each cycle's TryAcquire returned
				lastRel  time.Time   // when the latest Release was called
				next     atomic.Int64
				start    = time.Now()
			)
			sems := make([]redsem.Semaphore, workers)
			for w := range sems {
				sems[w] = newPrefixed(t, variant, redistest.Client(t), name, limit, o)
			}
			run := func(upTo int64) {
				var wg sync.WaitGroup
				for _, s := range sems {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1)
							if i > upTo {
								return
							}
							// Pacing, not synchronisation: cycle i starts no
							// earlier than i/rate seconds into the run.
							if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
								time.Sleep(d)
							}
							l, err := s.TryAcquire(ctx)
							if err != nil {
								t.Errorf("cycle %d: TryAcquire: %v", i, err)
								return
							}
							got := time.Now()
							mu.Lock()
							acquired = append(acquired, got)
							if now := time.Now(); now.After(lastRel) {
								lastRel = now
							}
							mu.Unlock()
							// A loaded machine may delay a cycle past the
							// short TTL: that lease expired (no tombstone),
							// which the bound allows.
							if err := l.Release(ctx); err != nil && !errors.Is(err, redsem.ErrLeaseLost) {
								t.Errorf("cycle %d: Release: %v", i, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				if t.Failed() {
					t.FailNow()
				}
			}
			// allowed is the bound above for a measurement after the run so far.
			allowed := func() int {
				mu.Lock()
				defer mu.Unlock()
				from := lastRel.Add(-ttl - pruneSlack)
				n := 0
				for _, a := range acquired {
					if a.After(from) {
						n++
					}
				}
				// A released lease may keep two members (its record and the
				// entry that indexes it for pruning).
				return membersPerRelease*n + fixedMembers
			}

			run(firstCycles)
			first, firstAllowed := measure(ctx, t, inspect, o.Prefix), allowed()
			firstAt := time.Since(start)
			run(totalCycles)
			last, lastAllowed := measure(ctx, t, inspect, o.Prefix), allowed()
			t.Logf("after %d cycles (%.1fs): %d keys, %d members, %d bytes (bound %d members)",
				firstCycles, firstAt.Seconds(), first.keys, first.members, first.bytes, firstAllowed)
			t.Logf("after %d cycles (%.1fs): %d keys, %d members, %d bytes (bound %d members)",
				totalCycles, time.Since(start).Seconds(), last.keys, last.members, last.bytes, lastAllowed)

			if last.members > lastAllowed {
				t.Errorf("after %d releases the keys hold %d members, more than the %d that the releases of the last %v (+%v slack) may keep: released leases are not pruned",
					totalCycles, last.members, lastAllowed, ttl, pruneSlack)
			}
			// Memory: the second measurement is three times as many
			// releases later; unpruned bookkeeping would have grown about
			// fourfold, bounded bookkeeping stays about the same. The
			// allowance scales with the bounds, in case the machine ran
			// the second phase faster (more releases per window).
			scale := max(1, float64(lastAllowed)/float64(firstAllowed))
			if limit := int64(2*scale*float64(first.bytes)) + 16<<10; last.bytes > limit {
				t.Errorf("memory grew from %d bytes after %d releases to %d after %d (more than %d): it grows with the releases ever made",
					first.bytes, firstCycles, last.bytes, totalCycles, limit)
			}
		})
	}
}
