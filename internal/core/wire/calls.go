package wire

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

// The protocol: every semaphore script as one typed Go call, a method of
// Door. Each call below states the script's arguments (after the common
// prefix that run adds), decodes its reply, and turns its reply codes into
// the library's errors, next to each other; the lua package's file headers
// say the same from the script's side, and calls_test.go checks that the
// codes and refusals the scripts return are the ones declared here. The
// engine calls scripts only through these methods, and they run them only
// through run.
//
//	script          call              reply (after decoding)
//	acquire.lua     d.Acquire         AcquireReply: granted (slots, token, deadline) or not (hint, place, rate wait, floor); codes below
//	renew.lua       d.Renew           RenewReply: renewed with a new deadline (and, for Resume, the lease's token and slots), gone, or released by a holder
//	renewmany.lua   d.RenewMany       a RenewReply per lease id: the watchdog's renewals of many leases in one call
//	release.lua     d.Release         ReleaseReply: what was released, how many waiters it admitted, their grants
//	                d.ReleaseExpired  the same, for a lease given up at its deadline
//	releasemany.lua d.ReleaseMany     a kind per lease id, and the grants: holders' releases that go together
//	heartbeat.lua   d.Heartbeat       HeartbeatReply: session alive, expiry hint, grants
//	status.lua      d.Status          redsem.Status
//	setlimit.lua    d.SetLimit        grants it made
//	setrate.lua     d.SetRate         grants it made
//	settotal.lua    d.SetTotal        grants it made: on a family's keys, not a member's
//	famstatus.lua   d.FamilyStatus    redsem.FamilyStatus: on a family's keys
//
// Grants that a script made to waiters of this process come back in its
// reply too (a grant list: Grants, decode.go); the caller hands them to their waiters
// at once (the engine's hub), without waiting for the pub/sub message.

// ---- acquire.lua ----

// AcquireArgs are acquire.lua's own arguments (ARGV[4..]).
type AcquireArgs struct {
	ID          string // ARGV[4]: the lease or waiter id
	N           int    // ARGV[5]: slots wanted
	Mode        string // ARGV[7]: "try", "wait" or "queue" (ARGV[6] is the lease TTL)
	SID         string // ARGV[8]: queue mode: the session ("-" otherwise)
	RefuseAfter int64  // ARGV[12]: server ms after which it writes nothing; 0 none
	// ARGV[9] grant TTL (3 x Fallback), ARGV[10] owner, ARGV[11] MaxWaiters: from the config.
}

// Reply codes of acquire.lua (its reply's first element), each with what
// the rest of its reply holds and the error it means (acquire).
const (
	CodeGranted     = 1  // now, token, deadline_ms, slot...
	CodeQueued      = 0  // not granted (queued or not): now, hint, position [, rate_ms, rate limit, per_ms [, floor]]
	codeMismatch    = -1 // now, established limit: *redsem.LimitMismatchError
	codeCancelled   = -2 // now: ErrCancelled (nothing written)
	codeWeight      = -3 // now, limit [, rate limit]: redsem.ErrWeight
	codeQueueFull   = -4 // now, entries: redsem.ErrQueueFull
	codeSessionDied = -5 // now: ErrSessionDied (queue mode: the session is not live)
	codeRateDiffers = -6 // now, "limit/per_ms": *redsem.RateMismatchError
	codeTotalDiffer = -7 // now, established total: a family's total mismatch (matches redsem.ErrLimitMismatch)
	codeUncounted   = -8 // now: renew.lua's resume of a lease the family's total does not count (matches redsem.ErrLimitMismatch)
)

// acquireCodes names every reply code of acquire.lua (calls_test.go
// holds the scripts to it).
var acquireCodes = map[int64]string{
	CodeGranted: "granted", CodeQueued: "not granted", codeMismatch: "limit mismatch", codeCancelled: "cancelled",
	codeWeight: "too heavy", codeQueueFull: "queue full", codeSessionDied: "session died", codeRateDiffers: "rate mismatch",
	codeTotalDiffer: "total mismatch",
}

// ErrCancelled is acquire.lua's "this id was cancelled by its own undo, or
// the request came after its caller's deadline": nothing was written.
var ErrCancelled = sentinel.New("redsem: acquire cancelled by its own undo")

// ErrSessionDied is acquire.lua's and heartbeat.lua's "the session is not
// live": its process paused or was cut off for longer than QueueTTL.
var ErrSessionDied = sentinel.Register(sessionError{})

type sessionError struct{}

func (sessionError) Error() string { return "redsem: fair session died" }

// AcquireReply is one run of acquire.lua, decoded.
type AcquireReply struct {
	Code     int64
	Now      int64 // server ms
	Token    int64
	Slots    []int
	Deadline time.Time // granted: local estimate, never late
	Until    int64     // granted: the deadline in Redis, server ms
	Hint     int64     // not granted: ms until a holder may expire (or the rate lets a request in), -1 none
	Position int64     // not granted: place in the queue, -1 not queued
	RateMs   int64     // not granted: a slot was free but the rate's window was full: ms until it has room; -1 not so
	Other    int64     // mismatch: established limit; weight: limit; queue full: entries
	RateMax  int64     // weight: the rate's limit in force (0: none)
	TotalMax int64     // weight: the family's total in force (0: not given)
	Rate     string    // rate mismatch: the established rate, "limit/per_ms"
	// rateInForce: not granted with rateMs >= 0: the rate in force
	RateInForce redsem.Rate
	// floor: queue mode, not granted: every grant made before this attempt
	// ran has a token at most floor, every grant made after it a greater
	// one (acquire.lua's max(_token, now_us - 1)).
	Floor int64
}

// Acquire runs acquire.lua once. A reply code that is an error comes back
// as that error, with the reply. Its errors are raw (not named): the
// acquire call classifies them once, at its end.
func (d *Door) Acquire(ctx context.Context, a AcquireArgs) (AcquireReply, error) {
	sid := a.SID
	if sid == "" {
		sid = "-"
	}
	v, sent, err := d.runScript(ctx, d.Client, lua.Acquire, d.Limit, a.ID, a.N, ms(d.LeaseTTL), a.Mode, sid,
		ms(3*d.Fallback), d.Owner, d.MaxWaiters, a.RefuseAfter)
	if err != nil {
		return AcquireReply{}, err
	}
	r, err := decodeAttempt(v, sent)
	if err != nil {
		return r, err
	}
	d.clock.observe(sent, r.Now)
	switch r.Code {
	case codeMismatch:
		return r, &redsem.LimitMismatchError{Name: d.Name, Family: d.Family, Client: d.Limit, Established: int(r.Other)}
	case codeRateDiffers:
		return r, &redsem.RateMismatchError{Name: d.Name, Family: d.Family, Client: d.Rate, Established: parseRate(r.Rate)}
	case codeTotalDiffer:
		return r, d.totalMismatch(r.Other)
	case codeWeight:
		if r.TotalMax > 0 && int64(a.N) > r.TotalMax {
			return r, Errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the family's total in force is %d", d.Who, a.N, r.TotalMax)
		}
		if int64(a.N) <= r.Other && r.RateMax > 0 {
			return r, Errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the rate in force grants %d per period", d.Who, a.N, r.RateMax)
		}
		return r, Errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, but the limit in force is %d", d.Who, a.N, r.Other)
	case codeQueueFull:
		return r, Errorf(redsem.ErrQueueFull, "redsem: %s: queue full: %d waiters queued (Options.MaxWaiters)", d.Who, r.Other)
	case codeCancelled:
		return r, ErrCancelled
	case codeSessionDied:
		return r, ErrSessionDied
	}
	return r, nil
}

// grant is the grant of a granted reply.
func (a AcquireReply) Grant() Grant {
	return Grant{Token: a.Token, Slots: a.Slots, Deadline: a.Deadline, Until: a.Until}
}

// decodeAttempt checks and decodes an acquire.lua reply; sent is when the
// request left.
func decodeAttempt(v []any, sent time.Time) (AcquireReply, error) {
	r := reader{script: "acquire", v: v}
	a := AcquireReply{Code: r.int(), Now: r.int()}
	switch a.Code {
	case CodeGranted:
		a.Token = r.int()
		a.Until = r.int()
		for r.more() {
			a.Slots = append(a.Slots, int(r.int()))
		}
		if len(a.Slots) == 0 {
			r.fail("no slots")
		}
		a.Deadline = expiresBy(sent, a.Until-a.Now)
	case CodeQueued:
		a.Hint, a.Position, a.RateMs = r.int(), r.int(), -1
		if r.more() {
			a.RateMs = r.int()
		}
		if r.more() {
			a.RateInForce = redsem.Rate{Limit: int(r.int()), Per: time.Duration(r.int()) * time.Millisecond}
		}
		if r.more() {
			a.Floor = r.int()
		}
	case codeWeight:
		a.Other = r.int()
		if r.more() {
			a.RateMax = r.int()
		}
		if r.more() {
			a.TotalMax = r.int()
		}
	case codeMismatch, codeQueueFull, codeTotalDiffer:
		a.Other = r.int()
	case codeRateDiffers:
		a.Rate = r.str()
	case codeCancelled, codeSessionDied:
	default:
		r.fail("unknown code")
	}
	return a, r.err
}

// ---- renew.lua ----

// RenewReply is renew.lua's reply: 1 (renewed) with the lease's deadline,
// 0 (the lease is gone) or 2 (gone: a holder released it, in this process
// or in one that resumed it); with resume, also the lease's token and
// slots.
type RenewReply struct {
	OK       bool
	Released bool      // gone, released by a holder
	Deadline time.Time // ok: local estimate, never late
	Until    int64     // ok: the deadline in Redis, server ms
	Token    int64     // resume
	Slots    []int     // resume
}

// Renew runs renew.lua for id (ARGV[4]) with the lease TTL (ARGV[5]) on c:
// the client, or one connection (replicas.go waits on the same connection
// for replica acknowledgement). It never re-creates a lost lease. With
// resume (ARGV[6] "resume", for Resume) the reply carries the lease's
// token and slots too; a resume by a client without a total, on a member
// of a family that counts one, fails with a total mismatch (matching
// redsem.ErrLimitMismatch) and changes nothing, and so does a resume by a
// client with the total of a lease its family does not count.
func (d *Door) Renew(ctx context.Context, c redis.Scripter, id string, resume bool) (RenewReply, error) {
	args := []any{id, ms(d.LeaseTTL)}
	if resume {
		args = append(args, "resume", d.Owner) // the lease's owner is now this process
	}
	v, sent, err := d.runScript(ctx, c, lua.Renew, d.Limit, args...)
	if err != nil {
		return RenewReply{}, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "renew", v: v}
	code, now := r.int(), r.int()
	var out RenewReply
	switch code {
	case 1:
		out.OK, out.Until = true, r.int()
		if resume {
			out.Token, out.Slots = r.int(), r.slots()
		}
	case 0:
	case 2:
		out.Released = true
	case codeTotalDiffer:
		if !resume {
			r.fail("a total mismatch answers only a resume")
			break
		}
		other := r.int()
		if r.err == nil {
			d.clock.observe(sent, now)
			return RenewReply{}, d.totalMismatch(other)
		}
	case codeUncounted:
		if !resume {
			r.fail("an uncounted lease answers only a resume")
			break
		}
		if r.err == nil {
			d.clock.observe(sent, now)
			return RenewReply{}, d.uncounted(id)
		}
	default:
		r.fail("unknown code")
	}
	if r.err != nil {
		return RenewReply{}, Wrap(d.Who, r.err)
	}
	d.clock.observe(sent, now)
	if out.OK {
		out.Deadline = expiresBy(sent, out.Until-now)
	}
	return out, nil
}

// ---- renewmany.lua ----

// RenewMany runs renewmany.lua: renew (without resume) for each of ids
// (ARGV[5..]) with the lease TTL (ARGV[4]), in one call. The replies come
// in the order of ids.
func (d *Door) RenewMany(ctx context.Context, ids []string) ([]RenewReply, error) {
	args := make([]any, 0, 1+len(ids))
	args = append(args, ms(d.LeaseTTL))
	for _, id := range ids {
		args = append(args, id)
	}
	v, sent, err := d.runScript(ctx, d.Client, lua.RenewMany, d.Limit, args...)
	if err != nil {
		return nil, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "renewmany", v: v}
	now := r.int()
	out := make([]RenewReply, len(ids))
	for i := range out {
		switch d := r.int(); {
		case d > 0:
			out[i] = RenewReply{OK: true, Until: d, Deadline: expiresBy(sent, d-now)}
		case d == -1:
			out[i].Released = true
		case d != 0:
			r.fail("unknown code")
		}
	}
	if r.err != nil {
		return nil, Wrap(d.Who, r.err)
	}
	d.clock.observe(sent, now)
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

// ReleaseReply is release.lua's reply: what it released, and how many
// waiters it admitted into the freed slots (their grants follow in the
// reply).
type ReleaseReply struct {
	Kind     int
	Admitted int
	Grants   Grants // the grants it made, for local waiters
}

// Release runs release.lua for id (ARGV[4]) in mode (ARGV[5]: "owner",
// "undo" or "force"); its reply carries the grants it made. A
// tombstone or cancellation record lives LeaseTTL (ARGV[6]; release.lua
// caps it at 15 s): a request delayed or retried longer than that would
// find a lease that expired anyway.
func (d *Door) Release(ctx context.Context, id, mode string) (ReleaseReply, error) {
	return d.runRelease(ctx, id, mode, ms(d.LeaseTTL))
}

// ReleaseExpired runs release.lua in mode "expire" for a lease whose
// handle in this process was lost at its local deadline: it releases the
// lease unless another process took a handle of it (Resume), whose holder
// may still hold it (heldElsewhere), or a holder released it already
// (releasedElsewhere).
func (d *Door) ReleaseExpired(ctx context.Context, id string) (ReleaseReply, error) {
	return d.runRelease(ctx, id, "expire", 0)
}

func (d *Door) runRelease(ctx context.Context, id, mode string, arg int64) (ReleaseReply, error) {
	v, sent, err := d.runScript(ctx, d.Client, lua.Release, d.Limit, id, mode, arg)
	if err != nil {
		return ReleaseReply{}, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "release", v: v}
	k, now := r.int(), r.int()
	if r.err != nil {
		return ReleaseReply{}, Wrap(d.Who, r.err)
	}
	d.clock.observe(sent, now)
	return ReleaseReply{Kind: int(k), Admitted: (len(v) - 2) / 4, Grants: Grants{"release", v, 2, now, sent}}, nil
}

// ReleaseMany runs releasemany.lua: Release in mode "owner" for each of
// ids (ARGV[5..]), tombstones kept for the lease TTL (ARGV[4]), in one
// call. The kinds come in the order of ids (ReleasedNothing, ReleasedLease
// or ReleasedWaiter for each), and the grants are those of the waiters the
// call admitted.
func (d *Door) ReleaseMany(ctx context.Context, ids []string) ([]int, Grants, error) {
	args := make([]any, 0, 1+len(ids))
	args = append(args, ms(d.LeaseTTL))
	for _, id := range ids {
		args = append(args, id)
	}
	v, sent, err := d.runScript(ctx, d.Client, lua.ReleaseMany, d.Limit, args...)
	if err != nil {
		return nil, Grants{}, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "releasemany", v: v}
	now := r.int()
	kinds := make([]int, len(ids))
	for i := range kinds {
		switch k := r.int(); k {
		case ReleasedNothing, ReleasedLease, ReleasedWaiter:
			kinds[i] = int(k)
		default:
			r.fail("unknown kind")
		}
	}
	if r.err != nil {
		return nil, Grants{}, Wrap(d.Who, r.err)
	}
	d.clock.observe(sent, now)
	return kinds, Grants{"releasemany", v, 1 + len(ids), now, sent}, nil
}

// ---- heartbeat.lua ----

// HeartbeatReply is heartbeat.lua's reply: whether the session was alive
// (else it is not renewed: ErrSessionDied), and the expiry hint of the
// semaphore it ran on (ms until its earliest holder may expire, -1 none).
type HeartbeatReply struct {
	Alive  bool
	Hint   int64
	Grants Grants // the grants it made, for local waiters
}

// Heartbeat runs heartbeat.lua for session sid (ARGV[4]) with the queue TTL
// (ARGV[5]); age (ARGV[6]) is "new" to make the session, "old" to extend a
// live one. It extends the session (shared by a family's members), admits
// the waiters of its semaphore whose turn came (their grants are in the
// reply). A dead session comes back as ErrSessionDied, with the reply.
func (d *Door) Heartbeat(ctx context.Context, sid, age string, keep []string) (HeartbeatReply, error) {
	args := make([]any, 0, 3+len(keep))
	args = append(args, sid, ms(d.QueueTTL), age)
	for _, k := range keep {
		args = append(args, k)
	}
	v, sent, err := d.runScript(ctx, d.Client, lua.Heartbeat, d.Limit, args...)
	if err != nil {
		return HeartbeatReply{}, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "heartbeat", v: v}
	now, alive, hint := r.int(), r.int(), r.int()
	if r.err != nil {
		return HeartbeatReply{}, Wrap(d.Who, r.err)
	}
	d.clock.observe(sent, now)
	hb := HeartbeatReply{Alive: alive == 1, Hint: hint, Grants: Grants{"heartbeat", v, 3, now, sent}}
	if !hb.Alive {
		return hb, ErrSessionDied
	}
	return hb, nil
}

// ---- status.lua ----

// Status runs status.lua (no arguments of its own; read-only).
func (d *Door) Status(ctx context.Context) (redsem.Status, error) {
	v, _, err := d.runScript(ctx, d.Client, lua.Status, d.Limit)
	if err != nil {
		return redsem.Status{}, CallErr(d.Who, ctx, err)
	}
	st, err := decodeStatus(v)
	if err != nil {
		return redsem.Status{}, Wrap(d.Who, err)
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

// ---- setlimit.lua, setrate.lua, settotal.lua ----

// SetLimit runs setlimit.lua: the limit is ARGV[3]'s (the common prefix),
// ARGV[4] the call's id (a call re-sent after a lost reply runs once). Its
// reply is now and the grants it made.
func (d *Door) SetLimit(ctx context.Context, limit int) (Grants, Cancel, error) {
	return d.setCall(ctx, "setlimit", lua.SetLimit, limit, []any{uuid.NewString()})
}

// SetRate runs setrate.lua: ARGV[4] the call's id, ARGV[5] and ARGV[6] the
// rate's limit and period in ms (0 and 0: no rate). Its reply is now and
// the grants it made.
func (d *Door) SetRate(ctx context.Context, rate redsem.Rate) (Grants, Cancel, error) {
	return d.setCall(ctx, "setrate", lua.SetRate, d.Limit, []any{uuid.NewString(), rate.Limit, ms(rate.Per)})
}

// SetTotal runs settotal.lua on a family's keys (a Door of the family's
// own): ARGV[4] the total (0: none). Its reply is now and the grants it
// made.
func (d *Door) SetTotal(ctx context.Context, total int) (Grants, Cancel, error) {
	return d.setCall(ctx, "settotal", lua.SetTotal, d.Limit, []any{total, uuid.NewString()})
}

// Cancel is what a setting call whose caller gave up before its reply
// leaves to run in the background (the engine runs it, bounded by
// bounds.CancelCall): the script again in its "cancel" mode; nil when
// there is nothing to cancel.
type Cancel func(ctx context.Context)

// setCall runs a setting script s (setlimit, setrate, settotal) whose
// own arguments are args (its call id among them), then its refuse_after
// bound (the caller's deadline in server time, plus a margin: a request
// held in the network that reaches Redis after that changes nothing). When
// the call gives up with its context before a reply, it returns a Cancel
// for the caller to run at once, in the background: the script in its
// "cancel" mode (same call id: only the call's record is written), so that
// the request, should it run after that, changes nothing either: a setting
// whose caller gave up does not undo one made after, unless it reached
// Redis before its cancel.
func (d *Door) setCall(ctx context.Context, script string, s lua.Script, limit int, args []any) (Grants, Cancel, error) {
	var v []any
	var sent time.Time
	var err error
	for try := 0; ; try++ {
		var refuseAfter int64
		if refuseAfter, err = d.refuseAfterMargin(ctx, bounds.SettingMargin); err != nil {
			return Grants{}, nil, CallErr(d.Who, ctx, err)
		}
		argv := append(append([]any{}, args...), refuseAfter)
		if v, sent, err = d.runScript(ctx, d.Client, s, limit, argv...); err != nil {
			break
		}
		if refused := len(v) > 0 && v[0] == int64(-1); !refused {
			break
		}
		if try > 0 || ctx.Err() != nil {
			return Grants{}, nil, CallErr(d.Who, ctx, fmt.Errorf("%w (the request reached Redis after its deadline)", context.DeadlineExceeded))
		}
		// Refused by refuse_after while the caller still waits: the
		// server's clock stepped forward past the bound (the request was
		// not held up: the caller would have given up). Once more,
		// bounded anew from the refusal's time.
		if len(v) > 1 {
			if now, ok := v[1].(int64); ok {
				d.clock.observe(sent, now)
			}
		}
	}
	if err != nil {
		var cancel Cancel
		if ctx.Err() != nil {
			cancelArgv := append(append([]any{}, args...), 0, "cancel")
			cancel = func(ctx context.Context) {
				_, _, _ = d.runScript(ctx, d.Client, s, limit, cancelArgv...)
			}
		}
		return Grants{}, cancel, CallErr(d.Who, ctx, err)
	}
	r := reader{script: script, v: v}
	now := r.int()
	if r.err != nil {
		return Grants{}, nil, Wrap(d.Who, r.err)
	}
	return Grants{script, v, 1, now, sent}, nil, nil
}

// ---- famstatus.lua ----

// FamilyStatus runs famstatus.lua (read-only) on a family's keys (a Door
// of the family's own): total in force, slots held, queue entries, now.
func (d *Door) FamilyStatus(ctx context.Context) (redsem.FamilyStatus, error) {
	v, _, err := d.runScript(ctx, d.Client, lua.FamilyStatus, d.Limit)
	if err != nil {
		return redsem.FamilyStatus{}, CallErr(d.Who, ctx, err)
	}
	r := reader{script: "famstatus", v: v}
	st := redsem.FamilyStatus{Total: int(r.int()), Held: int(r.int()), Waiting: int(r.int())}
	r.int() // now
	if r.err != nil {
		return redsem.FamilyStatus{}, Wrap(d.Who, r.err)
	}
	return st, nil
}

// parseRate reads a rate as the scripts store it, "limit/per_ms".
func parseRate(s string) redsem.Rate {
	l, p, _ := strings.Cut(s, "/")
	return redsem.Rate{Limit: int(toInt(l)), Per: time.Duration(toInt(p)) * time.Millisecond}
}
