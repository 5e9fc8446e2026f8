package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core/wire"
	"github.com/redsem/redsem/internal/human"
)

// How the engine names a semaphore in its errors (who), and what an acquire
// call's error says (acquireErr) and may have left (needsUndo). Everything
// else about errors, classified without side effect (Transient,
// Unreachable, Wrap, ...), is package wire's (wire/errors.go): the script
// boundary returns its errors classified by it. The texts say what happened
// once, as a person writes it: one "redsem: " prefix, the semaphore named
// once (who), durations and rates without zero units (package human).

// familyName is the name of e's family for a member of a family, whose
// name is its key; "" for a semaphore of its own, and for the family's own
// engines (root, famEng), whose name is the family's.
func (e *Engine) familyName() string {
	if e.fam == nil || e == e.fam.famEng {
		return ""
	}
	return e.fam.Name()
}

// who names e in an error: its quoted name, or for a member of a family
// the family's name with the member's key (human.Semaphore).
func (e *Engine) who() string { return human.Semaphore(e.familyName(), e.cfg.Name) }

// duration formats d for an error's text ("1m", not "1m0s").
func duration(d time.Duration) string { return human.Duration(d) }

// callEnd is what an acquire call knew when it ended (call.end), for
// acquireErr.
type callEnd struct {
	who          string // the semaphore as errors name it (Engine.who)
	name, family string // its name and its family's, for a RateLimitedError
	closed       bool   // Close ended the call (its context's cause is redsem.ErrClosed)
	// parent is the caller's context; ended: it had ended.
	parent context.Context
	ended  bool
	// lastErr: the last transient error ridden out, while no answer came
	// since.
	lastErr error
	// dialErr: the call ended with its context after a dial of its client
	// failed (go-redis retries a failed dial on its own, so a refused dial
	// may never come back to the call as an error before its context ends).
	dialErr error
	// room: when the rate's window has room for the call, if the rate
	// held it back last (call.heldByRate), and the rate in force; zero
	// otherwise.
	room time.Time
	rate redsem.Rate
}

// acquireErr turns the raw error err that an acquire call ended with into
// the call's error:
//   - the caller's context ended: an error matching ctx.Err() and its
//     cause, and ErrUnavailable if Redis could not be reached meanwhile
//     (Unreachable: never for a reply that was merely slow), or a
//     *redsem.RateLimitedError if Redis said last that the rate's window
//     held the call back;
//   - Close ended it: redsem.ErrClosed;
//   - else the error itself, with the semaphore's name.
//
// It has no side effect: alert is the failed dial that said Redis could
// not be reached, which no request of the call reported (nil if none); the
// caller raises the alert (reporter.unreachable).
func acquireErr(err error, end callEnd) (out, alert error) {
	if errors.Is(err, redsem.ErrNoSlot) || errors.Is(err, redsem.ErrLimitMismatch) || errors.Is(err, redsem.ErrClosed) {
		return err, nil
	}
	if end.ended {
		if isCtxErr(err) {
			err = nil // the context's own error, said once below
		}
		out = wire.CtxErr(end.who, end.parent, err)
		if end.dialErr != nil && (end.lastErr == nil || !wire.Unreachable(end.lastErr)) {
			return wire.JoinLine(out, fmt.Errorf("%w: %w", redsem.ErrUnavailable, end.dialErr)), end.dialErr
		}
		if end.lastErr != nil && (err == nil || !errors.Is(err, end.lastErr)) {
			// Redis failed transiently and did not answer since: say how,
			// and (only if it could not be reached) that it was unavailable
			// (the request raised the alert: answered).
			if wire.Unreachable(end.lastErr) {
				out = wire.JoinLine(out, fmt.Errorf("%w: %w", redsem.ErrUnavailable, end.lastErr))
			} else {
				out = wire.JoinLine(out, end.lastErr)
			}
		} else if !end.room.IsZero() {
			// Redis said last that the rate held the call back (its reply,
			// or, for a fair waiter queued behind the limit, the message
			// that the rate holds its queue's head): say when its window
			// has room (redsemhttp answers 429 with it).
			out = wire.JoinLine(out, &redsem.RateLimitedError{Name: end.name, Family: end.family, Rate: end.rate, RetryAfter: max(time.Until(end.room), 0)})
		}
		return out, nil
	}
	if end.closed {
		return redsem.ErrClosed, nil
	}
	return wire.Wrap(end.who, err), nil // the library's own errors (own) come back as they are
}

// isCtxErr reports whether err is a context's error (it was cancelled, or
// its deadline passed).
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// needsUndo reports whether a call that failed with err may have left a
// grant or a queue entry in Redis: not when acquire.lua refused before
// writing, nor when the call got a definite "no" without writing.
func needsUndo(err error) bool {
	if wire.NeverSent(err) {
		return false
	}
	return !(errors.Is(err, redsem.ErrLimitMismatch) || errors.Is(err, redsem.ErrWeight) ||
		errors.Is(err, redsem.ErrQueueFull) || errors.Is(err, redsem.ErrNoSlot) || errors.Is(err, wire.ErrCancelled))
}
