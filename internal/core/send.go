package core

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/lua"
)

// How a script call reaches Redis, the one door for all of them: run sends
// a script (as a function of the library once loaded, else EVALSHA, or EVAL
// the first time), through the client's dial gate (dialWatch.ready), bounded
// by the caller's context (bounded), and records whether Redis answered
// (reached, unreachable). The typed calls of protocol.go use nothing else.

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
// semaphore scripts only through run; package fencing and the tests use
// this for the rest.
func Script(s lua.Script) *redis.Script { return scripts[s] }

// run calls script s on c with the semaphore's keys and ARGV: the common
// prefix (channel base, publish command, limit and the client's rate: see
// limitArg), then args. It returns the reply, when the request left, and
// the error as the client (or ctx) reported it: each protocol call decides
// how to report it.
//
// It runs s as a function of the library once the client loaded it (FCALL;
// functions.go), else with EVALSHA; status.lua, which writes nothing, runs
// with FCALL_RO or EVALSHA_RO so that it may run on a read-only replica.
//
// The call returns once ctx ends, whatever the client does: go-redis honours
// a context's deadline only on clients built with ContextTimeoutEnabled, and
// retries a failed command on its own, so the command runs on a goroutine of
// its own and is abandoned (its reply ignored) when ctx ends first. What an
// abandoned request may still do in Redis is made harmless by the scripts:
// see undo.
func (e *Engine) run(ctx context.Context, c redis.Scripter, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, e.keys.Chan, e.pub, e.limitArg(limit))
	argv = append(argv, args...)
	keys := e.keys.Script()
	sent := time.Now()
	call := func() ([]any, error) {
		if v, ok, err := e.fcall(ctx, c, s, argv); ok {
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
		} else if loaded := e.loaded(s); !loaded.Load() {
			// The engine's first call of this script sends it whole (EVAL
			// caches it on the server): one round trip, where EVALSHA
			// would take two on a server that has not seen it (NOSCRIPT,
			// then EVAL). Later calls send its SHA1.
			cmd = script.Eval(ctx, c, keys, argv...)
			if err := cmd.Err(); err == nil {
				loaded.Store(true)
			} else if Unreachable(err) && !dialFailed(err) && ctx.Err() == nil {
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
	if err := e.alerts.ready(ctx); err != nil {
		e.answered(sent, err)
		return nil, sent, notSent{err}
	}
	v, err := bounded(ctx, call)
	e.answered(sent, err)
	if err == nil {
		e.loadLibrary()
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
func (e *Engine) fcall(ctx context.Context, c redis.Scripter, s lua.Script, argv []any) (v []any, ok bool, err error) {
	fn := s.Function()
	f, can := c.(fcaller)
	if fn == "" || !can || !e.lib.ready() {
		return nil, false, nil
	}
	var cmd *redis.Cmd
	if s == lua.Status || s == lua.FamilyStatus {
		cmd = f.FCallRO(ctx, fn, e.keys.Script(), argv...)
	} else {
		cmd = f.FCall(ctx, fn, e.keys.Script(), argv...)
	}
	v, err = cmd.Slice()
	if functionGone(err) {
		e.lib.mode.CompareAndSwap(libReady, libUnknown)
		e.loadLibrary()
		return nil, false, nil
	}
	return v, true, err
}

// limitArg is ARGV[3] of a script call: the limit, and the client's rate
// if it has one ("limit:rate_limit:per_ms", the Lua library's client_arg).
func (e *Engine) limitArg(limit int) any {
	var s string
	if r := e.cfg.Rate; !r.IsZero() {
		s = strconv.Itoa(limit) + ":" + strconv.Itoa(r.Limit) + ":" + strconv.FormatInt(ms(r.Per), 10)
	} else if e.keys.Fam == nil {
		return limit
	} else {
		s = strconv.Itoa(limit)
	}
	if e.keys.Fam != nil {
		// A member of a family with a total: its client's total and variant.
		s += "+" + strconv.Itoa(e.fam.total) + ":" + e.waiting.tag()
	}
	return s
}

// loaded is the flag that says the engine (its family, for a member) sent
// script s whole once already.
func (e *Engine) loaded(s lua.Script) *atomic.Bool {
	if e.fam != nil {
		e = e.fam.root
	}
	return &e.sent[s]
}

// bounded runs call and returns its result, or ctx's error as soon as ctx
// ends while call still runs (call then finishes on its own; its result is
// dropped). A context that can never end costs no goroutine.
func bounded(ctx context.Context, call func() ([]any, error)) ([]any, error) {
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

// boundedErr is bounded for a call that returns only an error.
func boundedErr(ctx context.Context, call func() error) error {
	_, err := bounded(ctx, func() ([]any, error) { return nil, call() })
	return err
}
