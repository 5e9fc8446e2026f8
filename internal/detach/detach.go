// Package detach holds the one way redsem hands a lease back after its
// user is done with it: Do after fn returns, the HTTP middleware after the
// handler, the SQL connector when a connection closes, and a grant that too
// few replicas acknowledged. The release runs within the caller's context
// while that lasts, and on a context detached from it (its values kept, its
// cancellation not) only once it has ended, so that a slot is given back
// even when the request that held it was cancelled; both bounded (by
// bounds.Release unless the caller sets its own bound).
//
// It imports nothing of redsem (the root package uses it too).
package detach

import (
	"context"
	"time"
)

// Releaser is what can be released: a redsem.Lease.
type Releaser interface {
	Release(ctx context.Context) error
}

// Release releases r within ctx while ctx runs, at most d; once ctx has
// ended (before or during that release), on a context detached from ctx,
// at most d. It returns the release's error. A release that cannot run
// leaves the slot to expire at the lease's deadline.
func Release(ctx context.Context, r Releaser, d time.Duration) error {
	if ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, d)
		err := r.Release(rctx)
		cancel()
		if err == nil || ctx.Err() == nil {
			return err
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return r.Release(rctx)
}
