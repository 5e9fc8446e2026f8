package fencing

import (
	"context"
	"math"
	"strconv"

	"github.com/redsem/redsem"
)

// Fence is what a holder presents to a protected store: the resource it
// writes to, the semaphore slots its lease holds, and the lease's token.
//
// A lease of one slot (Acquire) has a fence with Slot set and Slots nil,
// exactly as before weighted leases existed. A weighted lease (AcquireN
// with n > 1) holds several slots, and its fence lists them all in Slots,
// ascending, with Slot equal to Slots[0]: a guard then accepts the token
// only if it is at least the highest recorded for every one of them. Build
// fences with Of, which fills both fields; a Fence is not comparable with ==
// (it holds a slice).
type Fence struct {
	Resource string // what the store protects, e.g. a table row or a file; non-empty
	Slot     int    // redsem.Lease.Slot(), the first slot; >= 0
	// Slots is redsem.Lease.Slots() when the lease holds more than one slot:
	// ascending, no duplicates, Slots[0] == Slot. nil means the one slot Slot.
	Slots []int
	Token int64 // redsem.Lease.Token(); >= 1
}

// Of returns the fence of lease l for resource: every slot l holds and its
// token. For a lease of one slot, Slots is nil.
func Of(resource string, l redsem.Lease) Fence {
	f := Fence{Resource: resource, Slot: l.Slot(), Token: l.Token()}
	if s := l.Slots(); len(s) > 1 { // Slots returns a copy: f owns it
		f.Slots = s
	}
	return f
}

// AllSlots returns every slot of f: Slots, or a one-element list of Slot
// when Slots is nil. Custom guards (GuardFunc) must check each of them. The
// result may share memory with f.Slots: do not modify it.
func (f Fence) AllSlots() []int {
	if f.Slots == nil {
		return []int{f.Slot}
	}
	return f.Slots
}

// weighted reports whether f has more than one slot; a valid one-element
// Slots is the same as the plain Slot.
func (f Fence) weighted() bool { return len(f.Slots) > 1 }

// Validate returns an *InvalidFenceError (matching ErrInvalidFence) for an
// empty resource, a slot outside [0, 2^31), a non-nil Slots that is empty,
// not strictly ascending (a duplicate) or whose first element is not Slot,
// or a token < 1; else nil. It cannot check slot < limit: see Guard.
func (f Fence) Validate() error {
	if f.Resource == "" {
		return &InvalidFenceError{Field: "resource", Reason: "empty"}
	}
	if f.Slots == nil {
		if err := checkSlot("slot", f.Slot); err != nil {
			return err
		}
	} else {
		if len(f.Slots) == 0 {
			return &InvalidFenceError{Field: "slots", Reason: "empty (use nil for the one slot Slot)"}
		}
		for i, s := range f.Slots {
			if err := checkSlot("slots", s); err != nil {
				return err
			}
			if i > 0 && s <= f.Slots[i-1] {
				return &InvalidFenceError{Field: "slots", Value: formatSlots(f.Slots),
					Reason: "not strictly ascending (unsorted or a duplicate)"}
			}
		}
		if f.Slot != f.Slots[0] {
			return &InvalidFenceError{Field: "slot", Value: strconv.Itoa(f.Slot),
				Reason: "not Slots[0] (" + strconv.Itoa(f.Slots[0]) + ")"}
		}
	}
	if f.Token < 1 {
		return &InvalidFenceError{Field: "token", Value: strconv.FormatInt(f.Token, 10), Reason: "not positive"}
	}
	return nil
}

func checkSlot(field string, s int) error {
	switch {
	case s < 0:
		return &InvalidFenceError{Field: field, Value: strconv.Itoa(s), Reason: "negative"}
	case s > math.MaxInt32:
		return &InvalidFenceError{Field: field, Value: strconv.Itoa(s), Reason: "above 2^31-1"}
	}
	return nil
}

// formatSlots writes slots as a comma-separated list: "0,3,4".
func formatSlots(slots []int) string {
	b := make([]byte, 0, 4*len(slots))
	for i, s := range slots {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(s), 10)
	}
	return string(b)
}

// slotList is the comma-separated list of every slot of f, for the Redis
// scripts and the HTTP header.
func (f Fence) slotList() string {
	if f.Slots == nil {
		return strconv.Itoa(f.Slot)
	}
	return formatSlots(f.Slots)
}

// validate is Validate plus the upper slot bound maxSlots (none when 0).
func (f Fence) validate(maxSlots int) error {
	if err := f.Validate(); err != nil {
		return err
	}
	last, field := f.Slot, "slot"
	if f.Slots != nil {
		last, field = f.Slots[len(f.Slots)-1], "slots" // the highest: they ascend
	}
	if maxSlots > 0 && last >= maxSlots {
		return &InvalidFenceError{Field: field, Value: strconv.Itoa(last),
			Reason: "not below MaxSlots " + strconv.Itoa(maxSlots)}
	}
	return nil
}

// Guard checks a fence and records it, atomically. Check returns nil and
// records f.Token as the highest token of (f.Resource, s) for every slot s
// of the fence (see Fence.AllSlots) when no higher token is recorded for
// any of them: a token equal to the recorded one is accepted, because a
// holder may write many times with its own token. It returns an error
// matching ErrStale, and records nothing for any slot, when a higher token
// is recorded for at least one slot; an error matching ErrInvalidFence,
// before touching the store, for bad input, and, recording nothing, for a
// token from the future: more than a bound ahead of the store's own clock
// (RedisGuard and SQLGuard check it with their store's clock, Middleware
// with its server's; see MaxSkew in RedisOptions); and the store's error
// otherwise (then the token may or may not have been recorded, for all
// slots or for none).
//
// A weighted fence is all or nothing: its check and its records are one
// atomic step, so no concurrent check sees some of its slots recorded and
// not the others, and a zombie whose slots were granted again one by one
// is rejected as soon as the new holder of any one of them has written.
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
