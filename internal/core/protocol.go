package core

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/sentinel"
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
//	renewmany.lua   e.renewMany   a renewReply per lease id: the watchdog's renewals of many leases in one call (renewals.go)
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
var errCancelled = sentinel.New("redsem: acquire cancelled by its own undo")

// errSessionDied is acquire.lua's and heartbeat.lua's "the session is not
// live": its process paused or was cut off for longer than QueueTTL.
var errSessionDied = sentinel.Register(sessionError{})

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
		return renewReply{}, callErr(e.who(), ctx, err)
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
		return renewReply{}, wrap(e.who(), r.err)
	}
	e.clock.observe(sent, now)
	if out.ok {
		out.deadline = expiresBy(sent, out.until-now)
	}
	return out, nil
}

// ---- renewmany.lua ----

// renewMany runs renewmany.lua: renew (without resume) for each of ids
// (ARGV[5..]) with the lease TTL (ARGV[4]), in one call. The replies come
// in the order of ids.
func (e *Engine) renewMany(ctx context.Context, ids []string) ([]renewReply, error) {
	args := make([]any, 0, 1+len(ids))
	args = append(args, ms(e.cfg.LeaseTTL))
	for _, id := range ids {
		args = append(args, id)
	}
	v, sent, err := e.run(ctx, e.cfg.Client, lua.RenewMany, e.cfg.Limit, args...)
	if err != nil {
		return nil, callErr(e.who(), ctx, err)
	}
	r := reader{script: "renewmany", v: v}
	now := r.int()
	out := make([]renewReply, len(ids))
	for i := range out {
		switch d := r.int(); {
		case d > 0:
			out[i] = renewReply{ok: true, until: d, deadline: expiresBy(sent, d-now)}
		case d == -1:
			out[i].released = true
		case d != 0:
			r.fail("unknown code")
		}
	}
	if r.err != nil {
		return nil, wrap(e.who(), r.err)
	}
	e.clock.observe(sent, now)
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
		return releaseReply{}, callErr(e.who(), ctx, err)
	}
	r := reader{script: "release", v: v}
	k, now := r.int(), r.int()
	if r.err != nil {
		return releaseReply{}, wrap(e.who(), r.err)
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
		return heartbeatReply{}, callErr(e.who(), ctx, err)
	}
	r := reader{script: "heartbeat", v: v}
	now, alive, hint := r.int(), r.int(), r.int()
	if r.err != nil {
		return heartbeatReply{}, wrap(e.who(), r.err)
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
		return redsem.Status{}, callErr(e.who(), ctx, err)
	}
	st, err := decodeStatus(v)
	if err != nil {
		return redsem.Status{}, wrap(e.who(), err)
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
		if refuseAfter, err = e.refuseAfterMargin(ctx, bounds.SettingMargin); err != nil {
			return callErr(e.who(), ctx, err)
		}
		argv := append(append([]any{}, args...), refuseAfter)
		if v, sent, err = e.run(ctx, e.cfg.Client, s, limit, argv...); err != nil {
			break
		}
		if refused := len(v) > 0 && v[0] == int64(-1); !refused {
			break
		}
		if try > 0 || ctx.Err() != nil {
			return callErr(e.who(), ctx, fmt.Errorf("%w (the request reached Redis after its deadline)", context.DeadlineExceeded))
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
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bounds.CancelCall)
			e.background(bctx, cancel, func(ctx context.Context) {
				_, _, _ = e.run(ctx, e.cfg.Client, s, limit, cancelArgv...)
			})
		}
		return callErr(e.who(), ctx, err)
	}
	return e.grantsReply(script, v, sent)
}

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
		return wrap(e.who(), r.err)
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
