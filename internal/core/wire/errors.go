package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/sentinel"
)

// What every error of a call to Redis means, with no side effect: whether
// it is worth another try (Transient), whether Redis could not be reached
// (Unreachable, which ErrUnavailable matches), how the library names the
// semaphore in an error (Wrap, CallErr, CtxErr), which errors are the
// library's own (own), and what a server's reply says it can do (Refused,
// noReadOnlyScripts, ...). Classifying has no side effect: the engine
// raises the alerts and reloads a cluster's topology where a request
// learnt it (Watch.Answered). The reply codes and the errors they mean are
// declared with each script's call (calls.go), but for those of a family's
// total, at the end of this file (totalMismatch, uncounted).
//
// The texts of the library's errors say what happened once, as a person
// writes it: one "redsem: " prefix, the semaphore named once (a family
// member by its family's name and its key: the engine's who), durations
// and rates without zero units (package human). A sentinel matched by an
// error whose text says it all is matched (Errorf) but not repeated; one
// that is the error's headline is said without its own prefix (Bare).

// sentinelErr is an error whose text says it all that also matches a
// sentinel, without the sentinel's text after it (`... limit in force is
// 2`, not `... limit in force is 2: redsem: weight outside [1, limit]`).
type sentinelErr struct {
	err      error // the text, and what it wraps
	sentinel error
}

func (e *sentinelErr) Error() string   { return e.err.Error() }
func (e *sentinelErr) Unwrap() []error { return []error{e.err, e.sentinel} }

// Errorf formats an error (as fmt.Errorf: %w wraps) that matches sentinel
// too, without its text.
func Errorf(sentinel error, format string, args ...any) error {
	return &sentinelErr{err: fmt.Errorf(format, args...), sentinel: sentinel}
}

// bareErr is a sentinel said inside a text that has the prefix already:
// its text without "redsem: " (`redsem: "db": Redis unavailable: ...`);
// it matches the sentinel.
type bareErr struct{ sentinel error }

func (e bareErr) Error() string { return strings.TrimPrefix(e.sentinel.Error(), "redsem: ") }
func (e bareErr) Unwrap() error { return e.sentinel }

// Bare is sentinel for a text that says "redsem: " already.
func Bare(sentinel error) error { return bareErr{sentinel} }

// leadName returns the name at the start of s with the ": " after it, as
// who writes it (`"db": `, `family "t", key "k": `), or "".
func leadName(s string) string {
	family := strings.HasPrefix(s, "family ")
	rest := strings.TrimPrefix(s, "family ")
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return ""
	}
	rest = rest[len(q):]
	if after, ok := strings.CutPrefix(rest, ", key "); ok && family {
		k, err := strconv.QuotedPrefix(after)
		if err != nil {
			return ""
		}
		rest = after[len(k):]
	}
	if !strings.HasPrefix(rest, ": ") {
		return ""
	}
	return s[:len(s)-len(rest)+2]
}

// retold is err said in other words (msg): a script's refusal without
// its "ERR redsem: ", which wrap's prefix says already. It matches what err
// matches (a redis.Error).
type retold struct {
	msg string
	err error
}

func (e *retold) Error() string { return e.msg }
func (e *retold) Unwrap() error { return e.err }

// scriptRefusals are how the scripts' error replies begin after
// "ERR redsem: " (the Lua library's fail): a bad argument (a bug of this client,
// or of another version sharing the semaphore), a stored value that is not
// what the scripts write (a damaged key), or the wrong number of keys. All
// are final: Transient is false for them. calls_test.go holds every
// fail(...) of the scripts to this list.
var scriptRefusals = []string{"bad ", "the stored ", "want "}

// CallErr is the error of a call to Redis that failed: the context's when
// it ended, else err wrapped with the semaphore's name (who: Engine.who).
func CallErr(who string, ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return CtxErr(who, ctx, err)
	}
	return Wrap(who, err)
}

// CtxErr is the error of a call that ctx ended: it matches ctx.Err() and the
// context's cause, and keeps err (what the call itself reported, if any).
func CtxErr(who string, ctx context.Context, err error) error {
	base := ctx.Err()
	cause := context.Cause(ctx)
	var out error
	if cause != nil && cause != base {
		out = &namedError{fmt.Errorf("redsem: %s: gave up: %w (%w)", who, base, cause)}
	} else {
		out = &namedError{fmt.Errorf("redsem: %s: gave up: %w", who, base)}
	}
	if err != nil && !errors.Is(err, base) {
		out = JoinLine(out, err)
	}
	return out
}

// Wrap names the semaphore (who) in err (once: an error of the library's
// own names it already), and does nothing else (the alert that Redis
// cannot be reached is raised where a request learnt it: answered); an
// error that says Redis could not be reached matches
// redsem.ErrUnavailable too, and one that says the connection lacks
// authentication, or that its credentials are wrong, says which and
// matches redsem.ErrInvalidConfig (the client's options are wrong).
func Wrap(who string, err error) error {
	if own(err) {
		return err
	}
	switch {
	case Unreachable(err):
		return &namedError{fmt.Errorf("redsem: %s: %w: %w", who, Bare(redsem.ErrUnavailable), err)}
	case strings.Contains(err.Error(), "WRONGPASS"):
		return &namedError{Errorf(redsem.ErrInvalidConfig, "redsem: %s: Redis refused the client's credentials: wrong password, or wrong or disabled user (check them in the client's options): %w", who, err)}
	case AuthError(err):
		return &namedError{Errorf(redsem.ErrInvalidConfig, "redsem: %s: Redis refused the request without authentication (set the password, and the user, in the client's options): %w", who, err)}
	}
	if msg, ok := strings.CutPrefix(err.Error(), "ERR redsem: "); ok {
		// A script's refusal (the Lua library's fail): said after one prefix.
		err = &retold{msg: msg, err: err}
	}
	return &namedError{fmt.Errorf("redsem: %s: %w", who, err)}
}

// JoinLine is errors.Join on one line: the errors' texts separated by
// "; " (errors.Join puts a newline between them, which breaks one-line
// logs), with one prefix: after the first, a text loses its "redsem: "
// and the semaphore's name if the first said it (`redsem: "db": gave up:
// context deadline exceeded; Redis unavailable: dial tcp ...`). It matches
// (errors.Is, errors.As) whatever any of them matches.
func JoinLine(errs ...error) error {
	var j lineErrors
	for _, err := range errs {
		if err != nil {
			j = append(j, err)
		}
	}
	if len(j) == 0 {
		return nil
	}
	return j
}

type lineErrors []error

func (j lineErrors) Error() string {
	parts := make([]string, len(j))
	lead := "" // the first text's name: `"db": `, `family "t", key "k": `
	for i, err := range j {
		s := err.Error()
		if i == 0 {
			if rest, ok := strings.CutPrefix(s, "redsem: "); ok {
				lead = leadName(rest)
			}
		} else if rest, ok := strings.CutPrefix(s, "redsem: "); ok {
			if lead != "" {
				rest = strings.TrimPrefix(rest, lead)
			}
			s = rest
		}
		parts[i] = s
	}
	return strings.Join(parts, "; ")
}

func (j lineErrors) Unwrap() []error { return j }

// namedError is an error that wrap or ctxErr made: it names the semaphore
// already, and wrap leaves it as it is.
type namedError struct{ err error }

func (e *namedError) Error() string { return e.err.Error() }
func (e *namedError) Unwrap() error { return e.err }

// own reports whether err is one the library made (by its type or the
// sentinel it matches, never by its text: package sentinel knows every
// sentinel the library declares): acquireErr and Wrap add nothing to it.
func own(err error) bool {
	var n *namedError
	var r *ReplyError
	if errors.As(err, &n) || errors.As(err, &r) {
		return true
	}
	return sentinel.Own(err)
}

// AuthError reports whether err is Redis refusing a connection that is not
// authenticated: NOAUTH, WRONGPASS (the client's credentials are wrong),
// or the "unauthenticated multibulk length" with which it closes one that
// sent a long request first.
func AuthError(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "WRONGPASS") ||
		strings.Contains(msg, "unauthenticated")
}

// ReplyError reports a script reply that does not have the expected shape
// (a server that is not Redis, or scripts of another version).
type ReplyError struct {
	Script string
	Reply  []any
	Reason string
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("redsem: unexpected %s reply (%s): %.200v", e.Script, e.Reason, e.Reply)
}

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
	if lostConn(err) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || replyIs(err, inTransition)
}

// connLost are the errors of a connection refused, reset, closed (EOF) or
// with no route: the list that Transient and Unreachable share.
var connLost = []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
	syscall.EHOSTUNREACH, syscall.ENETUNREACH}

// notServing are the replies of a server that cannot serve at all now;
// inTransition adds those of a server (or cluster) changing roles, worth
// another try too.
var (
	notServing   = []string{"LOADING", "MASTERDOWN"}
	inTransition = append([]string{"READONLY", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"}, notServing...)
)

// lostConn reports whether err is one of connLost.
func lostConn(err error) bool {
	for _, target := range connLost {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// replyIs reports whether err is a Redis error reply that begins with one
// of prefixes.
func replyIs(err error, prefixes []string) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range prefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// DialFailed reports whether err is a failed dial (nothing was sent).
func DialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
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
	return err != nil && (lostConn(err) || DialFailed(err) || replyIs(err, notServing))
}

// notSent is the error of a request that never left: the dial gate
// (dialWatch.ready) refused it before go-redis saw it, so Redis cannot have
// run it and nothing needs undoing. It matches what it wraps (a failed
// dial: Unreachable, ErrUnavailable once wrapped).
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// NeverSent reports whether err says its request never left (notSent).
func NeverSent(err error) bool {
	var n notSent
	return errors.As(err, &n)
}

// Replies that tell what a server can do (its version, its ACL, a proxy in
// front of it), which the engine adapts to.

// noReadOnlyScripts reports whether err is a server without read-only
// scripts (Redis before 7.0 has no EVALSHA_RO; miniredis counts TIME as a
// write in a read-only script).
func noReadOnlyScripts(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "not allowed in read-only scripts") ||
		strings.Contains(err.Error(), "unknown command"))
}

// NoCommand reports whether err is a server without the command it was
// sent (CONFIG GET on miniredis, some proxies), in any case.
func NoCommand(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// functionGone reports whether err is an FCALL whose library the server no
// longer has (a restart without persistence, FUNCTION FLUSH), or that it
// refuses for good (refused): the client loads the library again, or runs
// the scripts by their SHA1.
func functionGone(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "Function not found") || Refused(err))
}

// LibraryExists reports whether err is a FUNCTION LOAD of a library the
// server has already (of that name, so of that text: its name is its hash).
func LibraryExists(err error) bool {
	return err != nil && strings.Contains(err.Error(), "already exists")
}

// Refused reports whether err is a server refusing FUNCTION for good: an
// unknown command (Redis before 7, miniredis, a command renamed away), an
// ACL, or a managed service or proxy that disables it. Only a reply of the
// server can say so (a network error or a timeout is tried again), and its
// leading code word decides, not the words of its message: NOPERM is a
// refusal; ERR (or a reply without a code) is one when its message names
// an unknown or disabled command; any other code is the server's state
// (MISCONF after a failed save, whose message says that writes "are
// disabled", OOM, LOADING, BUSY, READONLY, MASTERDOWN, CLUSTERDOWN, ...)
// and is tried again after bounds.LibRetry. Taking a passing state for a refusal
// would keep the client on EVALSHA for its life; the other mistake costs
// one failed FUNCTION LOAD per bounds.LibRetry.
func Refused(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	code, rest := replyCode(msg)
	if code == "ERR" {
		if inner, _ := replyCode(rest); inner != "" {
			code = inner // a proxy that puts ERR before the server's code (as KVRocks does)
		}
	}
	switch code {
	case "NOPERM":
		return true
	case "ERR", "":
		msg = strings.ToLower(msg)
		for _, s := range []string{"unknown command", "unknown subcommand", "unsupported command", "no permissions", "disabled", "not allowed"} {
			if strings.Contains(msg, s) {
				return true
			}
		}
	}
	return false
}

// replyCode splits an error reply into its code (the leading word, when it
// is two or more capital letters, as Redis's ERR, NOPERM, MISCONF, OOM are)
// and the rest of the message; code is "" for a reply without one.
func replyCode(msg string) (code, rest string) {
	word, rest, _ := strings.Cut(msg, " ")
	if len(word) < 2 {
		return "", msg
	}
	for i := 0; i < len(word); i++ {
		if word[i] < 'A' || word[i] > 'Z' {
			return "", msg
		}
	}
	return word, rest
}

// totalMismatch is the error of a script's codeTotalDiffer reply, whose
// established total is other: this client's total differs from the one
// its family counts, or it has none.
func (d *Door) totalMismatch(other int64) error {
	if d.Total == 0 {
		return Errorf(redsem.ErrLimitMismatch, "redsem: total mismatch for family %q: this client was built without a total "+
			"(FamilyOptions.Total 0), but the family counts one (%d in force; 0: none, counting goes on): "+
			"its leases would not be counted; build every client of the family with its Total",
			d.FamName, other)
	}
	return Errorf(redsem.ErrLimitMismatch, "redsem: total mismatch for family %q: this client was built with total %d, "+
		"but live clients established total %d (use SetTotal to change it for all)",
		d.FamName, d.Total, other)
}

// uncounted is the error of renew.lua's codeUncounted reply: a resume, by
// a client with its family's total, of lease id, which the family does not
// count.
func (d *Door) uncounted(id string) error {
	return Errorf(redsem.ErrLimitMismatch, "redsem: lease %s of family %q was granted before the family "+
		"counted a total (by a client without one): it is not in the count, and a client with the total "+
		"cannot take it over; it ends when its holders release it or stop renewing it", id, d.FamName)
}
