package core

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Transient reports whether err is worth trying again after a pause: the
// server could not be reached or answered that it cannot serve now. These
// are retried by Acquire (until its context ends) and by undo:
//
//   - network errors: refused or reset connections, timeouts, EOF, and
//     go-redis's pool timeout;
//   - replies of a server in transition: LOADING (loading its data after a
//     restart), READONLY (a replica, e.g. during a failover), MASTERDOWN,
//     TRYAGAIN, CLUSTERDOWN, and MOVED/ASK that go-redis did not follow.
//
// Everything else is final: script errors ("ERR redsem: ..."), replies of
// unexpected shape, limit mismatches, weights above the limit.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// Unreachable reports whether err says that Redis could not be reached or
// will not serve now, as opposed to a slow reply, an ended context or an
// error of the request: a failed dial, a connection refused, reset or
// closed (EOF), and the replies of a server that cannot serve at all
// (LOADING, MASTERDOWN). Errors that match it also match
// redsem.ErrUnavailable, and only those: a reply that did not come before
// the context ended is a timeout, never "unavailable" (Redis may have run
// the request).
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "MASTERDOWN")
	}
	return false
}

// jitter spreads d over [0.5d, 1.5d) so that clients that failed together do
// not retry together.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}
