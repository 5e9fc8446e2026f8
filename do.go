package redsem

import (
	"context"
	"errors"
	"time"

	"github.com/redsem/redsem/internal/detach"
)

// releaseTimeout bounds the release that Do makes after fn returns: within
// ctx while it runs, detached from it once it ended (internal/detach).
const releaseTimeout = 5 * time.Second

// Do acquires a slot, runs fn with a context that is cancelled if the lease
// is lost, and always releases the slot afterwards (also when fn panics or
// returns an error). It is the Go form of the seed's context manager.
//
// Do returns the error of Acquire if no slot was granted, otherwise fn's
// error joined with any error from Release. If the lease was lost while fn
// ran, the result matches ErrLeaseLost, and context.Cause of fn's context is
// ErrLeaseLost. A panic in fn is re-raised after the release.
func Do(ctx context.Context, s Semaphore, fn func(ctx context.Context, l Lease) error) (err error) {
	l, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	// The lease's own context ends on loss (cause ErrLeaseLost) or release;
	// only a loss cancels fn's context.
	stop := context.AfterFunc(l.Context(), func() {
		if err := l.Err(); err != nil {
			cancel(err)
		}
	})
	defer func() {
		stop()
		cancel(context.Canceled)
		relErr := detach.Release(ctx, l, releaseTimeout)
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
