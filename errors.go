package redsem

import (
	"fmt"
	"time"

	"github.com/redsem/redsem/internal/human"
	"github.com/redsem/redsem/internal/sentinel"
)

// Every sentinel of the library is made by sentinel.New, which records it:
// the engine knows an error that matches one as its own (not the client's)
// from that record, not from a list kept in line with this file.

var (
	// ErrNoSlot is returned by TryAcquire when no slot may be taken now:
	// all slots are held, or (fair) live waiters are queued ahead.
	ErrNoSlot = sentinel.New("redsem: no slot available")
	// ErrLeaseLost is returned by Renew and Release, and by Lease.Err, once
	// the lease expired or was removed before it was released.
	ErrLeaseLost = sentinel.New("redsem: lease lost")
	// ErrReleased is returned by Renew on a lease that its holder released
	// (Release succeeded): nothing was lost, there is nothing to renew.
	ErrReleased = sentinel.New("redsem: lease already released")
	// ErrLimitMismatch is returned by Acquire and TryAcquire when this client
	// was built with a limit other than the one that live clients of the same
	// name established in Redis, and no SetLimit settled it. The error is a
	// *LimitMismatchError that names both limits; or, for a client built
	// with another rate (Options.Rate) that no SetRate settled, a
	// *RateMismatchError that names both rates; or, for a member of a
	// family whose client was built with another FamilyOptions.Total than
	// the family's, or without one while the family counts one (then also
	// from Resume), an error of no exported type whose text names both
	// totals.
	ErrLimitMismatch = sentinel.New("redsem: limit mismatch")
	// ErrInvalidConfig is matched by every error that New returns for bad
	// input; the concrete error is a *ConfigError naming the field. It is
	// also matched by the error of a call that Redis refused for the
	// client's credentials (a wrong password, a wrong or disabled user, or
	// none where one is required: WRONGPASS, NOAUTH): the client's options
	// are wrong, and trying again will not help. Such an error does not
	// match ErrUnavailable (Redis answered; redsemhttp's FailOpen does not
	// apply to it).
	ErrInvalidConfig = sentinel.New("redsem: invalid configuration")
	// ErrClosed is returned by Acquire and TryAcquire once the semaphore was
	// closed (also to calls blocked at the time). Leases keep working.
	ErrClosed = sentinel.New("redsem: semaphore closed")
	// ErrNotReplicated is returned by Acquire and TryAcquire when the
	// semaphore requires replica acknowledgement (Options.MinReplicas) and
	// fewer replicas acknowledged the grant within Options.ReplicaTimeout.
	// The slot was released again. The error is a *ReplicationError.
	ErrNotReplicated = sentinel.New("redsem: grant not acknowledged by enough replicas")
	// ErrWeight is returned by AcquireN and TryAcquireN for n < 1 or n above
	// the limit in force (or, in a family with a total, above the total in
	// force), at once and writing nothing; and to a queued AcquireN whose
	// weight a SetLimit (or SetTotal) made larger than the new bound.
	ErrWeight = sentinel.New("redsem: weight outside [1, limit]")
	// ErrUnavailable is matched by the error of a call that failed because
	// Redis could not be reached: a failed dial, a connection refused, reset
	// or closed, a server that answered LOADING or MASTERDOWN, or (a call
	// whose context ended) a failed dial of its client meanwhile (redsem
	// adds one hook to each client it is given, which only watches failed
	// dials: go-redis retries them without telling the command). An
	// Acquire rides those out until its context ends, and its error then
	// matches both ErrUnavailable and the context's error. A reply that
	// merely did not come before the context ended (a slow or paused
	// Redis) is a timeout, not ErrUnavailable: Redis may have run the
	// request. Tell "Redis is down" from "no slot in time" with it
	// (redsemhttp's FailOpen applies to it alone).
	ErrUnavailable = sentinel.New("redsem: Redis unavailable")
	// ErrQueueFull is returned by a fair AcquireN, at once and writing
	// nothing, when Options.MaxWaiters waiters are queued already.
	ErrQueueFull = sentinel.New("redsem: queue full")
)

// ErrRateLimited is matched by the error of a TryAcquire refused because
// the rate's window (Options.Rate) was full although a slot was free. An
// error matching it also matches ErrNoSlot, and errors.As to a
// *RateLimitedError gives RetryAfter. The error of an Acquire whose context
// ended while the window held it back (Redis said so last: a slot was free
// for it, or for the fair queue's head) matches it too, beside the
// context's error. "Last" is what the caller's process had heard: what
// other processes do (a SetRate, a release, a grant) reaches it by pub/sub,
// and a caller that gives up before that news arrives is told what its
// process knew then.
var ErrRateLimited = sentinel.New("redsem: rate limit reached")

// RateLimitedError is the error of a TryAcquire that the rate refused, and
// part of the error of an Acquire that gave up while the rate held it back.
// It matches ErrRateLimited and ErrNoSlot.
type RateLimitedError struct {
	Name string // the semaphore's name (a family member's: its key)
	// Family is the family's name, for a member of a family (Name is then
	// the member's key); empty otherwise.
	Family string
	Rate   Rate // the rate in force
	// RetryAfter is when the window will have room for the request, as
	// seen by Redis (from the time of its reply): a TryAcquire made after
	// it finds room, unless others took it first or no slot is free then.
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("redsem: %s: rate limit reached (%v granted): retry after %s",
		human.Semaphore(e.Family, e.Name), e.Rate, human.Wait(e.RetryAfter))
}

// Is reports whether target is ErrRateLimited or ErrNoSlot.
func (e *RateLimitedError) Is(target error) bool {
	return target == ErrRateLimited || target == ErrNoSlot
}

// RateMismatchError tells which rates disagree: this client was built with
// a rate (Options.Rate) other than the one live clients of the same name
// established in Redis, and no SetRate settled it. Acquire and TryAcquire
// return it; it matches ErrLimitMismatch.
type RateMismatchError struct {
	Name        string // the semaphore's name (a family member's: its key)
	Family      string // the family's name, for a member of a family; empty otherwise
	Client      Rate   // the rate this client was built with
	Established Rate   // the rate live clients established in Redis
}

func (e *RateMismatchError) Error() string {
	return mismatchMessage("rate", human.Semaphore(e.Family, e.Name), e.Client, e.Established, "SetRate")
}

// Is reports whether target is ErrLimitMismatch.
func (e *RateMismatchError) Is(target error) bool { return target == ErrLimitMismatch }

// LimitMismatchError tells which limits disagree. It matches ErrLimitMismatch.
type LimitMismatchError struct {
	Name        string // the semaphore's name (a family member's: its key)
	Family      string // the family's name, for a member of a family; empty otherwise
	Client      int    // the limit this client was built with
	Established int    // the limit live clients established in Redis
}

func (e *LimitMismatchError) Error() string {
	return mismatchMessage("limit", human.Semaphore(e.Family, e.Name), e.Client, e.Established, "SetLimit")
}

// Is reports whether target is ErrLimitMismatch.
func (e *LimitMismatchError) Is(target error) bool { return target == ErrLimitMismatch }

// mismatchMessage is the text of a LimitMismatchError or RateMismatchError:
// what ("limit" or "rate") of the semaphore who (human.Semaphore) differs
// between this client and the live ones, and setter changes it for all.
func mismatchMessage(what, who string, client, established any, setter string) string {
	return fmt.Sprintf("redsem: %s mismatch for %s: this client was built with %[1]s %[3]v, "+
		"but live clients established %[1]s %[4]v (use %[5]s to change it for all)",
		what, who, client, established, setter)
}

// ConfigError is returned by New for invalid configuration. It matches
// ErrInvalidConfig.
type ConfigError struct {
	Field  string // the argument or Options field, e.g. "limit", "Options.LeaseTTL"
	Reason string // what is wrong with it
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("redsem: invalid %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// ReplicationError tells how many replicas acknowledged a grant. It matches
// ErrNotReplicated.
type ReplicationError struct {
	Name    string        // the semaphore's name (a family member's: its key)
	Family  string        // the family's name, for a member of a family; empty otherwise
	Want    int           // Options.MinReplicas
	Got     int           // replicas that acknowledged within Timeout
	Timeout time.Duration // Options.ReplicaTimeout
}

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("redsem: grant of %s acknowledged by %d of the %d replicas required within %s (the slot was released)",
		human.Semaphore(e.Family, e.Name), e.Got, e.Want, human.Duration(e.Timeout))
}

// Is reports whether target is ErrNotReplicated.
func (e *ReplicationError) Is(target error) bool { return target == ErrNotReplicated }
