// Package wire is the script boundary of the engine: every semaphore script
// as one typed Go call (calls.go), the one way such a call reaches Redis
// (Door.runScript: FCALL, EVALSHA or EVAL, bounded by the caller's context), the
// decoding of script replies and channel messages (decode.go), the
// server's clock (clock.go) and what every error of a call means
// (errors.go).
//
// It holds no engine, no hub and no logging: a call returns its reply
// (the grants a script made among it, for the caller to hand to its
// waiters) and its error, classified by pure functions. What a request
// learnt of Redis (it answered, or could not be reached) goes to the
// engine through Watch, which raises and clears the alerts; the dial gate
// is asked there too.
package wire

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/lua"
)

// Watch is what a Door tells of each request and asks before it: the
// engine's side of the boundary (alerts, the dial gate, the library load).
// A Door calls it where a request leaves and where it comes back, and
// nowhere else.
type Watch interface {
	// Ready is the client's dial gate: nil when a request may go to
	// go-redis now, else the failed dial that says it would not get
	// through.
	Ready(ctx context.Context) error
	// Answered is what a request sent at sent learnt of Redis: that it
	// answered (err nil, or an error of the request), or that it could not
	// be reached (err matches Unreachable).
	Answered(sent time.Time, err error)
	// Used says that a script call got a reply, or found the FUNCTION
	// library gone: the engine loads the library (in the background) if
	// that is due (Library).
	Used()
}

// Door is one semaphore's (or a family total's) door to Redis: what its
// script calls need, fixed when the engine is made. Its methods are the
// typed calls of calls.go; nothing else runs a script of the engine.
type Door struct {
	Client redis.UniversalClient
	Keys   []string // the keys the scripts get (Keys.Script)
	Chan   string   // channel base: ARGV[1]
	Pub    string   // PUBLISH, or SPUBLISH on a cluster: ARGV[2]

	// The config values the calls send.
	Limit      int
	Rate       redsem.Rate // the client's rate (ARGV[3], limitArg)
	LeaseTTL   time.Duration
	QueueTTL   time.Duration
	Fallback   time.Duration
	Owner      string
	MaxWaiters int
	// TotalArg is what a member of a family with a total adds to ARGV[3]:
	// "+" the client's total ":" the variant's tag ("f" or "u"); "" for
	// any other semaphore.
	TotalArg string

	// How errors name the semaphore: Who (the engine's who), Name and
	// Family (a *redsem.LimitMismatchError's); FamName and Total: the
	// family of a member with a total, for a total mismatch's text.
	Who, Name, Family string
	FamName           string
	Total             int

	Lib   *Library // whether the client's calls use FCALL
	Sent  *Sent    // scripts sent whole once (a family's members share one)
	Watch Watch

	clock serverClock
}

// Sent holds, per script, whether an engine (its family, for a member) sent
// it whole once already: later calls send its SHA1.
type Sent struct {
	s [lua.Count]atomic.Bool // by Script
}

// scripts holds the one *redis.Script of each lua.Script: built once, never
// reassigned, and reachable only inside the module.
var scripts = func() map[lua.Script]*redis.Script {
	m := make(map[lua.Script]*redis.Script)
	for _, s := range lua.Scripts() {
		m[s] = redis.NewScript(s.Source())
	}
	return m
}()

// Script returns the runnable script for s (EVALSHA with a fallback to EVAL
// when the server's script cache was emptied). The engine calls the
// semaphore scripts only through a Door; package fencing and the tests use
// this for the rest.
func Script(s lua.Script) *redis.Script { return scripts[s] }

// runScript calls script s on c with the semaphore's keys and ARGV: the common
// prefix (channel base, publish command, limit and the client's rate: see
// limitArg), then args. It returns the reply, when the request left, and
// the error as the client (or ctx) reported it: each typed call decides
// how to report it.
//
// It runs s as a function of the library once the client loaded it (FCALL;
// Library), else with EVALSHA; status.lua, which writes nothing, runs
// with FCALL_RO or EVALSHA_RO so that it may run on a read-only replica.
//
// The call returns once ctx ends, whatever the client does: go-redis honours
// a context's deadline only on clients built with ContextTimeoutEnabled, and
// retries a failed command on its own, so the command runs on a goroutine of
// its own and is abandoned (its reply ignored) when ctx ends first. What an
// abandoned request may still do in Redis is made harmless by the scripts:
// see the engine's undoLater.
func (d *Door) runScript(ctx context.Context, c redis.Scripter, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, d.Chan, d.Pub, d.limitArg(limit))
	argv = append(argv, args...)
	keys := d.Keys
	sent := time.Now()
	call := func() ([]any, error) {
		if v, ok, err := d.fcall(ctx, c, s, argv); ok {
			return v, err
		}
		var cmd *redis.Cmd
		script := Script(s)
		if s == lua.Status || s == lua.FamilyStatus {
			cmd = script.RunRO(ctx, c, keys, argv...)
			if err := cmd.Err(); noReadOnlyScripts(err) {
				// Redis before 7.0 has no EVALSHA_RO, and miniredis counts
				// TIME as a write in a read-only script; status.lua writes
				// nothing, so run it as a plain script.
				cmd = script.Run(ctx, c, keys, argv...)
			}
		} else if loaded := &d.Sent.s[s]; !loaded.Load() {
			// The engine's first call of this script sends it whole (EVAL
			// caches it on the server): one round trip, where EVALSHA
			// would take two on a server that has not seen it (NOSCRIPT,
			// then EVAL). Later calls send its SHA1.
			cmd = script.Eval(ctx, c, keys, argv...)
			if err := cmd.Err(); err == nil {
				loaded.Store(true)
			} else if Unreachable(err) && !DialFailed(err) && ctx.Err() == nil {
				// A server can close the connection while the whole script
				// is still being written (one that requires a password
				// closes an unauthenticated connection that sends more
				// than 16 KiB), and the client sees only a reset: the
				// SHA1, a small command, gets the server's reply (the
				// authentication error; or NOSCRIPT, then EVAL). Not after
				// a failed dial: nothing was written, and go-redis's
				// retries would only run again. The pool may hand out
				// another connection the server closed the same way (it
				// replied, then closed): each try drops one, so a few tries
				// reach a live connection or a failed dial.
				_ = onLiveConn(ctx, func() error {
					cmd = script.Run(ctx, c, keys, argv...)
					return cmd.Err()
				})
			}
		} else {
			cmd = script.Run(ctx, c, keys, argv...)
		}
		return cmd.Slice()
	}
	if err := d.Watch.Ready(ctx); err != nil {
		d.Watch.Answered(sent, err)
		return nil, sent, notSent{err}
	}
	v, err := Bounded(ctx, call)
	d.Watch.Answered(sent, err)
	if err == nil {
		d.Watch.Used()
	}
	return v, sent, err
}

// fcaller is the part of a client or connection that calls functions.
type fcaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
	FCallRO(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

// fcall runs script s as a function on c when the library is loaded;
// ok is false when it did not (not loaded, c cannot, or the server no longer
// has the library), and the caller then runs it with EVALSHA.
func (d *Door) fcall(ctx context.Context, c redis.Scripter, s lua.Script, argv []any) (v []any, ok bool, err error) {
	fn := s.Function()
	f, can := c.(fcaller)
	if fn == "" || !can || !d.Lib.Ready() {
		return nil, false, nil
	}
	var cmd *redis.Cmd
	if s == lua.Status || s == lua.FamilyStatus {
		cmd = f.FCallRO(ctx, fn, d.Keys, argv...)
	} else {
		cmd = f.FCall(ctx, fn, d.Keys, argv...)
	}
	v, err = cmd.Slice()
	if functionGone(err) {
		d.Lib.mode.CompareAndSwap(LibReady, LibUnknown)
		d.Watch.Used()
		return nil, false, nil
	}
	return v, true, err
}

// limitArg is ARGV[3] of a script call: the limit, and the client's rate
// if it has one ("limit:rate_limit:per_ms", the Lua library's client_arg),
// then, for a member of a family with a total, TotalArg.
func (d *Door) limitArg(limit int) any {
	var s string
	if r := d.Rate; !r.IsZero() {
		s = strconv.Itoa(limit) + ":" + strconv.Itoa(r.Limit) + ":" + strconv.FormatInt(ms(r.Per), 10)
	} else if d.TotalArg == "" {
		return limit
	} else {
		s = strconv.Itoa(limit)
	}
	return s + d.TotalArg
}

// onLiveConn runs send, a request safe to send twice (TIME, a script's
// SHA1 after its body was cut off), again while it fails on a connection
// the server had closed (EOF or a reset, not a failed dial) and ctx lives:
// go-redis's pool may hand out such a connection once (a server that
// replied to an unauthenticated client, then closed its connection), and
// each failure drops one. Three tries at most; a client with MaxRetries
// set already retries these itself.
func onLiveConn(ctx context.Context, send func() error) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = send(); !Unreachable(err) || DialFailed(err) || ctx.Err() != nil {
			break
		}
	}
	return err
}

// Bounded runs call and returns its result, or ctx's error as soon as ctx
// ends while call still runs (call then finishes on its own; its result is
// dropped). A context that can never end costs no goroutine.
func Bounded(ctx context.Context, call func() ([]any, error)) ([]any, error) {
	if ctx.Done() == nil {
		return call()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		v   []any
		err error
	}
	ch := make(chan result, 1)
	inRunner(func() {
		v, err := call()
		ch <- result{v, err}
	})
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// inRunner runs job on a goroutine of its own: an idle runner's, or a new one.
// A runner waits bounds.RunnerIdle for its next job before it ends, so that calls
// in a row reuse one goroutine whose stack has already grown through
// go-redis's, instead of each starting a goroutine that grows it anew
// (copying the stack several times: a sixth of the client's CPU time in an
// uncontended TryAcquire and Release, by pprof).
func inRunner(job func()) {
	select {
	case jobs <- job:
	default:
		go runner(job)
	}
}

// jobs hands a job to an idle runner (unbuffered: only to one that waits).
var jobs = make(chan func())

func runner(job func()) {
	t := time.NewTimer(bounds.RunnerIdle)
	defer t.Stop()
	for {
		job()
		job = nil
		t.Reset(bounds.RunnerIdle)
		select {
		case job = <-jobs:
		case <-t.C:
			return
		}
	}
}

// BoundedErr is Bounded for a call that returns only an error.
func BoundedErr(ctx context.Context, call func() error) error {
	_, err := Bounded(ctx, func() ([]any, error) { return nil, call() })
	return err
}
