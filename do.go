package redsem

import (
	"context"
	"errors"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/redsem/redsem/internal/detach"
)

// Do acquires a slot, runs fn with a context that is cancelled if the lease
// is lost, and always releases the slot afterwards (also when fn panics or
// returns an error): a scoped hold, as a with-block or try/finally gives
// in other languages. fn's context ends when the lease's Context does on a
// loss: at the lease's Deadline if it passed unrenewed (Redis cut off or
// paused, DisableAutoRenew, MaxHold), or as soon as a renewal finds the
// lease gone.
//
// Do returns the error of Acquire if no slot was granted, otherwise fn's
// error joined with any error from Release. The release runs within ctx
// while ctx lives, and on a context detached from it once ctx has ended,
// so that a caller that gave up still frees the slot: Do may then return
// up to 5 s (at most until the lease's Deadline) after ctx ended, the one
// call that outlives its context by design. If the lease was lost while fn
// ran, the result matches ErrLeaseLost, and context.Cause of fn's context is
// ErrLeaseLost. A panic in fn is re-raised after the release.
func Do(ctx context.Context, s Semaphore, fn func(ctx context.Context, l Lease) error) (err error) {
	l, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	// The lease's own context ends on loss (cause ErrLeaseLost) or release
	// (cause context.Canceled); only a loss cancels fn's context, at the
	// moment the lease's does (its Deadline passed unrenewed, or Redis
	// said the lease is gone).
	lctx := l.Context()
	stop := context.AfterFunc(lctx, func() {
		if cause := context.Cause(lctx); errors.Is(cause, ErrLeaseLost) {
			cancel(cause)
		} else if err := l.Err(); err != nil {
			cancel(err)
		}
	})
	defer func() {
		stop()
		cancel(context.Canceled)
		relErr := detach.Release(ctx, l, bounds.Release) // within ctx while it runs, detached once it ended
		if r := recover(); r != nil {
			panic(r)
		}
		if errors.Is(err, ErrLeaseLost) && errors.Is(relErr, ErrLeaseLost) {
			relErr = nil // said once
		}
		err = errors.Join(err, relErr)
	}()
	return fn(fnCtx, l)
}
