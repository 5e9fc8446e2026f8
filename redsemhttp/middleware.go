package redsemhttp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/detach"
)

// defaultRetryAfter is the Retry-After of a 503 when Options.RetryAfter is
// zero.
const defaultRetryAfter = time.Second

// Options configure Middleware. The zero value is not usable: Semaphore is
// required (Middleware panics without it, a programming error).
type Options struct {
	// Semaphore picks the semaphore for a request: one per route, per
	// tenant, per API key. It is called once per request. An error answers
	// the request with ErrorHandler (default: 500 Internal Server Error)
	// without calling the handler.
	Semaphore func(*http.Request) (redsem.Semaphore, error)
	// MaxWait bounds how long a request waits for a lease; zero: as long as
	// the request's context allows. A request still waiting after MaxWait is
	// answered 503 with Retry-After, and leaves nothing behind in Redis.
	MaxWait time.Duration
	// RetryAfter is the value of the Retry-After header of a 503 answer,
	// rounded up to whole seconds; zero: 1s. A request that the
	// semaphore's rate refused is answered 429 instead, with a Retry-After
	// that says when the rate's window has room (see Middleware).
	RetryAfter time.Duration
	// FailOpen decides what happens when Acquire fails because Redis cannot
	// be reached (its error matches redsem.ErrUnavailable: a failed dial, a
	// refused or dropped connection, a server loading its data). False (the
	// default) fails closed: the request is answered 503 with Retry-After,
	// as if no slot were free. True fails open: the handler runs without a
	// lease (LeaseFromContext reports none), so the limit does not hold
	// while Redis is down, but the service stays up. With FailOpen each
	// request tries once first (TryAcquire, which fails with the first
	// failed dial), so that it is served at once while Redis refuses
	// connections, the first request after Redis went away included; a
	// request whose try fails otherwise (no slot free, the rate's window
	// full, a reply slower than the client's read timeout) then waits with
	// Acquire up to MaxWait, as without FailOpen: one more call to Redis
	// for a request that must wait. It never applies to a
	// healthy Redis: a reply slower than MaxWait, a request whose context
	// ended, a full queue, a closed semaphore or a limit mismatch are
	// answered 503 whatever FailOpen says.
	FailOpen bool
	// ErrorHandler answers a request whose Semaphore func returned an error
	// (err wraps it, with the prefix "redsemhttp: "); nil: a plain-text 500
	// Internal Server Error that does not show err to the client.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// ReleaseTimeout bounds the Release made when the handler returns,
	// which runs even if the request's context has ended; zero: 5s.
	ReleaseTimeout time.Duration
}

type leaseKey struct{}

// errNoSemaphore stands for a nil semaphore returned without an error.
var errNoSemaphore = errors.New("no semaphore for the request")

// LeaseFromContext returns the lease under which Middleware runs the
// request whose context is ctx. It reports false when the request runs
// without one (FailOpen after a failed Acquire). Pass the lease's Slot and
// Token on to a store protected with package fencing.
func LeaseFromContext(ctx context.Context) (redsem.Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(redsem.Lease)
	return l, ok
}

// Middleware admits a request only while it holds a lease of the semaphore
// that opts.Semaphore returns for it; the lease is released when the handler
// returns. A request that cannot get one within opts.MaxWait (or whose
// queue is full) is answered 503 with a Retry-After header, or 429 when the
// semaphore's rate (Options.Rate of package fair or unfair) is what held it
// back, without calling the handler.
//
// In detail, for each request:
//   - Semaphore returns an error: ErrorHandler answers (default 500); the
//     handler does not run.
//   - Acquire returns a lease: the handler runs with the lease in its
//     request's context (LeaseFromContext), and the lease is released when
//     the handler returns or panics (the panic goes on after the release).
//   - Acquire gives up with a *redsem.RateLimitedError: the semaphore's
//     rate held the request back while a slot was free (its Acquire gave
//     up at MaxWait while the rate's window was full, or returned the
//     error at once): 429 Too Many Requests, with Retry-After set from the
//     error's RetryAfter, when the window has room (whole seconds, rounded
//     up, at least 1), so that a client that obeys it is not refused again
//     by the same window.
//   - Acquire gives up because MaxWait passed or the request's context ended
//     (the client went away), or fails with an error matching
//     redsem.ErrQueueFull: 503 Service Unavailable with Retry-After.
//   - Acquire gives up with an error matching redsem.ErrUnavailable (Redis
//     could not be reached: Acquire rides that out until MaxWait): 503 with
//     Retry-After (fail closed), or with Options.FailOpen the handler runs
//     without a lease.
//   - Acquire fails otherwise (closed, limit mismatch, a Redis error): 503
//     with Retry-After.
//
// A lease lost while the handler runs (Redis lost it, the process paused
// past its TTL) does not stop the handler; handlers that must stop watch
// the lease's Done channel.
func Middleware(opts Options) func(http.Handler) http.Handler {
	if opts.Semaphore == nil {
		panic("redsemhttp: Middleware needs Options.Semaphore")
	}
	retryAfter := opts.RetryAfter
	if retryAfter <= 0 {
		retryAfter = defaultRetryAfter
	}
	retryAfterHeader := strconv.FormatInt(int64(math.Ceil(retryAfter.Seconds())), 10)
	releaseTimeout := opts.ReleaseTimeout
	if releaseTimeout <= 0 {
		releaseTimeout = bounds.Release
	}
	onError := opts.ErrorHandler
	if onError == nil {
		onError = func(w http.ResponseWriter, _ *http.Request, _ error) {
			http.Error(w, "redsemhttp: no limiter for this request", http.StatusInternalServerError)
		}
	}
	unavailable := func(w http.ResponseWriter, msg string) {
		w.Header().Set("Retry-After", retryAfterHeader)
		http.Error(w, msg, http.StatusServiceUnavailable)
	}
	rateLimited := func(w http.ResponseWriter, rl *redsem.RateLimitedError) {
		w.Header().Set("Retry-After", strconv.FormatInt(max(int64(math.Ceil(rl.RetryAfter.Seconds())), 1), 10))
		http.Error(w, "redsemhttp: rate limit reached, try again later", http.StatusTooManyRequests)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sem, err := opts.Semaphore(r)
			if err == nil && sem == nil {
				err = errNoSemaphore
			}
			if err != nil {
				onError(w, r, fmt.Errorf("redsemhttp: choose semaphore: %w", err))
				return
			}
			ctx := r.Context()
			waitCtx := ctx
			if opts.MaxWait > 0 {
				var cancel context.CancelFunc
				waitCtx, cancel = context.WithTimeout(ctx, opts.MaxWait)
				defer cancel()
			}
			var lease redsem.Lease
			if opts.FailOpen {
				lease, err = sem.TryAcquire(waitCtx)
				if err != nil && errors.Is(err, redsem.ErrUnavailable) {
					next.ServeHTTP(w, r) // unreachable: fail open at once
					return
				}
			}
			if lease == nil && (!opts.FailOpen || waitAfterTry(err)) {
				// As without FailOpen: also after a try that found no slot,
				// the window full, or a reply slower than the client's read
				// timeout (a stall Acquire rides out within MaxWait).
				lease, err = sem.Acquire(waitCtx)
			}
			var rl *redsem.RateLimitedError
			switch {
			case err == nil:
			case errors.As(err, &rl):
				rateLimited(w, rl)
				return
			case errors.Is(err, redsem.ErrUnavailable):
				// Acquire rode out Redis errors until MaxWait: Redis is
				// unreachable, not busy.
				if opts.FailOpen {
					next.ServeHTTP(w, r)
					return
				}
				unavailable(w, "redsemhttp: limiter unavailable, try again later")
				return
			case waitCtx.Err() != nil && errors.Is(err, waitCtx.Err()), errors.Is(err, redsem.ErrQueueFull):
				unavailable(w, "redsemhttp: no slot free, try again later")
				return
			default:
				unavailable(w, "redsemhttp: limiter unavailable, try again later")
				return
			}
			defer func() {
				// Runs on return and on panic: the panic continues after it.
				_ = detach.Release(ctx, lease, releaseTimeout) // on failure the slot comes back after its TTL
			}()
			next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, leaseKey{}, lease)))
		})
	}
}

// waitAfterTry reports whether a request whose TryAcquire failed with err
// should wait with Acquire: the try found no slot free or the rate's window
// full, or Redis answered slower than the client's read timeout (a stall
// that Acquire rides out). Errors that another call would meet again (a
// closed semaphore, a limit mismatch, a full queue, an error reply from
// Redis) are answered at once.
func waitAfterTry(err error) bool {
	var rl *redsem.RateLimitedError
	var ne net.Error
	return errors.Is(err, redsem.ErrNoSlot) || errors.As(err, &rl) ||
		errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
