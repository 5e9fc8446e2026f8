package core

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// The acquire path, in one shape:
//
//	AcquireN / TryAcquireN
//	  newCall          a call: the caller's context, ended also by Close (cause ErrClosed)
//	  e.variant.next   the variant's round (below): fairWait registers with the hub,
//	                   queues under the session and waits for a grant; unfairWait
//	                   tries, subscribes and waits for freed-slot notices. Both send
//	                   through c.attempt, one run of acquire.lua (wire.Door.Acquire)
//	  c.retry          rides a transient error out with backoff, within c.ctx
//	  c.exit           undoes what a failed call may have left, classifies the error once
//
// The steps return raw errors; only exit turns them into what the caller
// sees (the context's error with its cause, ErrClosed, ErrUnavailable), and
// only exit undoes, so no step has to know how the call will end.

// Acquire blocks until a slot is granted or ctx ends.
func (e *Engine) Acquire(ctx context.Context) (redsem.Lease, error) {
	return e.AcquireN(ctx, 1)
}

// AcquireN blocks until n slots are granted at once, ctx ends or the
// semaphore is closed.
func (e *Engine) AcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	c, err := newCall(ctx, e, n)
	if err != nil {
		return nil, err
	}
	for {
		g, ok, err := e.variant.next(c)
		if err != nil {
			err = c.retry(err) // nil: ridden out, ask again
		}
		switch {
		case err != nil:
			e.variant.done(c)
			return c.exit(nil, err)
		case ok && late(g):
			// Granted, but the reply came after the lease's deadline as
			// this process counts it: ask again (acquire.lua answers with
			// the lease it holds for this id, its remaining time counted
			// from the new request).
		case ok:
			e.variant.done(c)
			return c.exit(c.lease(g), nil)
		}
	}
}

// late reports whether a grant's deadline (counted from the first send of
// the request that was answered: a request re-sent by go-redis may reach
// Redis much later) has passed already: a lease made from it would be
// lost at once, so no call returns one.
func late(g grant) bool { return !time.Now().Before(g.Deadline) }

// waiting is how a call waits for its grant: the variant's strategy,
// chosen when the engine is made. The call's goroutine runs it, and is the
// one owner of its waiter's state.
type variant interface {
	// next makes the call's next acquire request and waits as the variant
	// does: until it is granted (ok), must ask again (ok false), or fails
	// (a raw error: the call's loop rides a transient one out).
	next(c *call) (g grant, ok bool, err error)
	// done ends the call's wait: its waiter, if any, leaves the hub.
	done(c *call)
	// listener is what the variant's hub subscription serves: the fair
	// session, or the unfair wake list.
	listener(h *hub) listener
	// leaveAtClose removes, within bounds.CloseUndo, what a call that Close
	// ended left queued in Redis; false if it leaves that to Engine.undoLater
	// (fair: its entry would hold up the queue until its session expired;
	// unfair: nothing queues).
	leaveAtClose(c *call) bool
	// tag is the variant as the scripts name it in ARGV[3] ("f" or "u").
	tag() string
	// localQueue reports that the variant's waiters are known only to
	// their process (unfair), not recorded in Redis (fair).
	localQueue() bool
}

// TryAcquire makes one attempt and never waits.
func (e *Engine) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	return e.TryAcquireN(ctx, 1)
}

// TryAcquireN makes one attempt to take n slots and never waits: also not
// for go-redis to dial again, or to retry its command, once a dial of the
// client failed while the attempt ran (a refused dial fails at once; one
// to a host that does not answer, after the client's DialTimeout): the
// call then returns that dial's error (matching ErrUnavailable). On a
// cluster client, where one node may be down while the others answer,
// the client's DialTimeout and MaxRetries bound it.
func (e *Engine) TryAcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	c, err := newCall(ctx, e, n)
	if err != nil {
		return nil, err
	}
	c.try = true
	if _, cluster := e.cfg.Client.(*redis.ClusterClient); !cluster {
		stop := e.alerts.dials.onFailure(func(err error) { c.cancel(err) })
		defer stop()
	}
	a, err := c.attempt("try", "")
	if err == nil && a.Code == wire.CodeGranted && late(a.Grant()) {
		// The reply came after the lease's deadline (see late): once more,
		// with the same id, for the lease's remaining time.
		a, err = c.attempt("try", "")
		if err == nil && a.Code == wire.CodeGranted && late(a.Grant()) {
			err = wire.Errorf(redsem.ErrUnavailable, "redsem: %s: granted, but each reply came after the lease's deadline (Redis answers later than LeaseTTL %s)",
				e.who(), duration(e.cfg.LeaseTTL))
		}
	}
	if cause := context.Cause(c.ctx); err != nil && c.parent.Err() == nil && cause != nil && cause != redsem.ErrClosed {
		err = cause // a dial failed: the error says why, not that the call was cancelled
	}
	var l *Lease
	switch {
	case err != nil:
	case a.Code == wire.CodeGranted:
		l = c.lease(a.Grant())
	case a.RateMs >= 0:
		err = &redsem.RateLimitedError{Name: e.cfg.Name, Family: e.familyName(), Rate: a.RateInForce, RetryAfter: time.Duration(a.RateMs) * time.Millisecond}
	default:
		err = redsem.ErrNoSlot
	}
	return c.exit(l, err)
}

// call is one AcquireN or TryAcquireN call.
type call struct {
	e      *Engine
	parent context.Context // the caller's
	// ctx is parent, ended also by Close (with cause redsem.ErrClosed):
	// every wait and every request of the call runs within it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	unbind func() bool // detaches Close from ctx

	id    string // the lease or waiter id, reused by every attempt
	n     int
	start time.Time
	try   bool // TryAcquireN: one attempt, no waiting

	tried   bool  // a request (the clock read, acquire.lua) was started
	sent    bool  // a request that writes (acquire.lua) may have reached Redis
	replied bool  // Redis answered at least once
	lastErr error // the last transient error ridden out, while no answer came since
	// rateRoom: the latest reply said that the rate's window held the call
	// back while a slot was free (wire.AcquireReply.rateMs): when the window
	// has room, by the local clock, and the rate in force; zero otherwise.
	rateRoom time.Time
	rate     redsem.Rate
	// replyAt, replyLocal: when the latest reply's script ran (server ms)
	// and when the reply came (local): news of the rate older than that
	// reply is not the call's reason (heldByRate).
	replyAt    int64
	replyLocal time.Time

	backoff bounds.Backoff
	timer   *time.Timer // the call's one timer (retry pauses, unfair waits)
	w       *waiter     // registered with the hub once the call waits
}

// newCall checks n and that e is open, marks e busy (a family keeps the
// member) and binds Close into the call's context.
func newCall(ctx context.Context, e *Engine, n int) (*call, error) {
	if n < 1 || n > MaxLimit {
		return nil, wire.Errorf(redsem.ErrWeight, "redsem: %s: %d slots wanted, outside [1, limit]", e.who(), n)
	}
	if e.isClosed() {
		return nil, redsem.ErrClosed
	}
	e.use.busy()
	e.policy.check(e.cfg.Client, e.rep) // once, beside the first request
	c := &call{e: e, parent: ctx, id: uuid.NewString(), n: n, start: time.Now()}
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	c.unbind = context.AfterFunc(e.stopped, func() { c.cancel(redsem.ErrClosed) })
	c.timer = time.NewTimer(time.Hour)
	c.timer.Stop()
	return c, nil
}

// retry waits out a transient error with jittered backoff and returns nil
// to go on; any other error (or the end of c.ctx) is returned as is.
func (c *call) retry(err error) error {
	if c.ctx.Err() != nil || !wire.Transient(err) {
		return err
	}
	c.lastErr = err // the request that learnt it raised the alert (answered)
	if !c.sleep(c.backoff.Next()) {
		return c.ctx.Err()
	}
	return nil
}

// sleep waits d within c.ctx; false when c.ctx ended first.
func (c *call) sleep(d time.Duration) bool {
	c.timer.Reset(d)
	defer c.timer.Stop()
	select {
	case <-c.timer.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// lease makes the lease of a grant.
func (c *call) lease(g grant) *Lease {
	l, _ := newLease(c.e, c.id, g.Slots, g.Token, g.Deadline) // a new id: always fresh
	return l
}

// exit ends the call: a grant is confirmed on replicas (if configured) and
// reported; a failure is undone (if a request may have left something in
// Redis), classified once (acquireErr) and reported.
func (c *call) exit(l *Lease, err error) (redsem.Lease, error) {
	e := c.e
	defer func() {
		c.unbind()
		c.cancel(nil)
		c.timer.Stop()
		e.use.idle()
	}()
	if err == nil {
		if err = l.confirmReplicas(c.ctx); err == nil {
			e.rep.emit(redsem.Event{Kind: redsem.EventAcquired, LeaseID: c.id, Slot: l.slots[0], Token: l.token, Wait: time.Since(c.start)})
			return l, nil
		}
		// confirmReplicas handed the slots back (or the lease was lost).
	} else if c.sent && needsUndo(err) {
		c.undo()
	}
	err, alert := acquireErr(err, c.end(err))
	if alert != nil {
		e.rep.unreachable(alert) // a failed dial that no request reported
	}
	switch {
	case errors.Is(err, redsem.ErrNoSlot) && c.try:
	case errors.Is(err, redsem.ErrUnavailable):
		e.rep.emit(redsem.Event{Kind: redsem.EventUnavailable, Wait: time.Since(c.start), Err: err})
	case c.parent.Err() != nil:
		e.rep.emit(redsem.Event{Kind: redsem.EventAcquireTimedOut, Wait: time.Since(c.start), Err: err})
	case errors.Is(err, redsem.ErrLimitMismatch):
		e.rep.emit(redsem.Event{Kind: redsem.EventLimitMismatch, Err: err})
	default:
		e.rep.emit(redsem.Event{Kind: redsem.EventAcquireFailed, Err: err})
	}
	return nil, err
}

// heldByRate returns when the rate's window has room for the call and the
// rate in force, if the rate held it back last: the latest reply said so
// (rateRoom), or the call waited (a fair queue, or an unfair waiter that
// sleeps while another of its process tries) while the rate held back the
// semaphore's next grant, and still does (rateHeld: set from a reply to
// any call of the process, or the fair "w" message; its rate: the latest a
// reply of this call named, else the client's); zero otherwise.
func (c *call) heldByRate() (time.Time, redsem.Rate) {
	held, seen, at, reset := c.e.rateHeld.get()
	if !c.rateRoom.IsZero() {
		if c.replyAt <= reset {
			// This process's SetRate ran after that reply: what the
			// former rate held back is not the reason now (a fair waiter
			// behind a head the window held hears no later reply).
			return time.Time{}, redsem.Rate{}
		}
		return c.rateRoom, c.rate
	}
	if c.w == nil {
		return time.Time{}, redsem.Rate{}
	}
	if !held.After(time.Now()) || seen.Before(c.start) {
		return time.Time{}, redsem.Rate{} // not now, or learnt before this call waited
	}
	if (at != 0 && at <= c.replyAt) || (at == 0 && !c.replyLocal.IsZero() && seen.Before(c.replyLocal)) {
		// The call's own latest reply is newer news: it was not held by
		// the rate then (e.g. another process's SetRate removed it, and
		// the slots refused the call).
		return time.Time{}, redsem.Rate{}
	}
	rate := c.rate
	if rate.IsZero() {
		rate = c.e.cfg.Rate
	}
	return held, rate
}

// rateHold is until when the rate's window holds back a semaphore's next
// grant, as the latest reply that said so (attempt) or fair "w" message
// (session.go) or unfair "0" notice (unfairwait.go) told: a waiter that
// gives up before then was held by the rate, whatever held it before
// (heldByRate); and when it was last set (seen): only a waiter that waited
// then was held by it. News that a script found before this process's
// latest SetRate ran (by the server clock: a notice delayed on the
// subscription's connection past SetRate's reply) is no one's reason.
type rateHold struct {
	mu    sync.Mutex
	until time.Time // zero: none
	seen  time.Time
	at    int64 // server ms at which the script that found it ran; 0: unknown
	reset int64 // server ms of the latest SetRate: this process's, or another's that a fair session heard of ("n" message)
}

// hold records that the rate's window holds back the semaphore's next
// grant until until, as a script that ran at server time at (ms; 0:
// unknown) found, learnt now.
func (r *rateHold) hold(until time.Time, at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at != 0 && at <= r.reset {
		return // found before the rate was set anew (or in its ms: unsure)
	}
	r.until, r.seen, r.at = until, time.Now(), at
}

// get returns until when the rate holds back the next grant, when that
// was learnt, the server time (ms) its script ran (0: unknown), and when
// this process's latest SetRate ran (server ms; 0: none).
func (r *rateHold) get() (until, seen time.Time, at, reset int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until, r.seen, r.at, r.reset
}

// none reports that no hold was learnt since the last SetRate.
func (r *rateHold) none() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until.IsZero()
}

// setRate forgets the hold: SetRate ran at server time at (ms), and what
// the former rate held back is no one's reason now, nor is news found
// before then that arrives later.
func (r *rateHold) setRate(at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.until, r.seen, r.at, r.reset = time.Time{}, time.Time{}, 0, max(r.reset, at)
}

// end gathers what the call knew when it ended with err, for acquireErr:
// a failed dial of its client since it began (when its context ended it
// before any request reported one) and whether the rate held it back last.
func (c *call) end(err error) callEnd {
	e := c.e
	end := callEnd{who: e.who(), name: e.cfg.Name, family: e.familyName(), parent: c.parent, lastErr: c.lastErr,
		ended: c.parent.Err() != nil, closed: context.Cause(c.ctx) == redsem.ErrClosed}
	if end.ended {
		if c.tried && isCtxErr(err) {
			end.dialErr = e.alerts.dials.failedSince(c.start)
		}
		end.room, end.rate = c.heldByRate()
	}
	return end
}

// undo removes what the call's requests may have left: a fair waiter that
// Close ended leaves the queue at once, within the caller's context (Close
// stops detached undos, and its entry would hold up the queue until its
// session expired); anything else, or if that failed, on a detached
// goroutine (Engine.undoLater), so that no caller waits for it.
func (c *call) undo() {
	if c.parent.Err() == nil && context.Cause(c.ctx) == redsem.ErrClosed && c.e.variant.leaveAtClose(c) {
		return
	}
	c.e.undoLater(c.parent, c.id)
}

// undo cancels id after a failed or abandoned acquire: a reply lost on the
// wire may have granted or queued it, or the request may still be in
// flight (an abandoned call, a paused Redis). release.lua removes whatever
// id holds or where it waits, and leaves a cancellation record that
// acquire.lua honours should the acquire run after it: the two may run in
// either order (and acquire.lua refuses a request that runs after its
// caller's deadline plus a second, however long ago that record was
// pruned).
//
// undo does not wait: the release runs on a goroutine of its own, detached
// from ctx, and is tried again with backoff while Redis cannot be reached,
// for at most LeaseTTL (a grant it could not undo expires by then; a queue
// entry of this process's session is evicted when it reaches the head and
// nobody claims it). Close stops those retries.
func (e *Engine) undoLater(ctx context.Context, id string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.LeaseTTL)
	e.background(uctx, cancel, func(ctx context.Context) {
		var b bounds.Backoff
		for {
			r, err := e.door.Release(ctx, id, "undo")
			e.activeHub().deliverGrants(r.Grants)
			if err == nil || !wire.Transient(err) {
				return
			}
			if !b.Wait(ctx) {
				return
			}
		}
	})
}

// attempt runs acquire.lua once in mode ("try", "wait" or "queue") with
// session sid (queue mode). A reply with a code that is an error (limit
// mismatch, weight, queue full, cancelled) comes back as that error.
func (c *call) attempt(mode, sid string) (wire.AcquireReply, error) {
	if err := c.ctx.Err(); err != nil {
		return wire.AcquireReply{}, err // nothing sent
	}
	c.tried = true
	if f := c.e.fam; f != nil {
		if err := f.checkShards(c.ctx); err != nil {
			return wire.AcquireReply{}, err // nothing sent that writes a member's keys
		}
	}
	refuseAfter, err := c.e.door.RefuseAfter(c.ctx)
	if err != nil {
		return wire.AcquireReply{}, err // nothing sent that writes
	}
	sentBefore := c.sent
	c.sent = true
	a, err := c.e.door.Acquire(c.ctx, wire.AcquireArgs{ID: c.id, N: c.n, Mode: mode, SID: sid, RefuseAfter: refuseAfter})
	if wire.NeverSent(err) {
		// The dial gate refused it: it never left, and an undo for it
		// would only wait for Redis to come back (while Redis refuses
		// connections, callers that try again and again would leave one
		// each, to run all at once on its return).
		c.sent = sentBefore
	}
	if errors.Is(err, wire.ErrCancelled) && refuseAfter > 0 && a.Now > refuseAfter && c.ctx.Err() == nil {
		// Refused by refuse_after while the caller still waits: the bound
		// came from an older reply, and the server's clock has since
		// stepped forward past it (an NTP correction, a resumed VM), not
		// the request been held up (the caller would have given up). The
		// script wrote nothing, and this reply's time is now the engine's:
		// the request goes again once, bounded anew.
		if refuseAfter, err = c.e.door.RefuseAfter(c.ctx); err != nil {
			return wire.AcquireReply{}, err
		}
		a, err = c.e.door.Acquire(c.ctx, wire.AcquireArgs{ID: c.id, N: c.n, Mode: mode, SID: sid, RefuseAfter: refuseAfter})
	}
	if err == nil {
		c.rateRoom, c.rate = time.Time{}, redsem.Rate{}
		c.replyAt, c.replyLocal = a.Now, time.Now()
		if a.Code == wire.CodeQueued && a.RateMs >= 0 {
			c.rateRoom, c.rate = time.Now().Add(time.Duration(a.RateMs)*time.Millisecond), a.RateInForce
			c.e.rateHeld.hold(c.rateRoom, a.Now) // for the waiters behind this one
		}
	}
	if err == nil || !wire.Transient(err) {
		if err == nil || !errors.Is(err, c.ctx.Err()) {
			c.replied, c.lastErr, c.backoff = true, nil, bounds.Backoff{}
		}
	}
	return a, err
}
