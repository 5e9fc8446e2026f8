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
	"net"
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

	policyOnce sync.Once
	policyDone chan struct{} // closed when the check ends; set in policyOnce
	policy     string

	hubMu  sync.Mutex
	hub    *hub
	closed bool // under hubMu

	stopped context.Context // ends on Close: stops undo retries
	stop    context.CancelFunc
	undos   sync.WaitGroup

	// A member of a keyed family shares the family's hub (hubMu, hub and
	// closed above are unused) and is dropped from the family's map once
	// idle: no call in flight and no live lease (active), for the family's
	// idle period since used (unix ns).
	fam    *Family
	active atomic.Int64
	used   atomic.Int64
}

// hubSlot returns where the engine's waiting machinery lives: the mutex,
// the hub pointer and the closed flag it guards; the engine's own, or its
// family's.
func (e *Engine) hubSlot() (*sync.Mutex, **hub, *bool) {
	if e.fam != nil {
		return &e.fam.mu, &e.fam.hub, &e.fam.closed
	}
	return &e.hubMu, &e.hub, &e.closed
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
	e := &Engine{cfg: cfg, keys: KeysFor(cfg.Prefix, cfg.Name), pub: "PUBLISH"}
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
	e.hubMu.Lock()
	h := e.hub
	e.hub = nil
	e.closed = true
	e.hubMu.Unlock()
	if h != nil {
		h.shutdown()
	}
	e.stop()
	return nil
}

// WaitUndos waits until no undo runs (for tests that check what is left in
// Redis after an abandoned call).
func (e *Engine) WaitUndos() { e.undos.Wait() }

func (e *Engine) isClosed() bool {
	mu, _, closed := e.hubSlot()
	mu.Lock()
	defer mu.Unlock()
	return *closed
}

// run calls a script with the semaphore's keys and the common ARGV prefix
// (channel base, publish command, limit).
func (e *Engine) run(ctx context.Context, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	return e.runOn(ctx, e.cfg.Client, s, limit, args...)
}

// runOn is run on a given client or connection. Every script call of the
// library goes through here; status.lua, which writes nothing, runs with
// EVALSHA_RO so that it may run on a read-only replica.
//
// The call returns once ctx ends, whatever the client does: go-redis honours
// a context's deadline only on clients built with ContextTimeoutEnabled, and
// retries a failed command on its own, so the command runs on a goroutine of
// its own and is abandoned (its reply ignored) when ctx ends first. What an
// abandoned request may still do in Redis is made harmless by the scripts:
// see undo.
func (e *Engine) runOn(ctx context.Context, c redis.Scripter, s lua.Script, limit int, args ...any) ([]any, time.Time, error) {
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, e.keys.Chan, e.pub, limit)
	argv = append(argv, args...)
	sent := time.Now()
	call := func() ([]any, error) {
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
		} else {
			cmd = script.Run(ctx, c, e.keys.List, argv...)
		}
		return cmd.Slice()
	}
	v, err := bounded(ctx, call)
	if err != nil {
		return nil, sent, e.callErr(ctx, err)
	}
	return v, sent, nil
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
		out = fmt.Errorf("redsem: %q: gave up: %w (%w)", e.cfg.Name, base, cause)
	} else {
		out = fmt.Errorf("redsem: %q: gave up: %w", e.cfg.Name, base)
	}
	if err != nil && !errors.Is(err, base) {
		out = errors.Join(out, err)
	}
	return out
}

func (e *Engine) wrap(err error) error {
	return fmt.Errorf("redsem: %q: %w", e.cfg.Name, err)
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

// Reply codes of acquire.lua.
const (
	codeGranted   = 1
	codeQueued    = 0 // not granted (queued or not)
	codeMismatch  = -1
	codeCancelled = -2
	codeWeight    = -3
	codeQueueFull = -4
)

// attempt is one run of acquire.lua, decoded.
type attempt struct {
	code     int64
	now      int64 // server ms
	token    int64
	slots    []int
	deadline time.Time // granted: local estimate, never late
	hint     int64     // not granted: ms until a holder may expire, -1 none
	position int64     // not granted: place in the queue, -1 not queued
	other    int64     // mismatch: established limit; weight: limit; queue full: entries
}

// decodeAttempt checks and decodes an acquire.lua reply; sent is when the
// request left.
func decodeAttempt(v []any, sent time.Time) (attempt, error) {
	r := reader{script: "acquire", v: v}
	a := attempt{code: r.int(), now: r.int()}
	switch a.code {
	case codeGranted:
		a.token = r.int()
		dl := r.int()
		for r.more() {
			a.slots = append(a.slots, int(r.int()))
		}
		if len(a.slots) == 0 {
			r.fail("no slots")
		}
		a.deadline = expiresBy(sent, dl-a.now)
	case codeQueued:
		a.hint, a.position = r.int(), r.int()
	case codeMismatch, codeWeight, codeQueueFull:
		a.other = r.int()
	case codeCancelled:
	default:
		r.fail("unknown code")
	}
	return a, r.err
}

// acquireOnce runs acquire.lua once for id. mode is "try", "wait" or
// "queue"; sid is the fair session (queue mode).
func (e *Engine) acquireOnce(ctx context.Context, id string, n int, mode, sid string) (attempt, error) {
	if ctx.Err() != nil {
		return attempt{}, e.ctxErr(ctx, nil) // nothing sent
	}
	if sid == "" {
		sid = "-"
	}
	// A request that reaches Redis after its caller gave up (held in the
	// network, or behind a paused server) must write nothing, even once
	// its undo's cancellation record is gone: tell the script when that is,
	// in server time, with a second's margin for the clocks' drift.
	var refuseAfter int64
	if d, ok := ctx.Deadline(); ok {
		s, known := e.clock.serverAt(d)
		if !known {
			// Once per Engine: the first call has no reply to go by. A
			// failure to reach Redis is the acquire's (nothing was sent
			// that writes); any other error leaves this one request
			// bounded by its cancellation record only.
			if err := e.readClock(ctx); err != nil && (ctx.Err() != nil || Transient(err)) {
				return attempt{}, err
			}
			s, known = e.clock.serverAt(d)
		}
		if known {
			refuseAfter = s + 1000
		}
	}
	v, sent, err := e.run(ctx, lua.Acquire, e.cfg.Limit, id, n, ms(e.cfg.LeaseTTL), mode, sid,
		ms(3*e.cfg.Fallback), e.cfg.Owner, e.cfg.MaxWaiters, refuseAfter)
	if err != nil {
		return attempt{}, err
	}
	a, err := decodeAttempt(v, sent)
	if err != nil {
		return a, e.wrap(err)
	}
	e.clock.observe(sent, a.now)
	e.checkEvictionPolicy(ctx)
	switch a.code {
	case codeMismatch:
		return a, &redsem.LimitMismatchError{Name: e.cfg.Name, Client: e.cfg.Limit, Established: int(a.other)}
	case codeWeight:
		return a, fmt.Errorf("redsem: %q: %d slots wanted, limit in force is %d: %w", e.cfg.Name, n, a.other, redsem.ErrWeight)
	case codeQueueFull:
		return a, fmt.Errorf("redsem: %q: %d waiters queued: %w", e.cfg.Name, a.other, redsem.ErrQueueFull)
	case codeCancelled:
		return a, e.wrap(errors.New("acquire cancelled by its own undo"))
	}
	return a, nil
}

// grant is a grant as scripts report it in a grant list, decoded.
type grant struct {
	id       string
	token    int64
	slots    []int
	deadline time.Time
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

// TryAcquire makes one attempt and never waits.
func (e *Engine) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	return e.TryAcquireN(ctx, 1)
}

// TryAcquireN makes one attempt to take n slots and never waits.
func (e *Engine) TryAcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	if err := e.enter(n); err != nil {
		return nil, err
	}
	defer e.idle()
	start := time.Now()
	id := uuid.NewString()
	a, err := e.acquireOnce(ctx, id, n, "try", "")
	if err != nil {
		e.undo(ctx, id, err)
		e.failed(err)
		return nil, err
	}
	if a.code != codeGranted {
		return nil, redsem.ErrNoSlot
	}
	l, err := e.replicated(ctx, e.granted(start, id, a.slots, a.token, a.deadline), nil)
	if err != nil {
		e.failed(err)
	}
	return l, err
}

// checkWeight refuses n outside [1, MaxLimit] without asking Redis (the
// scripts refuse n above the limit in force).
func (e *Engine) checkWeight(n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("redsem: %q: %d slots wanted: %w", e.cfg.Name, n, redsem.ErrWeight)
	}
	return nil
}

// granted makes the lease of a grant and reports it.
func (e *Engine) granted(start time.Time, id string, slots []int, token int64, deadline time.Time) *Lease {
	l := e.newLease(id, slots, token, deadline)
	e.emit(redsem.Event{Kind: redsem.EventAcquired, LeaseID: id, Slot: slots[0], Token: token, Wait: time.Since(start)})
	return l
}

// failed reports an acquire that failed with err.
func (e *Engine) failed(err error) {
	kind := redsem.EventAcquireFailed
	if errors.Is(err, redsem.ErrLimitMismatch) {
		kind = redsem.EventLimitMismatch
	}
	e.emit(redsem.Event{Kind: kind, Err: err})
}

// undo cancels id after a failed or abandoned acquire: a reply lost on the
// wire may have granted or queued it, or the request may still be in
// flight (an abandoned call, a paused Redis). release.lua removes whatever
// id holds or where it waits, and leaves a cancellation record that
// acquire.lua honours should the acquire run after it: the two may run in
// either order. Errors that acquire.lua returns before writing anything
// need no undo.
//
// undo does not wait: the release runs on a goroutine of its own, detached
// from ctx, and is tried again with backoff while Redis cannot be reached,
// for at most LeaseTTL (a grant it could not undo expires by then; a queue
// entry of this process's session is evicted when it reaches the head and
// nobody claims it). Close stops those retries.
func (e *Engine) undo(ctx context.Context, id string, cause error) {
	if errors.Is(cause, redsem.ErrLimitMismatch) || errors.Is(cause, redsem.ErrWeight) ||
		errors.Is(cause, redsem.ErrQueueFull) || isDialError(cause) {
		// Nothing written; or (a failed dial) nothing sent on this try, and
		// a grant an earlier, retried try made expires after LeaseTTL.
		return
	}
	e.undos.Add(1)
	go func() {
		defer e.undos.Done()
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.LeaseTTL)
		defer cancel()
		stop := context.AfterFunc(e.stopped, cancel)
		defer stop()
		for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			if _, _, err := e.release(uctx, id, "undo"); err == nil || !Transient(err) {
				return
			}
			t := time.NewTimer(jitter(wait))
			select {
			case <-t.C:
			case <-uctx.Done():
				t.Stop()
				return
			}
		}
	}()
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

// isDialError reports whether err is a failure to connect.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
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
	return st, r.err
}

// SetLimit sets the limit for every client of this name.
func (e *Engine) SetLimit(ctx context.Context, limit int) error {
	if limit < 1 || limit > MaxLimit {
		return cfgErr("limit", "%d is outside [1, %d]", limit, MaxLimit)
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

// deliverGrants wakes local waiters named in a script reply's grant list,
// without waiting for the pub/sub message.
func (e *Engine) deliverGrants(script string, v []any, from int, now int64, sent time.Time) {
	mu, slot, _ := e.hubSlot()
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
// are those of runOn.
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
		return e.callErr(ctx, err)
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
