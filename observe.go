package redsem

import "time"

// EventKind says what an Event reports.
type EventKind int

// The events a semaphore reports to its Observer.
const (
	// EventAcquired: a lease was granted. Wait is the time Acquire (or
	// TryAcquire) took; LeaseID, Slot and Token are set.
	EventAcquired EventKind = iota + 1
	// EventReleased: a lease was released. Hold is the time from the grant to
	// the Release call.
	EventReleased
	// EventLeaseLost: a lease expired or was removed before its release
	// (found by the watchdog, Renew or Release). Hold is as for EventReleased.
	EventLeaseLost
	// EventWaiterEvicted: a fair waiter found that its queue entry was evicted
	// (its process missed heartbeats for QueueTTL); it queues again.
	EventWaiterEvicted
	// EventAcquireTimedOut: Acquire gave up because its context ended. Wait
	// is how long it waited; Err is the error Acquire returned.
	EventAcquireTimedOut
	// EventLimitMismatch: Acquire or TryAcquire was refused because this
	// client's limit differs from the one live clients established (Err is
	// a *LimitMismatchError), or its rate (a *RateMismatchError), or, for a
	// family member, its total (see ErrLimitMismatch). Err matches
	// ErrLimitMismatch.
	EventLimitMismatch
	// EventEvictionPolicy: the Redis server's maxmemory-policy (in Policy)
	// may evict the semaphore's keys; "noeviction" is recommended. When the
	// server refused to tell (CONFIG GET not allowed: ACLs, managed Redis),
	// Policy is empty and Err says why.
	EventEvictionPolicy
	// EventAcquireFailed: Acquire or TryAcquire failed with a Redis error (in
	// Err).
	EventAcquireFailed
	// EventUnavailable: Acquire or TryAcquire gave up because Redis could
	// not be reached (a failed dial, a refused or dropped connection, a
	// server loading its data): Err matches ErrUnavailable. Wait is how long
	// the call took. A call whose context ended while Redis was merely slow
	// reports EventAcquireTimedOut instead.
	EventUnavailable
	// EventResumed: Resume made a lease of this process out of one granted
	// elsewhere (another process, or another semaphore value of the same
	// name); LeaseID, Slot and Token are set. Its end reports
	// EventReleased or EventLeaseLost, as any lease's does.
	EventResumed
)

var eventNames = map[EventKind]string{
	EventAcquired:        "acquired",
	EventReleased:        "released",
	EventLeaseLost:       "lease_lost",
	EventWaiterEvicted:   "waiter_evicted",
	EventAcquireTimedOut: "acquire_timed_out",
	EventLimitMismatch:   "limit_mismatch",
	EventEvictionPolicy:  "eviction_policy",
	EventAcquireFailed:   "acquire_failed",
	EventUnavailable:     "unavailable",
	EventResumed:         "resumed",
}

// String returns the event kind in snake_case, as used in logs and metrics.
func (k EventKind) String() string {
	if s, ok := eventNames[k]; ok {
		return s
	}
	return "unknown"
}

// Event is one thing a semaphore reports. Fields that do not apply to a
// kind are zero.
type Event struct {
	Kind EventKind
	Name string // the semaphore's name (a family member's: its key)
	// Family is the family's name for an event of a member of a keyed
	// family (fair.Family, unfair.Family), whose Name is the member's key;
	// empty for a semaphore of its own. Count and label by it, not by Name,
	// to keep one series per family (as redsemprom does).
	Family  string
	LeaseID string
	Slot    int
	Token   int64
	Wait    time.Duration // EventAcquired, EventAcquireTimedOut
	Hold    time.Duration // EventReleased, EventLeaseLost
	Policy  string        // EventEvictionPolicy
	Err     error
}

// Observer receives a semaphore's events, synchronously, on the goroutine
// where they happen: it must be fast and must not block (hand off to a
// channel if it needs to). A nil Observer costs nothing.
type Observer func(Event)
