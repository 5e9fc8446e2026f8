package core

import (
	"context"
	"math/rand/v2"
	"time"
)

// The engine's time bounds, in one place: how long a call or the work it
// leaves behind may take when Redis is slow or away, and how requests are
// paced while it is. Each says what it bounds; the release that a user's
// code makes after it is done (Do, the middleware, a pool connection) has
// its bound in package detach (detach.Timeout).

// closeUndoBound bounds the undo that a fair waiter ended by Close runs
// before its call returns (a Redis that does not answer leaves the entry to
// be evicted with the session, which the closed hub no longer renews).
const closeUndoBound = 250 * time.Millisecond

// shutdownBound bounds how long shutdown (and so Close) waits for the hub's
// goroutines: a subscription that go-redis is still setting up against a
// Redis that does not answer ignores its context until the client's read
// timeout; it then finds the hub closed and ends on its own.
const shutdownBound = 200 * time.Millisecond

// cancelCallBound bounds the background run that cancels a setting whose
// caller gave up without a deadline (setCall).
const cancelCallBound = 5 * time.Second

// replicaUndoBound bounds the release of a grant that too few replicas
// acknowledged (confirmReplicas), within the caller's context while it
// runs, detached once it ended.
const replicaUndoBound = 2 * time.Second

// dialStale is how long before a call a failed dial still says that Redis
// cannot be reached during it, when no dial succeeded since: once its dials
// keep failing, go-redis stops dialing for each command (it hands back the
// last dial error) and dials again in the background, about once a second,
// so a short call may see no dial of its own.
const dialStale = 2 * time.Second

// libRetry is how long a client waits before trying to load the library
// again after a load failed for a reason other than a refusal (Redis
// unreachable, a timeout).
const libRetry = 10 * time.Second

// libLoadTimeout bounds a background FUNCTION LOAD.
const libLoadTimeout = 5 * time.Second

// settingMargin is the margin (ms) of a setting's refuse_after (setCall):
// a SetLimit, SetRate or SetTotal that reaches Redis more than this after
// its caller's deadline changes nothing. Small, since a refusal while the
// caller still waits (a server clock stepped forward) is asked again.
const settingMargin = 50

// releaseBound bounds the give-up of a lease that ended lost (its deadline
// passed, MaxHold): release.lua's expire mode, run in the background after
// Done closed; nobody waits for it, and what it could not do the lease's
// Redis deadline does.
func (e *Engine) releaseBound() time.Duration {
	return min(100*time.Millisecond, max(e.cfg.LeaseTTL/10, time.Millisecond))
}

// acquireMargin is the margin (ms) of an acquire's refuse_after (refuseAfter):
// a second, for the clocks' drift.
const acquireMargin = 1000

// backoff paces the tries of a request that failed transiently: 20 ms,
// doubling up to a second, each pause spread by jitter.
type backoff struct{ d time.Duration }

// next returns the pause before the next try.
func (b *backoff) next() time.Duration {
	b.d = min(max(2*b.d, 20*time.Millisecond), time.Second)
	return jitter(b.d)
}

// jitter spreads d over [0.5d, 1.5d) so that clients that failed together do
// not retry together.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// sleepCtx waits d, or until ctx ends; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
