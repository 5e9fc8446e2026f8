package fencing

import (
	"errors"
	"fmt"
)

var (
	// ErrStale is matched by the error a Guard returns when a token is lower
	// than the highest token already recorded for its (resource, slot), or,
	// for a weighted fence, for any one of its slots: the presenter is a
	// holder whose lease was lost, and a later holder of (one of) the same
	// slots has already reached the store. The concrete error is a
	// *StaleError.
	ErrStale = errors.New("fencing: stale token")
	// ErrInvalidFence is matched by the error returned for bad input: an empty
	// resource, a negative slot (or one at or above a guard's MaxSlots), a
	// slot list that is empty, unsorted or has duplicates, a zero or
	// negative token, a token from the future (more than a guard's MaxSkew
	// ahead of its store's clock), or malformed fencing headers (also a
	// missing or wrong HeaderSignature where fences must be signed). The
	// concrete error is an *InvalidFenceError naming the field.
	ErrInvalidFence = errors.New("fencing: invalid fence")
)

// StaleError reports a rejected token. It matches ErrStale.
type StaleError struct {
	Fence Fence // what was presented
	// Slot is the slot of Fence whose recorded token is higher than
	// Fence.Token (for a weighted fence, the lowest such slot that the
	// guard found); -1 when the guard does not know which (the SQL guard
	// with a weighted fence).
	Slot int
	// Highest is the token recorded for Slot, which is greater than
	// Fence.Token; 0 when the guard does not report it (the SQL guard).
	Highest int64
	// Err is the store's error when the guard learnt of the higher token
	// through one (the SQL guard when a concurrent check raised a slot's
	// token during a weighted check: the statement, and any transaction it
	// ran in, was aborted); else nil.
	Err error
}

func (e *StaleError) Error() string {
	slot := e.Slot
	if !e.Fence.weighted() {
		slot = e.Fence.Slot // the only one
	}
	where := fmt.Sprintf("resource %q slot %d", e.Fence.Resource, slot)
	switch {
	case e.Fence.weighted() && e.Slot >= 0:
		where += " (of slots " + formatSlots(e.Fence.Slots) + ")"
	case e.Fence.weighted():
		where = fmt.Sprintf("resource %q slots %s", e.Fence.Resource, formatSlots(e.Fence.Slots))
	}
	var msg string
	if e.Highest > 0 {
		msg = fmt.Sprintf("fencing: stale token %d for %s: token %d was already recorded",
			e.Fence.Token, where, e.Highest)
	} else {
		msg = fmt.Sprintf("fencing: stale token %d for %s: a higher token was already recorded",
			e.Fence.Token, where)
	}
	if e.Err != nil {
		msg += " (the store aborted the check: " + e.Err.Error() + ")"
	}
	return msg
}

// Unwrap returns Err.
func (e *StaleError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// InvalidFenceError reports bad input to a guard, to the HTTP helpers or to
// a guard constructor. It matches ErrInvalidFence.
type InvalidFenceError struct {
	Field  string // "resource", "slot", "slots", "token", a header name or an option
	Value  string // the offending value as given
	Reason string // what is wrong with it
}

func (e *InvalidFenceError) Error() string {
	return fmt.Sprintf("fencing: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Is reports whether target is ErrInvalidFence.
func (e *InvalidFenceError) Is(target error) bool { return target == ErrInvalidFence }
