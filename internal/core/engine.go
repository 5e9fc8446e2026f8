// Package core is the machinery that the fair and unfair semaphores share:
// key layout, script calls and their replies, leases with their watchdog,
// and the per-semaphore hub that receives wake-ups and keeps fair waiters
// alive. It is internal: the public surface is the root package redsem and
// the packages fair and unfair.
package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
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

	clock serverClock

	policyOnce sync.Once
	policy     string

	hubMu  sync.Mutex
	hub    *hub
	closed bool // under hubMu
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Engine{cfg: cfg, keys: KeysFor(cfg.Prefix, cfg.Name)}, nil
}

// Name is the semaphore's name.
func (e *Engine) Name() string { return e.cfg.Name }

// Keys returns the semaphore's keys (for tools and tests).
func (e *Engine) Keys() Keys { return e.keys }

// Close stops the background work of waiting (the wake-up subscription and
// the fair heartbeat). Leases already granted keep renewing until released.
func (e *Engine) Close() error {
	e.hubMu.Lock()
	h := e.hub
	e.hub = nil
	e.closed = true
	e.hubMu.Unlock()
	if h != nil {
		h.shutdown()
	}
	return nil
}

// run calls a script with the semaphore's keys and the common ARGV prefix.
func (e *Engine) run(ctx context.Context, s *redis.Script, limit int, args ...any) ([]any, time.Time, error) {
	argv := make([]any, 0, 2+len(args))
	argv = append(argv, e.keys.Chan, limit)
	argv = append(argv, args...)
	sent := time.Now()
	v, err := s.Run(ctx, e.cfg.Client, e.keys.List, argv...).Slice()
	if err != nil {
		return nil, sent, e.wrap(err)
	}
	return v, sent, nil
}

func (e *Engine) wrap(err error) error {
	return fmt.Errorf("redsem: %q: %w", e.cfg.Name, err)
}

// attempt is one run of acquire.lua.
type attempt struct {
	code     int64 // 1 granted, 0 not granted, -1 limit mismatch
	slot     int
	token    int64
	msLeft   int64 // granted: lease time left
	hint     int64 // not granted: ms to the earliest holder deadline, -1 none
	position int64 // not granted: place in the queue, -1 not queued
	deadline time.Time
}

func (e *Engine) tryOnce(ctx context.Context, id string, queue bool, sid string) (attempt, error) {
	mode := "try"
	if queue {
		mode = "queue"
	}
	if err := ctx.Err(); err != nil {
		return attempt{}, e.wrap(err) // nothing sent
	}
	// The script runs to completion even if ctx ends meanwhile. A request
	// abandoned in flight may still run after the release that undoes it
	// (sent on another connection) and leave a slot or a queue entry that
	// nobody owns; with the reply in hand, the caller's undo comes after it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	v, sent, err := e.run(rctx, lua.Acquire, e.cfg.Limit, id, ms(e.cfg.LeaseTTL), mode, sid, ms(e.cfg.QueueTTL))
	if err == nil && ctx.Err() != nil {
		err = e.wrap(ctx.Err()) // the caller gave up meanwhile: undo what the script did
	}
	if err != nil {
		return attempt{}, err
	}
	if len(v) != 5 {
		return attempt{}, e.wrap(fmt.Errorf("unexpected acquire reply %v", v))
	}
	e.clock.observe(sent, toInt(v[4]))
	e.checkEvictionPolicy(ctx)
	a := attempt{code: toInt(v[0])}
	switch a.code {
	case 1:
		a.slot, a.token, a.msLeft = int(toInt(v[1])), toInt(v[2]), toInt(v[3])
		a.deadline = expiresBy(sent, a.msLeft)
	case 0:
		a.hint, a.position = toInt(v[1]), toInt(v[2])
	case -1:
		return a, &redsem.LimitMismatchError{Name: e.cfg.Name, Client: e.cfg.Limit, Established: int(toInt(v[1]))}
	}
	return a, nil
}

// TryAcquire makes one attempt and never waits.
func (e *Engine) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	if e.isClosed() {
		return nil, redsem.ErrClosed
	}
	start := time.Now()
	id := uuid.NewString()
	a, err := e.tryOnce(ctx, id, false, "")
	if err != nil {
		e.undo(ctx, id, err)
		e.failed(err)
		return nil, err
	}
	if a.code != 1 {
		return nil, redsem.ErrNoSlot
	}
	l, err := e.replicated(ctx, e.granted(start, id, a.slot, a.token, a.deadline), nil)
	if err != nil {
		e.failed(err)
	}
	return l, err
}

// granted makes the lease of a grant and reports it.
func (e *Engine) granted(start time.Time, id string, slot int, token int64, deadline time.Time) *Lease {
	l := e.newLease(id, slot, token, deadline)
	e.emit(redsem.Event{Kind: redsem.EventAcquired, LeaseID: id, Slot: slot, Token: token, Wait: time.Since(start)})
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

// undo releases id after a failed or abandoned acquire: a reply lost on the
// wire may have granted or queued it. A limit mismatch wrote nothing.
//
// When the last error was a failed dial, the server could not be reached and
// undo does not try either (it would only wait for the same failure); a
// grant made by an earlier, retried attempt then expires after LeaseTTL.
func (e *Engine) undo(ctx context.Context, id string, cause error) {
	if errors.Is(cause, redsem.ErrLimitMismatch) || isDialError(cause) {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if v, sent, err := e.run(cctx, lua.Release, e.cfg.Limit, id); err == nil {
		e.deliverGrants(v, 2, sent)
	}
}

func (e *Engine) isClosed() bool {
	e.hubMu.Lock()
	defer e.hubMu.Unlock()
	return e.closed
}

// isDialError reports whether err is a failure to connect.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Acquire blocks until a slot is granted or ctx ends.
func (e *Engine) Acquire(ctx context.Context) (redsem.Lease, error) {
	if e.isClosed() {
		return nil, redsem.ErrClosed
	}
	start := time.Now()
	var l redsem.Lease
	var err error
	if e.cfg.Fair {
		l, err = e.acquireFair(ctx, start)
	} else {
		l, err = e.acquireUnfair(ctx, start)
	}
	l, err = e.replicated(ctx, l, err)
	if err != nil {
		if ctx.Err() != nil {
			e.emit(redsem.Event{Kind: redsem.EventAcquireTimedOut, Wait: time.Since(start), Err: err})
		} else {
			e.failed(err)
		}
	}
	return l, err
}

func (e *Engine) gaveUp(ctx context.Context) error {
	return fmt.Errorf("redsem: acquire %q: gave up waiting: %w", e.cfg.Name, context.Cause(ctx))
}

// fail turns an error met while acquiring into the error Acquire returns,
// after undoing whatever the attempt may have left in Redis.
func (e *Engine) fail(ctx context.Context, id string, err error) error {
	e.undo(ctx, id, err)
	if ctx.Err() != nil {
		return errors.Join(e.gaveUp(ctx), err)
	}
	return err
}

func (e *Engine) acquireUnfair(ctx context.Context, start time.Time) (redsem.Lease, error) {
	id := uuid.NewString()
	var w *waiter
	defer func() {
		if w != nil {
			w.h.unregister(w)
		}
	}()
	for {
		a, err := e.tryOnce(ctx, id, false, "")
		if err != nil {
			return nil, e.fail(ctx, id, err)
		}
		if a.code == 1 {
			return e.granted(start, id, a.slot, a.token, a.deadline), nil
		}
		if w == nil {
			// Subscribe, then try again at once: a slot freed between the
			// first attempt and the subscription is not missed.
			if w, err = e.register(ctx, id, false); err != nil {
				return nil, e.fail(ctx, id, err)
			}
			continue
		}
		t := time.NewTimer(e.waitFor(a.hint))
		select {
		case <-w.events:
		case <-t.C:
		case <-w.h.quit:
			t.Stop()
			return nil, redsem.ErrClosed
		case <-ctx.Done():
			t.Stop()
			return nil, e.gaveUp(ctx)
		}
		t.Stop()
	}
}

// waitFor is how long an unfair waiter sleeps without a message: until just
// after the earliest holder deadline, at most Fallback, with ±20% jitter.
func (e *Engine) waitFor(hint int64) time.Duration {
	d := e.cfg.Fallback
	if hint >= 0 {
		if h := time.Duration(hint+1) * time.Millisecond; h < d {
			d = h
		}
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func (e *Engine) acquireFair(ctx context.Context, start time.Time) (redsem.Lease, error) {
	id := uuid.NewString()
	w, err := e.register(ctx, id, true)
	if err != nil {
		return nil, err
	}
	defer w.h.unregister(w)
	for {
		sent := time.Now()
		a, err := e.tryOnce(ctx, id, true, w.h.sid)
		if err != nil {
			return nil, e.fail(ctx, id, err)
		}
		w.h.refreshed(sent, time.Now())
		if a.code == 1 {
			return e.granted(start, id, a.slot, a.token, a.deadline), nil
		}
		w.h.queued(w, a.hint)
	wait:
		select {
		case ev := <-w.events:
			switch ev.kind {
			case evGrant:
				deadline := ev.deadline
				if !ev.claimed {
					until, ok := w.h.trusted(ev.at)
					if !ok {
						// The session may have expired since the grant
						// (this process was paused or cut off), which
						// revokes an unclaimed grant: ask Redis, which
						// claims it if it still stands and queues this
						// waiter again if not.
						continue
					}
					// Until it is claimed, the grant lasts only as long
					// as the session.
					deadline = minTime(deadline, until)
				}
				return e.granted(start, id, ev.slot, ev.token, deadline), nil
			case evGone: // evicted: queue again, at the back
				e.emit(redsem.Event{Kind: redsem.EventWaiterEvicted, LeaseID: id})
				continue
			default:
				goto wait
			}
		case <-w.h.quit: // Close: leave the queue
			e.undo(ctx, id, nil)
			return nil, redsem.ErrClosed
		case <-ctx.Done():
			// Leave the queue, or hand back a slot granted in the race.
			e.undo(ctx, id, nil)
			return nil, e.gaveUp(ctx)
		}
	}
}

// Status reads the live state.
func (e *Engine) Status(ctx context.Context) (redsem.Status, error) {
	v, _, err := e.run(ctx, lua.Status, e.cfg.Limit)
	if err != nil {
		return redsem.Status{}, err
	}
	st := redsem.Status{Limit: int(toInt(v[0]))}
	i := 2
	n := int(toInt(v[i]))
	i++
	for k := 0; k < n; k++ {
		st.Holders = append(st.Holders, redsem.Holder{
			ID: toStr(v[i]), Slot: int(toInt(v[i+1])), Token: toInt(v[i+2]),
			Deadline: time.UnixMilli(toInt(v[i+3])),
		})
		i += 4
	}
	n = int(toInt(v[i]))
	i++
	for k := 0; k < n; k++ {
		st.Waiters = append(st.Waiters, redsem.Waiter{
			ID: toStr(v[i]), Position: k, Deadline: time.UnixMilli(toInt(v[i+1])),
		})
		i += 2
	}
	return st, nil
}

// SetLimit sets the limit for every client of this name.
func (e *Engine) SetLimit(ctx context.Context, limit int) error {
	if limit < 1 || limit > MaxLimit {
		return cfgErr("limit", "%d is outside [1, %d]", limit, MaxLimit)
	}
	v, sent, err := e.run(ctx, lua.SetLimit, limit)
	if err != nil {
		return err
	}
	e.deliverGrants(v, 1, sent)
	return nil
}

// deliverGrants wakes local waiters named in a script reply's grant list
// (id, slot, token, lease_ms, ... from index from), without waiting for the
// pub/sub message. sent is when the request left, so sent+lease_ms is an
// early estimate of each deadline.
func (e *Engine) deliverGrants(v []any, from int, sent time.Time) {
	e.hubMu.Lock()
	h := e.hub
	e.hubMu.Unlock()
	if h == nil {
		return
	}
	for i := from; i+3 < len(v); i += 4 {
		h.deliver(toStr(v[i]), event{
			kind: evGrant, slot: int(toInt(v[i+1])), token: toInt(v[i+2]),
			deadline: expiresBy(sent, toInt(v[i+3])), at: sent,
		})
	}
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

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}
