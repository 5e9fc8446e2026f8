package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A holder cut off from Redis (a black hole) while it holds, with
// auto-renewal: its renewals fail, and at its Deadline the lease gives
// itself up. Deadline() is never after the deadline Redis keeps (the
// margin is the request's way to Redis, and a millisecond). The lease's
// Context (and so the context redsem.Do gives fn) must end at Deadline(),
// before the lease's last release attempt: that release may free the slot
// for its next holder. Done closes after it. Until the fix both ended
// together, after the release into the black hole had given up
// (min(100 ms, LeaseTTL/10)): by then Redis had handed the slot on, and a
// holder that watched its context worked on beside the slot's next holder
// (measured: 67-99 ms). The assertion is an order, not a time: Done closes
// at least the release's bound after the context ended (a timeout never
// fires early), which the old order never showed.
func TestCutOffLeaseContextEndsAtDeadline(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			p, viaProxy, direct := proxied(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			s := v.new(t, viaProxy, name, 1, opts{LeaseTTL: time.Second, QueueTTL: time.Second})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			redisMs, err := direct.ZScore(ctx, core.KeysFor(core.DefaultPrefix, name).List[core.KeyHolders], l.ID()).Result()
			if err != nil {
				t.Fatal(err)
			}
			p.SetBlackhole(true)
			<-l.Context().Done()
			ended := time.Now()
			<-l.Done()
			doneAfter := time.Since(ended)
			if !errors.Is(context.Cause(l.Context()), redsem.ErrLeaseLost) {
				t.Fatalf("the lease's context ended with %v, want ErrLeaseLost", context.Cause(l.Context()))
			}
			dl := l.Deadline()
			t.Logf("Deadline() %.1f ms before Redis's deadline; the lease's context ended %.1f ms after Deadline(), Done %.1f ms after that",
				float64(int64(redisMs)*1000-dl.UnixMicro())/1000, float64(ended.Sub(dl).Microseconds())/1000,
				float64(doneAfter.Microseconds())/1000)
			if ended.Before(dl) {
				t.Errorf("the lease's context ended %v before Deadline()", dl.Sub(ended))
			}
			// The release into the black hole waits its whole bound
			// (min(100 ms, LeaseTTL/10) = 100 ms here) after the context ended.
			if doneAfter < 90*time.Millisecond {
				t.Errorf("Done closed %v after the lease's context: the context waited for the release attempt", doneAfter)
			}
		})
	}
}
