// Package core is the machinery that the fair and unfair semaphores share:
// key layout, script calls and their replies, leases with their watchdog,
// and the per-semaphore hub that receives wake-ups and keeps fair waiters
// alive. It is internal: the public surface is the root package redsem and
// the packages fair and unfair.
//
// Files: engine.go calls the scripts and decodes their replies (the only
// place that does), acquire.go owns the waiting loop of Acquire, hub.go
// delivers events to waiters, lease.go is the lease and its watchdog.
package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/lua"
)

// cleanupTimeout bounds the best-effort release that undoes an acquire which
// failed or was cancelled; it runs on a context detached from the caller's.
const cleanupTimeout = 2 * time.Second

// Engine implements redsem.Semaphore for both variants.
type Engine struct {
	cfg  Config
	keys Keys
	pub  string // PUBLISH, or SPUBLISH on a cluster

	clock serverClock

	// The maxmemory-policy check (observe.go), once per engine or family.
	policyMu   sync.Mutex
	policyDone chan struct{} // nil: not started (or to be tried again); closed when it ended
	policy     string

	alerts *alerts   // conditions logged at Warn (shared by every engine of the client)
	lib    *libState // whether the client's calls use FCALL (functions.go)

	sent [lua.SetRate + 1]atomic.Bool // scripts sent whole once (see loaded)

	hubMu sync.Mutex
	hub   *hub

	// stopped ends on Close (a family's, for its members): the one place
	// that says the semaphore is closed. Calls bind their context to it,
	// background work ends with it, and no hub is started once it ended.
	stopped context.Context
	stop    context.CancelFunc
	undos   sync.WaitGroup

	// A member of a keyed family shares the family's hub (hubMu and hub
	// above are unused) and is dropped from the family's map once
	// idle: no call in flight and no live lease (active), for the family's
	// idle period since used (unix ns).
	fam    *Family
	shard  *famShard // the member's shard: its hub
	active atomic.Int64
	used   atomic.Int64
}

// hubSlot returns where the engine's waiting machinery lives: the mutex
// and the hub pointer it guards; the engine's own, or its family shard's.
func (e *Engine) hubSlot() (*sync.Mutex, **hub) {
	if e.shard != nil {
		return &e.shard.mu, &e.shard.hub
	}
	return &e.hubMu, &e.hub
}

// busy and idle bracket a call or a lease of a family member, so that the
// family keeps a member while it is in use (no-ops for a plain semaphore).
func (e *Engine) busy() {
	if e.fam != nil {
		e.active.Add(1)
	}
}

func (e *Engine) idle() {
	if e.fam != nil {
		e.used.Store(time.Now().UnixNano())
		e.active.Add(-1)
	}
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys := KeysFor(cfg.Prefix, cfg.Name)
	e := &Engine{cfg: cfg, keys: keys, pub: "PUBLISH", alerts: alertsFor(cfg.Client, keys), lib: libFor(cfg.Client)}
	e.stopped, e.stop = context.WithCancel(context.Background())
	if _, ok := cfg.Client.(*redis.ClusterClient); ok {
		e.pub = "SPUBLISH"
	}
	return e, nil
}

// Name is the semaphore's name.
func (e *Engine) Name() string { return e.cfg.Name }

// Keys returns the semaphore's keys (for tools and tests).
func (e *Engine) Keys() Keys { return e.keys }

// Close stops the background work of waiting (the wake-up subscription,
// the fair heartbeat, retries of undos). Leases already granted keep
// renewing until released.
//
// A family member's Close does nothing: its family's Close ends the shared
// machinery.
func (e *Engine) Close() error {
	if e.fam != nil {
		return nil
	}
	// The calls first (and no hub starts after this): shutdown waits for
	// a heartbeat in flight, which against a dead Redis may take its
	// whole bound.
	e.stop()
	e.hubMu.Lock()
	h := e.hub
	e.hub = nil
	e.hubMu.Unlock()
	if h != nil {
		h.shutdown()
	}
	return nil
}

// background runs fn on a goroutine of its own: the one way the engine does
// work that no caller waits for (an undo, a release retried, a library
// load). fn's context keeps ctx's values and ends at ctx's deadline (every
// piece of background work has one) or when the semaphore is closed;
// cancel (ctx's own) is called when fn returns. WaitUndos waits for it.
// What such work leaves unfinished must be harmless by design: Close never
// waits for a Redis that does not answer.
func (e *Engine) background(ctx context.Context, cancel context.CancelFunc, fn func(ctx context.Context)) {
	e.undos.Add(1)
	go func() {
		defer e.undos.Done()
		defer cancel()
		stop := context.AfterFunc(e.stopped, cancel)
		defer stop()
		fn(ctx)
	}()
}

// WaitUndos waits until no undo runs (for tests that check what is left in
// Redis after an abandoned call).
func (e *Engine) WaitUndos() { e.undos.Wait() }

// isClosed reports whether Close (the family's, for a member) was called.
func (e *Engine) isClosed() bool { return e.stopped.Err() != nil }

// run calls a script with the semaphore's keys and the common ARGV prefix
// (channel base, publish command, limit).
func (e *Engine) run(ctx context.Context, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	return e.runOn(ctx, e.cfg.Client, s, limit, args...)
}

// runOn is run on a given client or connection. Every script call of the
// library goes through here: as a function of the library once the client
// loaded it (FCALL; functions.go), else EVALSHA; status.lua, which writes
// nothing, runs with FCALL_RO or EVALSHA_RO so that it may run on a
// read-only replica.
//
// The call returns once ctx ends, whatever the client does: go-redis honours
// a context's deadline only on clients built with ContextTimeoutEnabled, and
// retries a failed command on its own, so the command runs on a goroutine of
// its own and is abandoned (its reply ignored) when ctx ends first. What an
// abandoned request may still do in Redis is made harmless by the scripts:
// see undo.
func (e *Engine) runOn(ctx context.Context, c redis.Scripter, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	v, sent, err := e.script(ctx, c, s, limit, args...)
	if err != nil {
		return nil, sent, e.callErr(ctx, err)
	}
	return v, sent, nil
}

// script is runOn with the error as the client (or ctx) reported it, for
// the acquire path, which classifies its errors once at its end.
func (e *Engine) script(ctx context.Context, c redis.Scripter, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, e.keys.Chan, e.pub, e.limitArg(limit))
	argv = append(argv, args...)
	sent := time.Now()
	call := func() ([]any, error) {
		if v, ok, err := e.fcall(ctx, c, s, argv); ok {
			return v, err
		}
		var cmd *redis.Cmd
		script := Script(s)
		if s == lua.Status {
			cmd = script.RunRO(ctx, c, e.keys.List, argv...)
			if err := cmd.Err(); err != nil && (strings.Contains(err.Error(), "not allowed in read-only scripts") ||
				strings.Contains(err.Error(), "unknown command")) {
				// Redis before 7.0 has no EVALSHA_RO, and miniredis counts
				// TIME as a write in a read-only script; status.lua writes
				// nothing, so run it as a plain script.
				cmd = script.Run(ctx, c, e.keys.List, argv...)
			}
		} else if loaded := e.loaded(s); !loaded.Load() {
			// The engine's first call of this script sends it whole (EVAL
			// caches it on the server): one round trip, where EVALSHA
			// would take two on a server that has not seen it (NOSCRIPT,
			// then EVAL). Later calls send its SHA1.
			cmd = script.Eval(ctx, c, e.keys.List, argv...)
			if err := cmd.Err(); err == nil {
				loaded.Store(true)
			} else if Unreachable(err) && ctx.Err() == nil {
				// A server can close the connection while the whole script
				// is still being written (one that requires a password
				// closes an unauthenticated connection that sends more
				// than 16 KiB), and the client sees only a reset: the
				// SHA1, a small command, gets the server's reply (the
				// authentication error; or NOSCRIPT, then EVAL).
				cmd = script.Run(ctx, c, e.keys.List, argv...)
			}
		} else {
			cmd = script.Run(ctx, c, e.keys.List, argv...)
		}
		return cmd.Slice()
	}
	v, err := bounded(ctx, call)
	if err == nil {
		e.reached()
		e.loadLibrary()
	}
	return v, sent, err
}

// limitArg is ARGV[3] of a script call: the limit, and the client's rate
// if it has one ("limit:rate_limit:per_ms", lib.lua's client_arg).
func (e *Engine) limitArg(limit int) any {
	if r := e.cfg.Rate; !r.IsZero() {
		return strconv.Itoa(limit) + ":" + strconv.Itoa(r.Limit) + ":" + strconv.FormatInt(ms(r.Per), 10)
	}
	return limit
}

// loaded is the flag that says the engine (its family, for a member) sent
// script s whole once already.
func (e *Engine) loaded(s lua.Script) *atomic.Bool {
	if e.fam != nil {
		e = e.fam.root
	}
	return &e.sent[s]
}

// callErr is the error of a call to Redis that failed: the context's when
// it ended, else err wrapped with the semaphore's name.
func (e *Engine) callErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return e.ctxErr(ctx, err)
	}
	return e.wrap(err)
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

// ctxErr is the error of a call that ctx ended: it matches ctx.Err() and the
// context's cause, and keeps err (what the call itself reported, if any).
func (e *Engine) ctxErr(ctx context.Context, err error) error {
	base := ctx.Err()
	cause := context.Cause(ctx)
	var out error
	if cause != nil && cause != base {
		out = &namedError{fmt.Errorf("redsem: %q: gave up: %w (%w)", e.cfg.Name, base, cause)}
	} else {
		out = &namedError{fmt.Errorf("redsem: %q: gave up: %w", e.cfg.Name, base)}
	}
	if err != nil && !errors.Is(err, base) {
		out = joinLine(out, err)
	}
	return out
}

// wrap names the semaphore in err (once: an error of the library's own
// names it already); an error that says Redis could not be reached matches
// redsem.ErrUnavailable too, and one that says the connection lacks
// authentication says so.
func (e *Engine) wrap(err error) error {
	if own(err) {
		return err
	}
	switch {
	case Unreachable(err):
		e.unreachable(err)
		return &namedError{fmt.Errorf("redsem: %q: %w: %w", e.cfg.Name, redsem.ErrUnavailable, err)}
	case authError(err):
		return &namedError{fmt.Errorf("redsem: %q: Redis refused the request without authentication (set the password, and the user, in the client's options): %w", e.cfg.Name, err)}
	}
	return &namedError{fmt.Errorf("redsem: %q: %w", e.cfg.Name, err)}
}

// joinLine is errors.Join on one line: the errors' texts separated by
// "; " (errors.Join puts a newline between them, which breaks one-line
// logs). It matches (errors.Is, errors.As) whatever any of them matches.
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
	for i, err := range j {
		parts[i] = err.Error()
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

// authError reports whether err is Redis refusing an unauthenticated
// connection: NOAUTH, WRONGPASS, or the "unauthenticated multibulk length"
// with which it closes one that sent a long request first.
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

// grant is a grant as scripts report it in a grant list, decoded.
type grant struct {
	id       string
	token    int64
	slots    []int
	deadline time.Time
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
		dl := r.int()
		g.slots = r.slots()
		g.deadline = expiresBy(sent, dl-now)
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, g)
	}
	return out, nil
}

// Kinds of release that release.lua reports.
const (
	ReleasedNothing = 0 // nothing live had the id (a lease: it was lost)
	ReleasedLease   = 1
	ReleasedWaiter  = 2
)

// release runs release.lua for id in mode ("owner", "undo" or "force"),
// hands grants it made to local waiters, and returns its kind and how many
// waiters it admitted.
func (e *Engine) release(ctx context.Context, id, mode string) (kind, admitted int, err error) {
	// A tombstone or cancellation record lives LeaseTTL (release.lua caps
	// it at 15 s): a request delayed or retried longer than that would
	// find a lease that expired anyway.
	v, sent, err := e.run(ctx, lua.Release, e.cfg.Limit, id, mode, ms(e.cfg.LeaseTTL))
	if err != nil {
		return 0, 0, err
	}
	r := reader{script: "release", v: v}
	k, now := r.int(), r.int()
	if r.err != nil {
		return 0, 0, e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	e.deliverGrants("release", v, 2, now, sent)
	return int(k), (len(v) - 2) / 4, nil
}

// ForceRelease removes the lease or queue entry id, as an operator would:
// no tombstone is left, so the lease's holder learns at its next renewal
// that it was lost, and a removed waiter's process queues it again. It
// returns the kind of release (ReleasedLease, ReleasedWaiter or
// ReleasedNothing) and how many waiters it admitted into freed slots.
func (e *Engine) ForceRelease(ctx context.Context, id string) (kind, admitted int, err error) {
	return e.release(ctx, id, "force")
}

// Status reads the live state.
func (e *Engine) Status(ctx context.Context) (redsem.Status, error) {
	v, _, err := e.run(ctx, lua.Status, e.cfg.Limit)
	if err != nil {
		return redsem.Status{}, err
	}
	st, err := decodeStatus(v)
	if err != nil {
		return redsem.Status{}, e.wrap(err)
	}
	return st, nil
}

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

// SetLimit sets the limit for every client of this name.
func (e *Engine) SetLimit(ctx context.Context, limit int) error {
	if limit < 1 || limit > MaxLimit {
		return cfgErr("limit", "%d is outside [1, %d]", limit, MaxLimit)
	}
	if err := e.sameShards(ctx); err != nil {
		return err
	}
	v, sent, err := e.run(ctx, lua.SetLimit, limit, uuid.NewString())
	if err != nil {
		return err
	}
	r := reader{script: "setlimit", v: v}
	now := r.int()
	if r.err != nil {
		return e.wrap(r.err)
	}
	e.deliverGrants("setlimit", v, 1, now, sent)
	return nil
}

// sameShards refuses to change a family member whose family the Redis
// record says is spread over another number of shards (its keys here
// would be nobody's); a plain semaphore passes.
func (e *Engine) sameShards(ctx context.Context) error {
	if e.fam == nil {
		return nil
	}
	if err := e.fam.compareShards(ctx); err != nil {
		return e.callErr(ctx, err)
	}
	return nil
}

// SetRate sets the rate for every client of this name (the zero Rate
// removes the bound for all).
func (e *Engine) SetRate(ctx context.Context, rate redsem.Rate) error {
	rate, err := CheckRate("rate", rate)
	if err != nil {
		return err
	}
	if err := e.sameShards(ctx); err != nil {
		return err
	}
	v, sent, err := e.run(ctx, lua.SetRate, e.cfg.Limit, uuid.NewString(), rate.Limit, ms(rate.Per))
	if err != nil {
		return err
	}
	r := reader{script: "setrate", v: v}
	now := r.int()
	if r.err != nil {
		return e.wrap(r.err)
	}
	e.deliverGrants("setrate", v, 1, now, sent)
	return nil
}

// parseRate reads a rate as the scripts store it, "limit/per_ms".
func parseRate(s string) redsem.Rate {
	l, p, _ := strings.Cut(s, "/")
	return redsem.Rate{Limit: int(toInt(l)), Per: time.Duration(toInt(p)) * time.Millisecond}
}

// deliverGrants wakes local waiters named in a script reply's grant list,
// without waiting for the pub/sub message.
func (e *Engine) deliverGrants(script string, v []any, from int, now int64, sent time.Time) {
	mu, slot := e.hubSlot()
	mu.Lock()
	h := *slot
	mu.Unlock()
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

// readClock reads the server's clock (TIME) within ctx, so that the first
// acquire of an Engine can bound its request in server time too. Its errors
// are raw (the acquire call classifies them).
func (e *Engine) readClock(ctx context.Context) error {
	sent := time.Now()
	v, err := bounded(ctx, func() ([]any, error) {
		t, err := e.cfg.Client.Time(ctx).Result()
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

// renew runs renew.lua for id: ok false means the lease is gone.
func (e *Engine) renew(ctx context.Context, id string) (ok bool, deadline time.Time, err error) {
	return e.renewOn(ctx, e.cfg.Client, id)
}

// renewOn is renew on a given connection (replicas.go waits on the same
// connection for replica acknowledgement).
func (e *Engine) renewOn(ctx context.Context, c redis.Scripter, id string) (bool, time.Time, error) {
	v, sent, err := e.runOn(ctx, c, lua.Renew, e.cfg.Limit, id, ms(e.cfg.LeaseTTL))
	if err != nil {
		return false, time.Time{}, err
	}
	r := reader{script: "renew", v: v}
	code, now := r.int(), r.int()
	var dl int64
	if code == 1 {
		dl = r.int()
	}
	if r.err != nil {
		return false, time.Time{}, e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	return code == 1, expiresBy(sent, dl-now), nil
}
