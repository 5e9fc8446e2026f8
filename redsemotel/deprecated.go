package redsemotel

import (
	"context"
	"errors"

	"github.com/redsem/redsem"
	"go.opentelemetry.io/otel/attribute"
)

// The names before the revision (see the package documentation,
// "Migration"): kept so that code which uses them compiles. The attribute
// keys now name the revised attributes; redsem.outcome is no longer set.

// Scope is the instrumentation scope's name.
//
// Deprecated: use ScopeName.
const Scope = ScopeName

// Attribute keys before the revision.
const (
	// Deprecated: use AttrSemaphoreName (its value is now
	// "redsem.semaphore.name").
	AttrSemaphore = AttrSemaphoreName
	// Deprecated: use AttrAcquireWeight (its value is now
	// "redsem.acquire.weight").
	AttrWeight = AttrAcquireWeight
	// Deprecated: use AttrLeaseToken (its value is now
	// "redsem.lease.token").
	AttrToken = AttrLeaseToken
	// Deprecated: use AttrLeaseSlots (its value is now
	// "redsem.lease.slots").
	AttrSlots = AttrLeaseSlots
	// Deprecated: no longer set; a failure sets AttrErrorType (error.type)
	// instead, and success sets none.
	AttrOutcome = attribute.Key("redsem.outcome")
)

// Outcomes before the revision, as Outcome names them.
//
// Deprecated: error.type (the ErrorType constants) replaces them.
const (
	OutcomeGranted  = "granted"
	OutcomeNoSlot   = "no_slot"
	OutcomeTimeout  = "timeout"
	OutcomeCanceled = "canceled"
	OutcomeClosed   = "closed"
	OutcomeError    = "error"
	OutcomeReleased = "released"
	OutcomeLost     = "lost"
)

// Outcome classifies the error of an acquire call as redsem.outcome did
// before the revision: granted (nil), closed, no_slot, timeout, canceled
// or error.
//
// Deprecated: use ErrorType, which names error.type.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeGranted
	case errors.Is(err, redsem.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case errors.Is(err, redsem.ErrNoSlot):
		return OutcomeNoSlot
	}
	return OutcomeError
}
