// Package bounds is redsem's one table of time bounds: how long a call, or
// the work it leaves behind, may take when Redis is slow or away, how the
// requests that failed are paced while it is, and the pace of the engine's
// periodic requests (renewals, heartbeats). Every package of the
// module takes its bounds from here (the engine, Do, the HTTP middleware
// and transport, the connection pools, the metrics packages), so that
// each is said once, with what it bounds.
//
// The defaults of the options (LeaseTTL, QueueTTL, Fallback,
// ReplicaTimeout, a pool's ConnectTimeout and MinHold) live with their
// options; the pacing of the pools' demand protocol lives with it
// (internal/connslots).
//
// It imports nothing of redsem (the root package may use it too).
package bounds

import (
	"context"
	"math/rand/v2"
	"time"
)

// Releases that a user's code makes after it is done with a lease.
const (
	// Release bounds every release that its caller does not bound itself
	// (detach.Release): Do after fn returns, the middleware's and the
	// transport's default ReleaseTimeout.
	Release = 5 * time.Second
	// ConnRelease bounds how long a pool connection's close waits for its
	// lease's release: database/sql and pgx close connections on their
	// callers' goroutines and without a context (a query that meets a
	// connection past its lifetime, sql.DB.Close one connection after
	// another). Past it the lease lets go and its release goes on in the
	// background (Lease.Release), the slot back then, or at the lease's
	// deadline.
	ConnRelease = 50 * time.Millisecond
	// ConnReleaseStall is how long after a release outlasted ConnRelease a
	// pool's next closing connections do not wait for theirs at all (they
	// go on in the background): a pool closing many connections while
	// Redis stalls waits ConnRelease once, not once per connection.
	ConnReleaseStall = time.Second
	// ReplicaUndo bounds the release of a grant that too few replicas
	// acknowledged (the engine's confirmReplicas), within the caller's
	// context while it runs, detached once it ended.
	ReplicaUndo = 2 * time.Second
)

// The engine's own calls and the work they leave behind.
const (
	// CloseUndo bounds the undo that a fair waiter ended by Close runs
	// before its call returns (a Redis that does not answer leaves the
	// entry to be evicted with the session, which the closed hub no longer
	// renews).
	CloseUndo = 250 * time.Millisecond
	// Shutdown bounds how long a hub's shutdown (and so Close) waits for
	// the hub's goroutines: a subscription that go-redis is still setting
	// up against a Redis that does not answer ignores its context until
	// the client's read timeout; it then finds the hub closed and ends on
	// its own.
	Shutdown = 200 * time.Millisecond
	// Subscribe bounds a hub's subscription (ended by its shutdown too):
	// Close must not wait for a Redis that does not answer.
	Subscribe = 5 * time.Second
	// HubIdle is the least time a hub left without waiters stays
	// subscribed (at least a heartbeat interval), so that a call that
	// comes right after finds it listening.
	HubIdle = 500 * time.Millisecond
	// BeatSlack is what a fair session's heartbeat may take beyond its
	// interval before it is given up (ended by the hub's shutdown too).
	BeatSlack = time.Second
	// ReleaseJoin is the longest a holder's release waits for the release
	// call of its semaphore that its process has in flight, to go in the
	// next call with the others that wait (core's releases.go): a call
	// that Redis does not answer (its connection gone dead) holds the
	// releases behind it no longer than this; they then go in a call of
	// their own, on another connection.
	ReleaseJoin = 5 * time.Millisecond
	// RunnerIdle is how long a goroutine that ran a request (the engine's
	// reused runners, core/wire/door.go) waits for its next one before it ends: well
	// under the two seconds a goroutine-leak check waits for goroutines to
	// end.
	RunnerIdle = 500 * time.Millisecond
	// CancelCall bounds the background run that cancels a setting
	// (SetLimit, SetRate, SetTotal) whose caller gave up without a
	// deadline.
	CancelCall = 5 * time.Second
	// PolicyCheck bounds the background read of maxmemory-policy at a
	// semaphore's first acquire (and MaxMemoryPolicy's wait for it).
	PolicyCheck = time.Second
	// LibRetry is how long a client waits before trying to load the
	// FUNCTION library again after a load failed for a reason other than a
	// refusal (Redis unreachable, a timeout).
	LibRetry = 10 * time.Second
	// LibLoad bounds a background FUNCTION LOAD.
	LibLoad = 5 * time.Second
	// AlertEvery is how often a lasting condition (Redis unreachable, an
	// evicting maxmemory-policy) is logged again while it lasts.
	AlertEvery = time.Minute
	// DialStale is how long before a call a failed dial still says that
	// Redis cannot be reached during it, when no dial succeeded since:
	// once its dials keep failing, go-redis stops dialing for each command
	// (it hands back the last dial error) and dials again in the
	// background, about once a second, so a short call may see no dial of
	// its own.
	DialStale = 2 * time.Second
)

// ExpireRelease bounds the give-up of a lease that ended lost (its
// deadline passed, MaxHold): release.lua's expire mode, run in the
// background after Done closed; nobody waits for it, and what it could not
// do the lease's Redis deadline does. A tenth of the lease's TTL, within
// [1ms, 100ms].
func ExpireRelease(leaseTTL time.Duration) time.Duration {
	return min(100*time.Millisecond, max(leaseTTL/10, time.Millisecond))
}

// The pace of the engine's periodic requests, from the options.

// RenewEvery is how often a lease is renewed: after a third of its TTL, so
// that two renewals may fail before it is lost.
func RenewEvery(leaseTTL time.Duration) time.Duration { return leaseTTL / 3 }

// RenewWindow is how early a lease is renewed together with others: those
// whose renewal falls due within it (half of RenewEvery). Less than a whole
// interval, so that the leases a batch just renewed are not due again at
// once.
func RenewWindow(leaseTTL time.Duration) time.Duration { return leaseTTL / 6 }

// RenewBy is when a renewal call of the watchdog for a lease whose
// deadline is deadline gives up waiting for its reply, at the latest: a
// renewal window (RenewWindow) before the deadline, so that the leases of a
// call Redis does not answer (its connection gone dead, and no ReadTimeout,
// or a longer one) are renewed again, in a new call on another connection,
// before their deadline, instead of all waiting for it; or at the deadline
// when less than two windows are left (a renewal being retried). A reply
// abandoned this way changes nothing that matters: Redis only moved the
// deadlines later.
func RenewBy(now, deadline time.Time, leaseTTL time.Duration) time.Time {
	w := RenewWindow(leaseTTL)
	if by := deadline.Add(-w); by.Sub(now) >= w {
		return by
	}
	return deadline
}

// Heartbeat is how often a fair session heart-beats: three times per
// QueueTTL, and at least as often as the fallback bound.
func Heartbeat(queueTTL, fallback time.Duration) time.Duration {
	return min(queueTTL/3, fallback)
}

// RenewRetry is how soon an automatic renewal that could not reach Redis
// is tried again (until the lease's deadline passes): a tenth of the
// lease's TTL, within [1ms, 1s].
func RenewRetry(leaseTTL time.Duration) time.Duration {
	return max(min(leaseTTL/10, time.Second), time.Millisecond)
}

// Margins (ms) of the refuse_after that a request carries: a request that
// reaches Redis more than this after its caller's deadline changes
// nothing.
const (
	// AcquireMargin is an acquire's: a second, for the clocks' drift.
	AcquireMargin = 1000
	// SettingMargin is a SetLimit's, SetRate's or SetTotal's: small, since
	// a refusal while the caller still waits (a server clock stepped
	// forward) is asked again.
	SettingMargin = 50
)

// The pools' (internal/connslots) and the metrics packages' bounds.
const (
	// PoolClose bounds how long a pool's Close waits for its demand
	// subscription to end.
	PoolClose = 100 * time.Millisecond
	// StatusRead bounds the Status read of one metrics collection
	// (redsemotel; redsemprom's default Timeout).
	StatusRead = 2 * time.Second
)

// Backoff paces the tries of a request that failed transiently: 20 ms,
// doubling up to a second, each pause spread by jitter. The zero value
// starts at 20 ms; a Backoff is owned by one goroutine.
type Backoff struct{ d time.Duration }

// Next returns the pause before the next try.
func (b *Backoff) Next() time.Duration {
	b.d = min(max(2*b.d, 20*time.Millisecond), time.Second)
	return Jitter(b.d, 0.5)
}

// Wait waits the pause before the next try, or until ctx ends; false when
// ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	return Sleep(ctx, b.Next())
}

// Jitter spreads d over [(1-spread)d, (1+spread)d) so that clients that
// failed (or woke) together do not try again together.
func Jitter(d time.Duration, spread float64) time.Duration {
	return time.Duration(float64(d) * (1 - spread + 2*spread*rand.Float64()))
}

// Sleep waits d, or until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
