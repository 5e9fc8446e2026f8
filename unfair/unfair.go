package unfair

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// Options configures a Semaphore. The zero value is valid.
type Options struct {
	// LeaseTTL is how long a slot is held without renewal; zero: 30s.
	// Leases renew themselves every LeaseTTL/3 unless DisableAutoRenew.
	LeaseTTL time.Duration
	// DisableAutoRenew turns off the background renewal of leases; holders
	// then call Lease.Renew themselves before Lease.Deadline. A lease not
	// renewed in time is lost at its Deadline, in one moment: its Context
	// ends (cause redsem.ErrLeaseLost), Done closes and Err is
	// redsem.ErrLeaseLost together (also while a Renew or Release is in
	// flight); then it is released in Redis, in the background (waiters are
	// woken), unless another process resumed it.
	DisableAutoRenew bool
	// KeyPrefix is the first part of every Redis key; zero: "redsem". It may
	// not contain braces.
	KeyPrefix string
	// FallbackInterval bounds how long a blocked Acquire waits for a
	// wake-up message (pub/sub is at-most-once) before it tries again;
	// zero: 1s. It also wakes just after the earliest holder deadline.
	FallbackInterval time.Duration
	// Observer, if set, receives every event (acquired, released, lease
	// lost, ...) synchronously; see redsem.Event. Nil costs nothing.
	Observer redsem.Observer
	// Logger, if set, logs events with log/slog: lost leases, evictions and
	// warnings at Warn, the rest at Debug. Whether set or not, the
	// conditions a user must see (Redis unreachable; a maxmemory-policy
	// that may evict the keys, or that cannot be read) are logged at Warn,
	// once when they start, at most once a minute while they last and once
	// when they clear, with the library's few notes about itself (Info,
	// Debug). Nil: events are not logged, and those records go to
	// slog.Default() at Warn (the notes at their own levels).
	Logger *slog.Logger
	// MinReplicas, if positive, makes Acquire and TryAcquire wait until
	// this many replicas of the Redis primary acknowledged the grant (Redis
	// WAIT, on one connection to the primary that owns the semaphore's
	// slot). If fewer acknowledge within ReplicaTimeout, the slot is
	// released and the call returns a *redsem.ReplicationError (matching
	// redsem.ErrNotReplicated). Zero: no waiting; a failover may then lose
	// recent grants (see docs/reliability.md). It needs a *redis.Client, a
	// failover client or a *redis.ClusterClient, and costs two round trips
	// per grant plus the replication delay.
	MinReplicas int
	// ReplicaTimeout bounds the wait for MinReplicas; zero: 1s. Keep it
	// below the client's ReadTimeout.
	ReplicaTimeout time.Duration
	// Owner is a label stored with every lease and queue entry of this
	// semaphore, shown by Status, the redsem command and the Prometheus
	// status collector, to tell which process holds a slot; zero:
	// "hostname:pid". At most 256 bytes, without '|' or newline.
	Owner string
	// MaxHold, if positive, stops the auto-renewal of a lease once it is
	// this old, so a stuck holder loses its slots at the following deadline
	// (at most LeaseTTL later, unless another process resumed the lease
	// with a longer LeaseTTL: Redis never moves a deadline earlier): Done,
	// Err, Context and redsem.Do report the loss then, as for any other,
	// and the slots are released in Redis right after. Zero: no cap.
	MaxHold time.Duration

	// Rate, if not zero, bounds how many slots are granted in any window of
	// Rate.Per, by the Redis server's clock, besides the limit on slots held
	// at once: a grant needs a free slot and room in the window (a sliding
	// window over grant times; a weighted grant counts its weight).
	// Whoever fits both is granted: no order among waiters. When the
	// window is what holds a waiter back, it is woken when the
	// window has room, not by polling. TryAcquire refused by the rate
	// while a slot was free returns a *redsem.RateLimitedError (matching
	// redsem.ErrRateLimited and redsem.ErrNoSlot) that says when to retry,
	// and so does the error of an AcquireN whose context ends while the
	// rate holds it back (beside the context's error); AcquireN with n
	// above Rate.Limit returns redsem.ErrWeight at once.
	// Like the limit, the rate is stored in Redis: a client built with
	// another rate than live clients established gets an error matching
	// redsem.ErrLimitMismatch (a *redsem.RateMismatchError) until SetRate
	// sets one for all. Per is rounded up to whole milliseconds; Limit in
	// [1, 2^20], Per at most 366 days. Zero: no rate bound.
	Rate redsem.Rate
}

// Semaphore is the unfair (sorted-set) semaphore. It is safe for concurrent
// use; create one per name and process and share it.
type Semaphore struct{ *handle }

// handle is the engine behind a Semaphore (see core.Handle: embedded, it
// lets this module's own packages find the engine, and gives users
// nothing).
type handle = core.Handle

var _ redsem.Semaphore = (*Semaphore)(nil)

// New returns an unfair semaphore called name that admits at most limit
// holders at once. client may be a *redis.Client, *redis.ClusterClient or a
// failover client. New does no I/O; it returns a *redsem.ConfigError
// (matching redsem.ErrInvalidConfig) for a nil client, an empty or too long
// name, a limit outside [1, 2^20], or a negative or sub-millisecond TTL.
func New(client redis.UniversalClient, name string, limit int, opts Options) (*Semaphore, error) {
	return semaphore(core.New(core.ConfigOf(client, name, limit, false, opts)))
}

// semaphore is the Semaphore of an engine that core.New or a family's Get
// returned, or their error.
func semaphore(e *core.Engine, err error) (*Semaphore, error) {
	if err != nil {
		return nil, err
	}
	return &Semaphore{(*handle)(e)}, nil
}

func (s *Semaphore) e() *core.Engine { return (*core.Engine)(s.handle) }

// Acquire blocks until a slot is granted or ctx ends. It tries once; if no
// slot is free it subscribes to release notices and tries again on each
// notice, just after the earliest holder deadline, and at least every
// FallbackInterval. On ctx end it returns an error matching ctx.Err() and
// holds nothing. A limit mismatch or a Redis error is returned at once.
func (s *Semaphore) Acquire(ctx context.Context) (redsem.Lease, error) { return s.e().Acquire(ctx) }

// TryAcquire makes one attempt and never waits (with Redis down it returns
// once a dial fails: see redsem.Semaphore): it returns redsem.ErrNoSlot
// when all slots are held (or when fair waiters of the same name are
// queued: it never jumps a queue).
func (s *Semaphore) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	return s.e().TryAcquire(ctx)
}

// Status reads the live holders, ordered by deadline, and the limit in force.
func (s *Semaphore) Status(ctx context.Context) (redsem.Status, error) { return s.e().Status(ctx) }

// SetLimit sets the limit for every client of this name, overriding the
// limit each was built with, until set again. It never expires. Lowering it
// revokes no lease: new grants wait until fewer than limit are held.
func (s *Semaphore) SetLimit(ctx context.Context, limit int) error { return s.e().SetLimit(ctx, limit) }

// SetRate sets the rate (see Options.Rate) for every client of this name,
// overriding the rate each was built with, until set again; it never
// expires. The zero Rate removes the bound for every client. Slots granted
// before the call still count in the window of the new rate. Raising or
// removing it admits waiters at once; lowering it below a queued waiter's
// weight ends that waiter's AcquireN with redsem.ErrWeight. An invalid rate
// returns a *redsem.ConfigError and changes nothing.
func (s *Semaphore) SetRate(ctx context.Context, rate redsem.Rate) error {
	return s.e().SetRate(ctx, rate)
}

// Name is the semaphore's name as given to New.
func (s *Semaphore) Name() string { return s.e().Name() }

// Close stops the background wake-up subscription, which otherwise ends by
// itself shortly after the last waiter leaves. Acquire calls blocked at the
// time return redsem.ErrClosed, holding nothing, as do later Acquire and
// TryAcquire calls. Leases already granted keep working (renew, release)
// after Close.
func (s *Semaphore) Close() error { return s.e().Close() }

// AcquireN blocks until n slots are granted at once, or ctx ends: all or
// nothing, so two callers that each need several slots never deadlock each
// other holding part of what they need. Whoever fits when slots free takes
// them: a large request can wait long while smaller ones keep taking the
// slots that free one by one (use the fair variant where that matters).
// n < 1 or above the limit in force returns an error matching
// redsem.ErrWeight at once, writing nothing.
func (s *Semaphore) AcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return s.e().AcquireN(ctx, n)
}

// TryAcquireN makes one attempt to take n slots at once and never waits:
// redsem.ErrNoSlot when fewer than n are free.
func (s *Semaphore) TryAcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return s.e().TryAcquireN(ctx, n)
}

// Resume returns the live lease with that id (its ID()), granted by any
// process: a lease handed on from the process that acquired it, e.g. with
// a job, to the worker that finishes it. It renews the lease at once and
// returns it as a lease of this process, renewed in the background like
// any other (unless DisableAutoRenew), with the same Token and Slots. A
// Release through any handle of the lease frees its slots at once; the
// others end as released at their next renewal, without errors. A lease
// this semaphore holds already comes back as the same lease, renewed. An
// id with no live lease returns an error matching redsem.ErrLeaseLost, an
// id that cannot be a lease's a *redsem.ConfigError; neither leaves
// anything in Redis.
func (s *Semaphore) Resume(ctx context.Context, id string) (redsem.Lease, error) {
	return s.e().Resume(ctx, id)
}
