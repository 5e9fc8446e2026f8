package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/redsem/redsem"
)

// Acquire blocks until a slot is granted or ctx ends.
func (e *Engine) Acquire(ctx context.Context) (redsem.Lease, error) {
	return e.AcquireN(ctx, 1)
}

// enter starts an acquire of n slots: it checks n and that e is open, and
// marks e busy (the caller runs e.idle when done) unless it returns an error.
func (e *Engine) enter(n int) error {
	if err := e.checkWeight(n); err != nil {
		return err
	}
	if e.isClosed() {
		return redsem.ErrClosed
	}
	e.busy()
	return nil
}

// AcquireN blocks until n slots are granted at once or ctx ends.
//
// The waiting loop lives here, and only here: each turn runs acquire.lua
// once (which grants, or reports the queue place, or asks for freed-slot
// notices), then waits for an event from the hub (a grant, a wake-up, a
// request to ask again), a timer, Close or the end of ctx.
func (e *Engine) AcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	if err := e.enter(n); err != nil {
		return nil, err
	}
	defer e.idle()
	start := time.Now()
	l, err := e.acquire(ctx, uuid.NewString(), n, start)
	l, err = e.replicated(ctx, l, err)
	if err != nil {
		if ctx.Err() != nil {
			e.emit(redsem.Event{Kind: redsem.EventAcquireTimedOut, Wait: time.Since(start), Err: err})
		} else {
			e.failed(err)
		}
		return nil, err
	}
	return l, nil
}

func (e *Engine) acquire(ctx context.Context, id string, n int, start time.Time) (redsem.Lease, error) {
	var w *waiter
	var backoff time.Duration
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer func() {
		timer.Stop()
		if w != nil {
			w.h.unregister(w)
		}
	}()
	// pause waits out a transient error with jittered backoff; it returns
	// the error to give up with once ctx ends, or nil to go on. The last
	// transient error is kept for that final error.
	// replied records that Redis answered this acquire at least once: a
	// context that ends before any answer (every try refused, black-holed
	// or still dialing) means Redis was unavailable, not busy.
	var lastErr error
	replied := false
	pause := func(err error) error {
		if ctx.Err() != nil || !Transient(err) {
			switch {
			case lastErr != nil && !errors.Is(err, lastErr):
				err = errors.Join(err, fmt.Errorf("%w: %w", redsem.ErrUnavailable, lastErr))
			case lastErr == nil && !replied && ctx.Err() != nil && errors.Is(err, ctx.Err()):
				err = errors.Join(err, fmt.Errorf("%w: no answer before the context ended", redsem.ErrUnavailable))
			}
			return err
		}
		lastErr = err
		backoff = min(max(2*backoff, 20*time.Millisecond), time.Second)
		timer.Reset(jitter(backoff))
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return e.ctxErr(ctx, fmt.Errorf("%w: %w", redsem.ErrUnavailable, err))
		}
	}
	for {
		// The fair queue needs the session (and its channel) first; an
		// unfair waiter subscribes after its first attempt failed.
		if w == nil && e.cfg.Fair {
			var err error
			if w, err = e.register(ctx, id, n); err != nil {
				if err = pause(err); err != nil {
					return nil, err
				}
				continue
			}
		}
		mode, sid := "try", ""
		switch {
		case e.cfg.Fair:
			mode, sid = "queue", w.h.session()
		case w != nil:
			mode = "wait"
		}
		a, err := e.acquireOnce(ctx, id, n, mode, sid)
		if err != nil {
			// Ride a transient error out: the same id again after a pause
			// (the script is idempotent per id, so a try that did reach
			// Redis is found).
			if err = pause(err); err != nil {
				return nil, e.fail(ctx, id, err)
			}
			continue
		}
		backoff, lastErr, replied = 0, nil, true
		if a.code == codeGranted {
			return e.granted(start, id, a.slots, a.token, a.deadline), nil
		}
		if w == nil {
			// Unfair: subscribe, then try again at once, so that a slot
			// freed between the first attempt and the subscription is
			// not missed.
			if w, err = e.register(ctx, id, n); err != nil {
				if err = pause(err); err != nil {
					return nil, e.fail(ctx, id, err)
				}
			}
			continue
		}
		var timeout <-chan time.Time
		if e.cfg.Fair {
			w.h.queued(e, a.hint)
		} else {
			timer.Reset(e.waitFor(a.hint))
			timeout = timer.C
		}
	wait:
		select {
		case ev := <-w.events:
			switch ev.kind {
			case evGrant:
				if !time.Now().Before(ev.grant.deadline) {
					continue // granted, but this process learned too late: ask again
				}
				return e.granted(start, id, ev.grant.slots, ev.grant.token, ev.grant.deadline), nil
			case evWeight:
				return nil, fmt.Errorf("redsem: %q: %d slots wanted, the limit was set to %d: %w", e.cfg.Name, n, ev.limit, redsem.ErrWeight)
			case evFree, evRequeue:
				timer.Stop()
				continue
			}
			goto wait
		case <-timeout:
			continue
		case <-w.h.quit:
			e.leave(ctx, w, id)
			return nil, redsem.ErrClosed
		case <-ctx.Done():
			e.leave(ctx, w, id)
			return nil, e.ctxErr(ctx, nil)
		}
	}
}

// leave ends a wait without a grant. A fair waiter leaves the queue (or
// hands back a slot granted in the race); an unfair waiter passes on a
// wake-up it received but will not use.
func (e *Engine) leave(ctx context.Context, w *waiter, id string) {
	if e.cfg.Fair {
		if ctx.Err() == nil {
			// Close: the caller's context still runs, so leave now, within it.
			if _, _, err := e.release(ctx, id, "undo"); err == nil {
				return
			}
		}
		e.undo(ctx, id, nil)
		return
	}
	select {
	case ev := <-w.events:
		if ev.kind == evFree {
			w.h.wakeUnfair(1)
		}
	default:
	}
}

// waitFor is how long an unfair waiter sleeps without a message: until just
// after the earliest holder deadline, at most Fallback, with ±20% jitter.
func (e *Engine) waitFor(hint int64) time.Duration {
	d := e.cfg.Fallback
	if hint >= 0 {
		if h := time.Duration(hint+1) * time.Millisecond; h < d {
			d = h
		}
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// fail turns an error met while acquiring into the error Acquire returns,
// after undoing whatever the attempt may have left in Redis.
func (e *Engine) fail(ctx context.Context, id string, err error) error {
	e.undo(ctx, id, err)
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return e.ctxErr(ctx, err)
	}
	return err
}
