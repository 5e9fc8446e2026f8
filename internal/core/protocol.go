package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/lua"
)

// The protocol: every semaphore script as one typed Go call. Each call
// below states the script's arguments (after the common prefix that run
// adds), decodes its reply, and turns its reply codes into the library's
// errors, next to each other; the lua package's file headers say the same
// from the script's side, and protocol_test.go checks that the codes and
// refusals the scripts return are the ones declared here. The engine calls
// scripts only through these functions, and they run them only through run.
//
//	script          call          reply (after decoding)
//	acquire.lua     e.acquire     acquireReply: granted (slots, token, deadline) or not (hint, place, rate wait, floor); codes below
//	renew.lua       e.renew       renewReply: renewed with a new deadline (and, for Resume, the lease's token and slots), gone, or released by a holder
//	release.lua     e.release     releaseReply: what was released, how many waiters it admitted
//	                e.releaseExpired   the same, for a lease given up at its deadline
//	heartbeat.lua   e.heartbeat   heartbeatReply: session alive, expiry hint
//	status.lua      e.status      redsem.Status
//	setlimit.lua    e.setLimit    (grants it made)
//	setrate.lua     e.setRate     (grants it made)
//	settotal.lua    f.setTotal    (grants it made): on a family's keys, not a member's
//	famstatus.lua   f.status      redsem.FamilyStatus: on a family's keys
//
// Grants that a script made to waiters of this process come back in its
// reply too (a grant list, decodeGrants); the call hands them to their
// waiters at once (deliverGrants), without waiting for the pub/sub message.

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
			if err := cmd.Err(); err != nil && (strings.Contains(err.Error(), "not allowed in read-only scripts") ||
				strings.Contains(err.Error(), "unknown command")) {
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
		return nil, sent, err
	}
	v, err := bounded(ctx, call)
	if err == nil {
		e.reached(sent)
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
	if err != nil && (strings.Contains(err.Error(), "Function not found") || refused(err)) {
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
		v := ":u"
		if e.cfg.Fair {
			v = ":f"
		}
		s += "+" + strconv.Itoa(e.fam.total) + v
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
	go func() {
		v, err := call()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// boundedErr is bounded for a call that returns only an error.
func boundedErr(ctx context.Context, call func() error) error {
	_, err := bounded(ctx, func() ([]any, error) { return nil, call() })
	return err
}

// ---- acquire.lua ----

// acquireArgs are acquire.lua's own arguments (ARGV[4..]).
type acquireArgs struct {
	id          string // ARGV[4]: the lease or waiter id
	n           int    // ARGV[5]: slots wanted
	mode        string // ARGV[7]: "try", "wait" or "queue" (ARGV[6] is the lease TTL)
	sid         string // ARGV[8]: queue mode: the session ("-" otherwise)
	refuseAfter int64  // ARGV[12]: server ms after which it writes nothing; 0 none
	// ARGV[9] grant TTL (3 x Fallback), ARGV[10] owner, ARGV[11] MaxWaiters: from the config.
}

// Reply codes of acquire.lua (its reply's first element), each with what
// the rest of its reply holds and the error it means (acquire).
const (
	codeGranted     = 1  // now, token, deadline_ms, slot...
	codeQueued      = 0  // not granted (queued or not): now, hint, position [, rate_ms, rate limit, per_ms [, floor]]
	codeMismatch    = -1 // now, established limit: *redsem.LimitMismatchError
	codeCancelled   = -2 // now: errCancelled (nothing written)
	codeWeight      = -3 // now, limit [, rate limit]: redsem.ErrWeight
	codeQueueFull   = -4 // now, entries: redsem.ErrQueueFull
	codeSessionDied = -5 // now: errSessionDied (queue mode: the session is not live)
	codeRateDiffers = -6 // now, "limit/per_ms": *redsem.RateMismatchError
	codeTotalDiffer = -7 // now, established total: a family's total mismatch (matches redsem.ErrLimitMismatch)
)

// acquireCodes names every reply code of acquire.lua (protocol_test.go
// holds the scripts to it).
var acquireCodes = map[int64]string{
	codeGranted: "granted", codeQueued: "not granted", codeMismatch: "limit mismatch", codeCancelled: "cancelled",
	codeWeight: "too heavy", codeQueueFull: "queue full", codeSessionDied: "session died", codeRateDiffers: "rate mismatch",
	codeTotalDiffer: "total mismatch",
}

// errCancelled is acquire.lua's "this id was cancelled by its own undo, or
// the request came after its caller's deadline": nothing was written.
var errCancelled = errors.New("redsem: acquire cancelled by its own undo")

// errSessionDied is acquire.lua's and heartbeat.lua's "the session is not
// live": its process paused or was cut off for longer than QueueTTL.
var errSessionDied error = sessionError{}

type sessionError struct{}

func (sessionError) Error() string { return "redsem: fair session died" }

// acquireReply is one run of acquire.lua, decoded.
type acquireReply struct {
	code     int64
	now      int64 // server ms
	token    int64
	slots    []int
	deadline time.Time // granted: local estimate, never late
	until    int64     // granted: the deadline in Redis, server ms
	hint     int64     // not granted: ms until a holder may expire (or the rate lets a request in), -1 none
	position int64     // not granted: place in the queue, -1 not queued
	rateMs   int64     // not granted: a slot was free but the rate's window was full: ms until it has room; -1 not so
	other    int64     // mismatch: established limit; weight: limit; queue full: entries
	rateMax  int64     // weight: the rate's limit in force (0: none)
	totalMax int64     // weight: the family's total in force (0: not given)
	rate     string    // rate mismatch: the established rate, "limit/per_ms"
	// rateInForce: not granted with rateMs >= 0: the rate in force
	rateInForce redsem.Rate
	// floor: queue mode, not granted: every grant made before this attempt
	// ran has a token at most floor, every grant made after it a greater
	// one (acquire.lua's max(_token, now_us - 1)).
	floor int64
}

// acquire runs acquire.lua once. A reply code that is an error comes back
// as that error, with the reply. Its errors are raw (not named): the
// acquire call classifies them once, at its end.
func (e *Engine) acquire(ctx context.Context, a acquireArgs) (acquireReply, error) {
	sid := a.sid
	if sid == "" {
		sid = "-"
	}
	v, sent, err := e.run(ctx, e.cfg.Client, lua.Acquire, e.cfg.Limit, a.id, a.n, ms(e.cfg.LeaseTTL), a.mode, sid,
		ms(3*e.cfg.Fallback), e.cfg.Owner, e.cfg.MaxWaiters, a.refuseAfter)
	if err != nil {
		return acquireReply{}, err
	}
	r, err := decodeAttempt(v, sent)
	if err != nil {
		return r, err
	}
	e.clock.observe(sent, r.now)
	switch r.code {
	case codeMismatch:
		return r, &redsem.LimitMismatchError{Name: e.cfg.Name, Family: e.familyName(), Client: e.cfg.Limit, Established: int(r.other)}
	case codeRateDiffers:
		return r, &redsem.RateMismatchError{Name: e.cfg.Name, Family: e.familyName(), Client: e.cfg.Rate, Established: parseRate(r.rate)}
	case codeTotalDiffer:
		if e.fam.total == 0 {
			return r, errorf(redsem.ErrLimitMismatch, "redsem: total mismatch for family %q: this client was built without a total "+
				"(FamilyOptions.Total 0), but the family counts one (%d in force; 0: none, counting goes on): "+
				"its leases would not be counted; build every client of the family with its Total",
				e.fam.Name(), r.other)
		}
		return r, errorf(redsem.ErrLimitMismatch, "redsem: total mismatch for family %q: this client was built with total %d, "+
			"but live clients established total %d (use SetTotal to change it for all)",
			e.fam.Name(), e.fam.total, r.other)
	case codeWeight:
		if r.totalMax > 0 && int64(a.n) > r.totalMax {
			return r, errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the family's total in force is %d", e.who(), a.n, r.totalMax)
		}
		if int64(a.n) <= r.other && r.rateMax > 0 {
			return r, errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the rate in force grants %d per period", e.who(), a.n, r.rateMax)
		}
		return r, errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the limit in force is %d", e.who(), a.n, r.other)
	case codeQueueFull:
		return r, errorf(redsem.ErrQueueFull, "redsem: %s: queue full: %d waiters queued (Options.MaxWaiters)", e.who(), r.other)
	case codeCancelled:
		return r, errCancelled
	case codeSessionDied:
		return r, errSessionDied
	}
	return r, nil
}

// refuseAfter is the server time (ms) after which an acquire request of a
// call with ctx must write nothing, 0 for none. A request that reaches
// Redis after its caller gave up (held in the network, or behind a paused
// server) must write nothing, even once its undo's cancellation record is
// gone: the script is told when that is, the context's deadline in server
// time, with a second's margin for the clocks' drift. A context without a
// deadline (or cancelled long before it) relies on the cancellation record
// alone.
func (e *Engine) refuseAfter(ctx context.Context) (int64, error) {
	return e.refuseAfterMargin(ctx, 1000)
}

// settingMargin is the margin (ms) of a setting's refuse_after (setCall):
// a SetLimit, SetRate or SetTotal that reaches Redis more than this after
// its caller's deadline changes nothing. Small, since a refusal while the
// caller still waits (a server clock stepped forward) is asked again.
const settingMargin = 50

// refuseAfterMargin is refuseAfter with margin ms after the deadline.
func (e *Engine) refuseAfterMargin(ctx context.Context, margin int64) (int64, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	s, known := e.clock.serverAt(d)
	if !known {
		// Once per Engine: the first call has no reply to go by. A failure
		// to reach Redis is the acquire's; any other error leaves this one
		// request bounded by its cancellation record only.
		if err := e.readClock(ctx); err != nil && (ctx.Err() != nil || Transient(err)) {
			return 0, err
		}
		if s, known = e.clock.serverAt(d); !known {
			return 0, nil
		}
	}
	return s + margin, nil
}

// grant is the grant of a granted reply.
func (a acquireReply) grant() grant {
	return grant{token: a.token, slots: a.slots, deadline: a.deadline, until: a.until}
}

// decodeAttempt checks and decodes an acquire.lua reply; sent is when the
// request left.
func decodeAttempt(v []any, sent time.Time) (acquireReply, error) {
	r := reader{script: "acquire", v: v}
	a := acquireReply{code: r.int(), now: r.int()}
	switch a.code {
	case codeGranted:
		a.token = r.int()
		a.until = r.int()
		for r.more() {
			a.slots = append(a.slots, int(r.int()))
		}
		if len(a.slots) == 0 {
			r.fail("no slots")
		}
		a.deadline = expiresBy(sent, a.until-a.now)
	case codeQueued:
		a.hint, a.position, a.rateMs = r.int(), r.int(), -1
		if r.more() {
			a.rateMs = r.int()
		}
		if r.more() {
			a.rateInForce = redsem.Rate{Limit: int(r.int()), Per: time.Duration(r.int()) * time.Millisecond}
		}
		if r.more() {
			a.floor = r.int()
		}
	case codeWeight:
		a.other = r.int()
		if r.more() {
			a.rateMax = r.int()
		}
		if r.more() {
			a.totalMax = r.int()
		}
	case codeMismatch, codeQueueFull, codeTotalDiffer:
		a.other = r.int()
	case codeRateDiffers:
		a.rate = r.str()
	case codeCancelled, codeSessionDied:
	default:
		r.fail("unknown code")
	}
	return a, r.err
}

// ---- renew.lua ----

// renewReply is renew.lua's reply: 1 (renewed) with the lease's deadline,
// 0 (the lease is gone) or 2 (gone: a holder released it, in this process
// or in one that resumed it); with resume, also the lease's token and
// slots.
type renewReply struct {
	ok       bool
	released bool      // gone, released by a holder
	deadline time.Time // ok: local estimate, never late
	until    int64     // ok: the deadline in Redis, server ms
	token    int64     // resume
	slots    []int     // resume
}

// renew runs renew.lua for id (ARGV[4]) with the lease TTL (ARGV[5]) on c:
// the client, or one connection (replicas.go waits on the same connection
// for replica acknowledgement). It never re-creates a lost lease. With
// resume (ARGV[6] "resume", for Resume) the reply carries the lease's
// token and slots too.
func (e *Engine) renew(ctx context.Context, c redis.Scripter, id string, resume bool) (renewReply, error) {
	args := []any{id, ms(e.cfg.LeaseTTL)}
	if resume {
		args = append(args, "resume", e.cfg.Owner) // the lease's owner is now this process
	}
	v, sent, err := e.run(ctx, c, lua.Renew, e.cfg.Limit, args...)
	if err != nil {
		return renewReply{}, e.callErr(ctx, err)
	}
	r := reader{script: "renew", v: v}
	code, now := r.int(), r.int()
	var out renewReply
	switch code {
	case 1:
		out.ok, out.until = true, r.int()
		if resume {
			out.token, out.slots = r.int(), r.slots()
		}
	case 0:
	case 2:
		out.released = true
	default:
		r.fail("unknown code")
	}
	if r.err != nil {
		return renewReply{}, e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	if out.ok {
		out.deadline = expiresBy(sent, out.until-now)
	}
	return out, nil
}

// ---- release.lua ----

// Kinds of release that release.lua reports.
const (
	ReleasedNothing = 0 // nothing live had the id (a lease: it was lost)
	ReleasedLease   = 1
	ReleasedWaiter  = 2
	// Mode "expire" only: another process took a handle of the lease
	// (Resume) and may still hold it (heldElsewhere), or a holder released
	// it (releasedElsewhere); nothing changed.
	heldElsewhere     = 3
	releasedElsewhere = 4
)

// releaseReply is release.lua's reply: what it released, and how many
// waiters it admitted into the freed slots (their grants follow in the
// reply).
type releaseReply struct {
	kind     int
	admitted int
}

// release runs release.lua for id (ARGV[4]) in mode (ARGV[5]: "owner",
// "undo" or "force") and hands the grants it made to local waiters. A
// tombstone or cancellation record lives LeaseTTL (ARGV[6]; release.lua
// caps it at 15 s): a request delayed or retried longer than that would
// find a lease that expired anyway.
func (e *Engine) release(ctx context.Context, id, mode string) (releaseReply, error) {
	return e.runRelease(ctx, id, mode, ms(e.cfg.LeaseTTL))
}

// releaseExpired runs release.lua in mode "expire" for a lease whose
// handle in this process was lost at its local deadline: it releases the
// lease unless another process took a handle of it (Resume), whose holder
// may still hold it (heldElsewhere), or a holder released it already
// (releasedElsewhere).
func (e *Engine) releaseExpired(ctx context.Context, id string) (releaseReply, error) {
	return e.runRelease(ctx, id, "expire", 0)
}

func (e *Engine) runRelease(ctx context.Context, id, mode string, arg int64) (releaseReply, error) {
	v, sent, err := e.run(ctx, e.cfg.Client, lua.Release, e.cfg.Limit, id, mode, arg)
	if err != nil {
		return releaseReply{}, e.callErr(ctx, err)
	}
	r := reader{script: "release", v: v}
	k, now := r.int(), r.int()
	if r.err != nil {
		return releaseReply{}, e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	e.deliverGrants("release", v, 2, now, sent)
	return releaseReply{kind: int(k), admitted: (len(v) - 2) / 4}, nil
}

// ---- heartbeat.lua ----

// heartbeatReply is heartbeat.lua's reply: whether the session was alive
// (else it is not renewed: errSessionDied), and the expiry hint of the
// semaphore it ran on (ms until its earliest holder may expire, -1 none).
type heartbeatReply struct {
	alive bool
	hint  int64
}

// heartbeat runs heartbeat.lua for session sid (ARGV[4]) with the queue TTL
// (ARGV[5]); age (ARGV[6]) is "new" to make the session, "old" to extend a
// live one. It extends the session (shared by a family's members), admits
// the waiters of e whose turn came, and hands their grants to local
// waiters. A dead session comes back as errSessionDied, with the reply.
func (e *Engine) heartbeat(ctx context.Context, sid, age string, keep []string) (heartbeatReply, error) {
	args := make([]any, 0, 3+len(keep))
	args = append(args, sid, ms(e.cfg.QueueTTL), age)
	for _, k := range keep {
		args = append(args, k)
	}
	v, sent, err := e.run(ctx, e.cfg.Client, lua.Heartbeat, e.cfg.Limit, args...)
	if err != nil {
		return heartbeatReply{}, e.callErr(ctx, err)
	}
	r := reader{script: "heartbeat", v: v}
	now, alive, hint := r.int(), r.int(), r.int()
	if r.err != nil {
		return heartbeatReply{}, e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	e.deliverGrants("heartbeat", v, 3, now, sent)
	hb := heartbeatReply{alive: alive == 1, hint: hint}
	if !hb.alive {
		return hb, errSessionDied
	}
	return hb, nil
}

// ---- status.lua ----

// status runs status.lua (no arguments of its own; read-only).
func (e *Engine) status(ctx context.Context) (redsem.Status, error) {
	v, _, err := e.run(ctx, e.cfg.Client, lua.Status, e.cfg.Limit)
	if err != nil {
		return redsem.Status{}, e.callErr(ctx, err)
	}
	st, err := decodeStatus(v)
	if err != nil {
		return redsem.Status{}, e.wrap(err)
	}
	return st, nil
}

// decodeStatus decodes status.lua's reply: limit, now, the holders (id,
// slots, token, deadline_ms, owner each), the waiters (id, weight,
// deadline_ms, owner each), then the rate (limit, per_ms, granted in the
// window) if one is in force.
func decodeStatus(v []any) (redsem.Status, error) {
	r := reader{script: "status", v: v}
	st := redsem.Status{Limit: int(r.int())}
	r.int() // now
	for k, n := 0, r.count(5); k < n; k++ {
		h := redsem.Holder{ID: r.str()}
		h.Slots = r.slots()
		if len(h.Slots) > 0 {
			h.Slot = h.Slots[0]
		}
		h.Token = r.int()
		h.Deadline = time.UnixMilli(r.int())
		h.Owner = r.str()
		st.Holders = append(st.Holders, h)
	}
	for k, n := 0, r.count(4); k < n; k++ {
		st.Waiters = append(st.Waiters, redsem.Waiter{
			ID: r.str(), Position: k, Weight: int(r.int()), Deadline: time.UnixMilli(r.int()), Owner: r.str(),
		})
	}
	if r.more() {
		st.Rate = redsem.Rate{Limit: int(r.int()), Per: time.Duration(r.int()) * time.Millisecond}
		st.RateGranted = int(r.int())
	}
	return st, r.err
}

// ---- setlimit.lua, setrate.lua ----

// setLimit runs setlimit.lua: the limit is ARGV[3]'s (the common prefix),
// ARGV[4] the call's id (a call re-sent after a lost reply runs once). Its
// reply is now and the grants it made.
func (e *Engine) setLimit(ctx context.Context, limit int) error {
	return e.setCall(ctx, "setlimit", lua.SetLimit, limit, []any{uuid.NewString()})
}

// setCall runs a setting script s (setlimit, setrate, settotal) whose
// own arguments are args (its call id among them), then its refuse_after
// bound (the caller's deadline in server time, plus a margin: a request
// held in the network that reaches Redis after that changes nothing). When
// the call gives up with its context before a reply, the script
// is run again at once, in the background, in its "cancel" mode (same call
// id: only the call's record is written), so that the request, should it
// run after that, changes nothing either: a setting whose caller gave up
// does not undo one made after, unless it reached Redis before its cancel.
func (e *Engine) setCall(ctx context.Context, script string, s lua.Script, limit int, args []any) error {
	var v []any
	var sent time.Time
	var err error
	for try := 0; ; try++ {
		var refuseAfter int64
		if refuseAfter, err = e.refuseAfterMargin(ctx, settingMargin); err != nil {
			return e.callErr(ctx, err)
		}
		argv := append(append([]any{}, args...), refuseAfter)
		if v, sent, err = e.run(ctx, e.cfg.Client, s, limit, argv...); err != nil {
			break
		}
		if refused := len(v) > 0 && v[0] == int64(-1); !refused {
			break
		}
		if try > 0 || ctx.Err() != nil {
			return e.callErr(ctx, fmt.Errorf("%w (the request reached Redis after its deadline)", context.DeadlineExceeded))
		}
		// Refused by refuse_after while the caller still waits: the
		// server's clock stepped forward past the bound (the request was
		// not held up: the caller would have given up). Once more,
		// bounded anew from the refusal's time.
		if len(v) > 1 {
			if now, ok := v[1].(int64); ok {
				e.clock.observe(sent, now)
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			cancelArgv := append(append([]any{}, args...), 0, "cancel")
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelCallBound)
			e.background(bctx, cancel, func(ctx context.Context) {
				_, _, _ = e.run(ctx, e.cfg.Client, s, limit, cancelArgv...)
			})
		}
		return e.callErr(ctx, err)
	}
	return e.grantsReply(script, v, sent)
}

// cancelCallBound bounds the background run that cancels a setting whose
// caller gave up without a deadline (setCall).
const cancelCallBound = 5 * time.Second

// setRate runs setrate.lua: ARGV[4] the call's id, ARGV[5] and ARGV[6] the
// rate's limit and period in ms (0 and 0: no rate). Its reply is now and
// the grants it made.
func (e *Engine) setRate(ctx context.Context, rate redsem.Rate) error {
	return e.setCall(ctx, "setrate", lua.SetRate, e.cfg.Limit, []any{uuid.NewString(), rate.Limit, ms(rate.Per)})
}

// grantsReply decodes a reply of now followed by a grant list and hands
// the grants to local waiters.
func (e *Engine) grantsReply(script string, v []any, sent time.Time) error {
	r := reader{script: script, v: v}
	now := r.int()
	if r.err != nil {
		return e.wrap(r.err)
	}
	e.deliverGrants(script, v, 1, now, sent)
	return nil
}

// parseRate reads a rate as the scripts store it, "limit/per_ms".
func parseRate(s string) redsem.Rate {
	l, p, _ := strings.Cut(s, "/")
	return redsem.Rate{Limit: int(toInt(l)), Per: time.Duration(toInt(p)) * time.Millisecond}
}

// ---- grants ----

// grant is a grant as scripts report it in a grant list, decoded.
type grant struct {
	id       string
	token    int64
	slots    []int
	deadline time.Time
	until    int64 // the deadline in Redis, server ms
	// sid is the session on whose channel a grant message came ("" for a
	// grant in a script reply): the session its waiter was queued under.
	sid string
}

// decodeGrants decodes a grant list (id, token, deadline_ms, "slots", ...)
// from v[from:]; now is the server time of the reply and sent when its
// request left.
func decodeGrants(script string, v []any, from int, now int64, sent time.Time) ([]grant, error) {
	r := reader{script: script, v: v, i: from}
	var out []grant
	for r.more() {
		g := grant{id: r.str(), token: r.int()}
		g.until = r.int()
		g.slots = r.slots()
		g.deadline = expiresBy(sent, g.until-now)
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, g)
	}
	return out, nil
}

// deliverGrants wakes local waiters named in a script reply's grant list,
// without waiting for the pub/sub message.
func (e *Engine) deliverGrants(script string, v []any, from int, now int64, sent time.Time) {
	h := e.activeHub()
	if h == nil || len(v) <= from {
		return
	}
	grants, err := decodeGrants(script, v, from, now, sent)
	if err != nil {
		return // the pub/sub message (or a resync) delivers them
	}
	for _, g := range grants {
		h.deliver(g.id, event{kind: evGrant, grant: g})
	}
}

// ---- the family's shard record ----

// A family's processes must spread its members over the same shards; the
// first to use the family records its count in Redis (ShardsKey), the
// others compare theirs (family.go).

// compareShards is checkShards for calls that change a member's limit or
// rate (SetLimit, SetRate, and so the CLI's): it reads the record and
// refuses a count other than ours, but writes none (a tool must not fix
// the layout of a family that no client used yet).
func (f *Family) compareShards(ctx context.Context) error {
	if f.shardsOK.Load() {
		return nil
	}
	var n int
	var ok bool
	err := boundedErr(ctx, func() (err error) {
		n, ok, err = ReadShards(ctx, f.root.cfg.Client, f.root.cfg.Prefix, f.root.cfg.Name)
		return err
	})
	if err != nil {
		return err
	}
	if ok && n != len(f.shards) {
		return f.shardsMismatch(strconv.Itoa(n))
	}
	return nil
}

// shardsMismatch is the error of a client whose shard count is not the
// one recorded in Redis.
func (f *Family) shardsMismatch(recorded string) error {
	built := strconv.Itoa(len(f.shards))
	if f.defaulted {
		built += " (Shards zero: the default, " + strconv.Itoa(DefaultShards) + " on every client)"
	}
	return cfgErr("FamilyOptions.Shards", "family %q spreads its members over %s shards (recorded in Redis by its first user, key %s); "+
		"this client was built with %s: give every client of the family the same Shards", f.root.cfg.Name, recorded,
		ShardsKey(f.root.cfg.Prefix, f.root.cfg.Name), built)
}

// checkShards makes sure that every process of the family spreads its
// members over the same shards (else one key would be two semaphores,
// each with the whole limit): the first to use the family records its
// shard count (SET NX, no expiry), the others compare theirs, once per
// Family. A mismatch is a *redsem.ConfigError; a failure to reach Redis
// is returned raw (the acquire rides it out) and the check runs again at
// the next call.
//
// Processes of a version before shards write no record and never read
// one; they use the one-shard layout, which is why the default is one
// shard (DefaultShards): a default client records "1" where they run, and
// a client built with more shards then gets the mismatch error instead of
// splitting the family. Only a client built with Shards > 1 that records
// first can split a family with such processes; that is documented (set
// Shards only once every process of the family has this version).
func (f *Family) checkShards(ctx context.Context) error {
	if f.shardsOK.Load() {
		return nil
	}
	key := ShardsKey(f.root.cfg.Prefix, f.root.cfg.Name)
	want := strconv.Itoa(len(f.shards))
	var got string
	err := boundedErr(ctx, func() error {
		pipe := f.root.cfg.Client.Pipeline()
		pipe.SetNX(ctx, key, want, 0)
		get := pipe.Get(ctx, key)
		_, err := pipe.Exec(ctx)
		got = get.Val()
		return err
	})
	if err != nil {
		return err
	}
	if got != want {
		return f.shardsMismatch(got)
	}
	f.shardsOK.Store(true)
	return nil
}

// ---- the server's clock ----

// readClock reads the server's clock (TIME) within ctx, so that the first
// acquire of an Engine can bound its request in server time too. Its errors
// are raw (the acquire call classifies them).
func (e *Engine) readClock(ctx context.Context) error {
	sent := time.Now()
	if err := e.alerts.ready(ctx); err != nil {
		return err
	}
	v, err := bounded(ctx, func() ([]any, error) {
		var t time.Time
		err := onLiveConn(ctx, func() (err error) {
			t, err = e.cfg.Client.Time(ctx).Result()
			return err
		})
		if err != nil {
			return nil, err
		}
		return []any{t.UnixMilli()}, nil
	})
	if err != nil {
		return err
	}
	e.clock.observe(sent, v[0].(int64))
	return nil
}

// serverClock relates the Redis server's clock to the local monotonic clock,
// from the latest reply: server time ns happened after local time sent, so
// the local time of any later server instant x is at least sent + (x - ns).
type serverClock struct {
	mu   sync.Mutex
	sent time.Time
	ns   int64
}

func (c *serverClock) observe(sent time.Time, serverMs int64) {
	c.mu.Lock()
	c.sent, c.ns = sent, serverMs
	c.mu.Unlock()
}

// serverAt returns a late estimate (an upper bound, clocks' drift aside) of
// the server time, in ms, at local time t: the server read ns after local
// time sent, so at t it reads at most ns + (t - sent). It reports false
// before the first reply.
func (c *serverClock) serverAt(t time.Time) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent.IsZero() {
		return 0, false
	}
	return c.ns + t.Sub(c.sent).Milliseconds() + 1, true
}

// localAtLeast returns an early local estimate of server time serverMs.
func (c *serverClock) localAtLeast(serverMs int64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent.IsZero() {
		return time.Now()
	}
	return c.sent.Add(time.Duration(serverMs-c.ns) * time.Millisecond)
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// expiresBy turns a lifetime that a script reported, ms from the server time
// it read, into a local deadline that is never late, given a local time
// before that read (when the request was sent). Scripts keep deadlines in
// whole milliseconds of truncated server time, and an entry is gone once the
// truncated time reaches its deadline, so by the exact clock it may end up
// to a millisecond before base + ms: the estimate takes that millisecond off.
func expiresBy(base time.Time, ms int64) time.Time {
	return base.Add(time.Duration(ms)*time.Millisecond - time.Millisecond)
}

// ---- decoding ----

// reader decodes a script reply (a flat array) field by field. It never
// panics: the first field that is missing or of the wrong type records an
// error (a *ReplyError), and every later read returns a zero value.
type reader struct {
	script string
	v      []any
	i      int
	err    error
}

func (r *reader) fail(reason string) {
	if r.err == nil {
		r.err = &ReplyError{Script: r.script, Reply: r.v, Reason: reason}
	}
}

// next returns the next field, or nil after recording an error.
func (r *reader) next() any {
	if r.err != nil {
		return nil
	}
	if r.i >= len(r.v) {
		r.fail("too short")
		return nil
	}
	x := r.v[r.i]
	r.i++
	return x
}

func (r *reader) more() bool { return r.err == nil && r.i < len(r.v) }

// int reads an integer (Redis turns Lua numbers into integers).
func (r *reader) int() int64 {
	switch x := r.next().(type) {
	case int64:
		return x
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err == nil {
			return n
		}
	}
	r.fail("field " + strconv.Itoa(r.i) + " is not an integer")
	return 0
}

// str reads a string (an integer is taken in its decimal form).
func (r *reader) str() string {
	switch x := r.next().(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	r.fail("field " + strconv.Itoa(r.i) + " is not a string")
	return ""
}

// slots reads a comma-separated, non-empty list of slots.
func (r *reader) slots() []int {
	s := r.str()
	if r.err != nil {
		return nil
	}
	parts := strings.Split(s, ",")
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			r.fail("bad slot list " + strconv.Quote(s))
			return nil
		}
		out = append(out, n)
	}
	return out
}

// count reads a count of records of width fields each that must fit in
// the rest of the reply.
func (r *reader) count(width int) int {
	n := r.int()
	if r.err != nil {
		return 0
	}
	if n < 0 || n > int64((len(r.v)-r.i)/width) {
		r.fail("count " + strconv.FormatInt(n, 10) + " does not fit")
		return 0
	}
	return int(n)
}

// toInt parses a decimal integer, 0 if it is none (for message payloads).
func toInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// ---- errors ----

// Errors, classified in one place: what a failed call to Redis means
// (Transient: worth another try; Unreachable: Redis could not be reached,
// ErrUnavailable), how the library names the semaphore in an error (wrap,
// ctxErr), and which errors are its own (own). The reply codes and the
// errors they mean are declared with each script's call (protocol.go).

// scriptRefusals are how the scripts' error replies begin after
// "ERR redsem: " (the Lua library's fail): a bad argument (a bug of this client,
// or of another version sharing the semaphore), a stored value that is not
// what the scripts write (a damaged key), or the wrong number of keys. All
// are final: Transient is false for them. protocol_test.go holds every
// fail(...) of the scripts to this list.
var scriptRefusals = []string{"bad ", "the stored ", "want "}

// callErr is the error of a call to Redis that failed: the context's when
// it ended, else err wrapped with the semaphore's name.
func (e *Engine) callErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return e.ctxErr(ctx, err)
	}
	return e.wrap(err)
}

// ctxErr is the error of a call that ctx ended: it matches ctx.Err() and the
// context's cause, and keeps err (what the call itself reported, if any).
func (e *Engine) ctxErr(ctx context.Context, err error) error {
	base := ctx.Err()
	cause := context.Cause(ctx)
	var out error
	if cause != nil && cause != base {
		out = &namedError{fmt.Errorf("redsem: %s: gave up: %w (%w)", e.who(), base, cause)}
	} else {
		out = &namedError{fmt.Errorf("redsem: %s: gave up: %w", e.who(), base)}
	}
	if err != nil && !errors.Is(err, base) {
		out = joinLine(out, err)
	}
	return out
}

// wrap names the semaphore in err (once: an error of the library's own
// names it already); an error that says Redis could not be reached matches
// redsem.ErrUnavailable too, and one that says the connection lacks
// authentication, or that its credentials are wrong, says which and
// matches redsem.ErrInvalidConfig (the client's options are wrong).
func (e *Engine) wrap(err error) error {
	if own(err) {
		return err
	}
	switch {
	case Unreachable(err):
		e.unreachable(err)
		return &namedError{fmt.Errorf("redsem: %s: %w: %w", e.who(), bare(redsem.ErrUnavailable), err)}
	case strings.Contains(err.Error(), "WRONGPASS"):
		return &namedError{errorf(redsem.ErrInvalidConfig, "redsem: %s: Redis refused the client's credentials: wrong password, or wrong or disabled user (check them in the client's options): %w", e.who(), err)}
	case authError(err):
		return &namedError{errorf(redsem.ErrInvalidConfig, "redsem: %s: Redis refused the request without authentication (set the password, and the user, in the client's options): %w", e.who(), err)}
	}
	if msg, ok := strings.CutPrefix(err.Error(), "ERR redsem: "); ok {
		// A script's refusal (the Lua library's fail): said after one prefix.
		err = &retold{msg: msg, err: err}
	}
	return &namedError{fmt.Errorf("redsem: %s: %w", e.who(), err)}
}

// joinLine is errors.Join on one line: the errors' texts separated by
// "; " (errors.Join puts a newline between them, which breaks one-line
// logs), with one prefix: after the first, a text loses its "redsem: "
// and the semaphore's name if the first said it (`redsem: "db": gave up:
// context deadline exceeded; Redis unavailable: dial tcp ...`). It matches
// (errors.Is, errors.As) whatever any of them matches.
func joinLine(errs ...error) error {
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

// ownSentinels are the errors that only the library makes (with its own
// text, naming the semaphore where it has one): an error that matches one
// is the library's, never the client's.
var ownSentinels = []error{
	redsem.ErrNoSlot, redsem.ErrLeaseLost, redsem.ErrReleased, redsem.ErrLimitMismatch, redsem.ErrInvalidConfig,
	redsem.ErrClosed, redsem.ErrNotReplicated, redsem.ErrWeight, redsem.ErrRateLimited, redsem.ErrUnavailable,
	redsem.ErrQueueFull, errCancelled, errSessionDied, errReleasing,
}

// own reports whether err is one the library made (by its type or the
// sentinel it matches, never by its text): the acquire path's
// classification and wrap add nothing to it.
func own(err error) bool {
	var n *namedError
	var r *ReplyError
	if errors.As(err, &n) || errors.As(err, &r) {
		return true
	}
	for _, s := range ownSentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// authError reports whether err is Redis refusing a connection that is not
// authenticated: NOAUTH, WRONGPASS (the client's credentials are wrong),
// or the "unauthenticated multibulk length" with which it closes one that
// sent a long request first.
func authError(err error) bool {
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
		if err = send(); !Unreachable(err) || dialFailed(err) || ctx.Err() != nil {
			break
		}
	}
	return err
}

// dialFailed reports whether err is a failed dial (nothing was sent).
func dialFailed(err error) bool {
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
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	if dialFailed(err) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "MASTERDOWN")
	}
	return false
}

// ---- settotal.lua, famstatus.lua: a family's total ----

// setTotal runs settotal.lua on the family's keys: ARGV[4] the total (0:
// none). Its reply is now and the grants it made.
func (f *Family) setTotal(ctx context.Context, total int) error {
	e := f.famEng
	return e.setCall(ctx, "settotal", lua.SetTotal, e.cfg.Limit, []any{total, uuid.NewString()})
}

// status runs famstatus.lua (read-only) on the family's keys: total in
// force, slots held, queue entries, now.
func (f *Family) status(ctx context.Context) (redsem.FamilyStatus, error) {
	e := f.famEng
	v, _, err := e.run(ctx, e.cfg.Client, lua.FamilyStatus, e.cfg.Limit)
	if err != nil {
		return redsem.FamilyStatus{}, e.callErr(ctx, err)
	}
	r := reader{script: "famstatus", v: v}
	st := redsem.FamilyStatus{Total: int(r.int()), Held: int(r.int()), Waiting: int(r.int())}
	r.int() // now
	if r.err != nil {
		return redsem.FamilyStatus{}, e.wrap(r.err)
	}
	return st, nil
}
