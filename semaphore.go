package redsem

import (
	"context"
	"time"
)

// Semaphore bounds how many holders use a shared resource at once, across
// goroutines, processes and machines.
type Semaphore interface {
	// Acquire blocks until a slot is granted or ctx ends. On ctx end it
	// returns an error that satisfies errors.Is(err, ctx.Err()) and leaves
	// nothing behind in Redis (no queue entry, no slot).
	Acquire(ctx context.Context) (Lease, error)
	// TryAcquire makes one attempt and never waits. When no slot can be
	// granted now it returns ErrNoSlot. For the fair variant a TryAcquire
	// never jumps the queue: with live waiters queued it returns ErrNoSlot.
	// With Redis down it returns once a dial of its client fails (an error
	// matching ErrUnavailable), without waiting for go-redis to dial again
	// or retry; a host that does not answer fails a dial after the
	// client's DialTimeout, and on a cluster client go-redis's retries
	// (MaxRetries) run: bound those with the client's options or ctx.
	TryAcquire(ctx context.Context) (Lease, error)
	// Status reads the live state (expired holders and waiters not counted).
	Status(ctx context.Context) (Status, error)
	// SetLimit changes the limit for every client of this name at run time,
	// with no restart: once set, it overrides the limit that each client was
	// built with, and outlives idle periods (it is not lost when the
	// semaphore's other keys expire).
	SetLimit(ctx context.Context, limit int) error
	// SetRate sets the rate (see Rate) for every client of this name at run
	// time, as SetLimit sets the limit: it overrides the rate each client
	// was built with, and the zero Rate removes the bound. An invalid rate
	// returns a *ConfigError and changes nothing.
	SetRate(ctx context.Context, rate Rate) error
	// Name is the semaphore's name as given to New.
	Name() string
	// AcquireN takes n slots at once, all or nothing (a weighted acquire, as
	// x/sync/semaphore's Acquire(ctx, n)). Fair: strict arrival order
	// whatever the weight, so a waiter for n slots at the head is never
	// overtaken by smaller requests behind it. n < 1 or n above the limit
	// in force: an error matching ErrWeight at once, nothing left in Redis.
	AcquireN(ctx context.Context, n int) (Lease, error)
	// TryAcquireN is the non-blocking AcquireN (ErrNoSlot when it cannot
	// take n slots now; fair: never jumps the queue).
	TryAcquireN(ctx context.Context, n int) (Lease, error)
	// Close stops the semaphore's background work (wake-up subscription,
	// fair heartbeat); blocked Acquire calls return ErrClosed, as do later
	// Acquire, TryAcquire and Resume calls. Leases already granted keep
	// working; the background retries of failed releases end (their slots
	// come back at their Deadline).
	Close() error
	// Resume returns the live lease with that id (its ID()), granted by
	// any process: a lease handed on, e.g. from the process that acquired
	// it for a request to the worker that finishes the job. It renews the
	// lease at once and returns it as a lease of this process: renewed in
	// the background like any other (unless DisableAutoRenew), released
	// or lost the same way, with the same Token and Slots (the fence is
	// the grant's). Its Hold in events and MaxHold count from Resume. The
	// lease is one in Redis whatever the number of handles: a Release
	// through any of them frees its slots at once, and every other
	// handle, in this process or another, ends as released (Err nil) at
	// its next renewal, without errors; a handle that stops renewing
	// (DisableAutoRenew, MaxHold, its process exits) leaves the lease to
	// the others, and ends as lost at its own Deadline (it cannot tell a
	// release elsewhere from a loss without a renewal). A Resume that fails
	// after its request reached Redis (its context ended, Redis cut off
	// while the reply was on its way) may still have marked the lease
	// shared and renewed it there: it then lives in Redis until this
	// semaphore's LeaseTTL from then, though no handle of it is returned.
	// Resume of an id this semaphore holds already returns that same
	// lease, renewed, without the checks below (its handle exists). An id
	// with no live lease (released, also one this semaphore let go after a
	// Release that failed, expired, never granted, a queued waiter's)
	// returns an error matching ErrLeaseLost; an id that cannot be a
	// lease's (empty, too long, other characters than letters, digits and
	// '-') a *ConfigError (field "id"), at once. Neither leaves anything in
	// Redis. A member of a family whose client was built without a total,
	// while the family counts one, gets an error matching
	// ErrLimitMismatch and changes nothing (its renewals would not keep
	// the lease counted); so does a member whose client has the total, on
	// a lease the family does not count (granted, before it counted one,
	// by a client without one: its holders renew and release it without
	// the family's count). After Close it returns ErrClosed.
	Resume(ctx context.Context, id string) (Lease, error)
}

// Lease is one grant of one or more slots (see AcquireN).
type Lease interface {
	// ID is unique per acquisition (a UUID), never reused.
	ID() string
	// Slot is which of the limit's slots this lease holds, in [0, limit) at
	// the time of the grant: no two live leases share a slot.
	Slot() int
	// Token is the fencing token: strictly greater than every token issued
	// before it for this semaphore name, so also greater than every earlier
	// token of the same slot.
	Token() int64
	// Deadline is when the slot expires unless renewed (a local estimate,
	// taken before the request that set it was sent, so never late). A fair
	// lease handed over from the queue may report an earlier Deadline than
	// LeaseTTL until its first renewal: until then it lasts only as long as
	// its process's queue session.
	Deadline() time.Time
	// Renew extends the lease by its TTL. It returns ErrLeaseLost if the
	// lease is gone or its Deadline passed before Redis's answer came
	// (ErrReleased after its Release, also through another handle of the
	// lease: see Semaphore.Resume, and after a Release that failed); it
	// never re-creates a lost lease.
	Renew(ctx context.Context) error
	// Release frees the slot. It returns ErrLeaseLost if the slot was lost
	// before it; once a call returned nil or ErrLeaseLost, later calls
	// return nil. If it fails, the lease is let go all the same: it stays
	// held, not renewed (Renew returns ErrReleased), until its Deadline,
	// Release may be called again, and unless Redis answered with an error
	// (Redis unreachable, a timeout, ctx ended before or while the request
	// was on its way: it may have run, or may yet run) the release is
	// retried in the background until it succeeds (the lease then ends
	// released), the Deadline passes or the semaphore is closed (it then
	// ends lost at its Deadline, whether or not the release reached Redis). The releases of one
	// semaphore that a process makes while one of them is on its way to
	// Redis go together in its next request (each still answered for its
	// own lease); a release waits for the request in flight at most a few
	// milliseconds.
	Release(ctx context.Context) error
	// Done is closed once the lease is released (also through another
	// handle: see Semaphore.Resume) or lost.
	Done() <-chan struct{}
	// Err is nil while held or after Release (also through another
	// handle, learnt at this handle's next renewal: one that does not
	// renew ends lost at its Deadline); ErrLeaseLost once lost (also after
	// a Release that found the lease lost).
	Err() error
	// Slots is every slot the lease holds, ascending, len == its weight.
	// Slot() is Slots()[0].
	Slots() []int
	// Context is cancelled once the lease is lost (context.Cause is
	// ErrLeaseLost) or released (context.Canceled). A lease not renewed in
	// time is lost at its Deadline, in one moment: Context, Done and Err say
	// so together (also while a Renew or Release is in flight, whose reply
	// then changes nothing), before the lease gives its slots back in Redis
	// (in the background). Renew and Release never outlive the Deadline.
	Context() context.Context
}

// FamilyStatus is the total of a keyed family (fair.Family.Status,
// unfair.Family.Status) and its use.
type FamilyStatus struct {
	Total, Held int // the bound in force (0: none) and the slots held in all members
	Waiting     int // waiters in all members
}

// Status is a snapshot of a semaphore's live state.
type Status struct {
	Limit   int      // the limit in force (SetLimit's, else the established one)
	Holders []Holder // ordered by deadline
	Waiters []Waiter // fair only: in admission order; empty for unfair
	// Rate is the rate in force (SetRate's, else the one live clients
	// established); zero: none.
	Rate Rate
	// RateGranted is how many slots were granted in the window of length
	// Rate.Per that ends now (0 without a rate).
	RateGranted int
}

// Holder is one live lease as seen in Redis.
type Holder struct {
	ID       string
	Slot     int   // Slots[0]
	Slots    []int // every slot the lease holds, ascending
	Token    int64
	Deadline time.Time // by the Redis server's clock
	Owner    string    // Options.Owner of the process that acquired it
}

// Waiter is one live queue entry of a fair semaphore.
type Waiter struct {
	ID       string
	Position int       // 0 is the head: the next to be admitted
	Weight   int       // slots it waits for
	Deadline time.Time // when it is evicted unless its process heart-beats
	Owner    string    // Options.Owner of the process that queued it
}
