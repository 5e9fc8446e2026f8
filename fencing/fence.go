package fencing

import (
	"context"
	"math"
	"strconv"

	"github.com/redsem/redsem"
)

// Fence is what a holder presents to a protected store: the resource it
// writes to, the semaphore slot its lease holds, and the lease's token.
type Fence struct {
	Resource string // what the store protects, e.g. a table row or a file; non-empty
	Slot     int    // redsem.Lease.Slot(); >= 0
	Token    int64  // redsem.Lease.Token(); >= 1
}

// Of returns the fence of lease l for resource.
func Of(resource string, l redsem.Lease) Fence {
	return Fence{Resource: resource, Slot: l.Slot(), Token: l.Token()}
}

// Validate returns an *InvalidFenceError (matching ErrInvalidFence) for an
// empty resource, a slot outside [0, 2^31) or a token < 1, else nil. It cannot check
// slot < limit: see Guard.
func (f Fence) Validate() error {
	switch {
	case f.Resource == "":
		return &InvalidFenceError{Field: "resource", Reason: "empty"}
	case f.Slot < 0:
		return &InvalidFenceError{Field: "slot", Value: strconv.Itoa(f.Slot), Reason: "negative"}
	case f.Slot > math.MaxInt32:
		return &InvalidFenceError{Field: "slot", Value: strconv.Itoa(f.Slot), Reason: "above 2^31-1"}
	case f.Token < 1:
		return &InvalidFenceError{Field: "token", Value: strconv.FormatInt(f.Token, 10), Reason: "not positive"}
	}
	return nil
}

// validate is Validate plus the upper slot bound maxSlots (none when 0).
func (f Fence) validate(maxSlots int) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if maxSlots > 0 && f.Slot >= maxSlots {
		return &InvalidFenceError{Field: "slot", Value: strconv.Itoa(f.Slot),
			Reason: "not below MaxSlots " + strconv.Itoa(maxSlots)}
	}
	return nil
}

// Guard checks a fence and records it, atomically. Check returns nil and
// records f.Token as the highest token of (f.Resource, f.Slot) when no
// higher token is recorded there: a token equal to the recorded one is
// accepted, because a holder may write many times with its own token. It
// returns an error matching ErrStale, and records nothing, when a higher
// token is recorded; an error matching ErrInvalidFence, before touching the
// store, for bad input; and the store's error otherwise (then the token may
// or may not have been recorded).
//
// Fencing is per slot, not per resource: a semaphore with limit n has up to
// n live holders whose tokens are not ordered among themselves, and only
// holders of the same slot follow one another in time. A guard never
// rejects a holder because of another slot's token.
//
// A guard does not know the semaphore's limit (it can change at run time
// with SetLimit, and one store may serve several semaphores), so by default
// it checks only slot >= 0; the guards' MaxSlots option adds an upper bound.
// Implementations are safe for concurrent use.
type Guard interface {
	Check(ctx context.Context, f Fence) error
}

// GuardFunc adapts a function to Guard.
type GuardFunc func(ctx context.Context, f Fence) error

// Check calls fn(ctx, f).
func (fn GuardFunc) Check(ctx context.Context, f Fence) error { return fn(ctx, f) }

type fenceKey struct{}

// WithFence returns a copy of ctx that carries f, for Transport to send.
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// WithLease returns a copy of ctx that carries the fence of lease l for
// resource: WithFence(ctx, Of(resource, l)).
func WithLease(ctx context.Context, resource string, l redsem.Lease) context.Context {
	return WithFence(ctx, Of(resource, l))
}

// FromContext returns the fence that WithFence, WithLease or Middleware put
// in ctx, and whether there was one.
func FromContext(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}
