package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
	"github.com/redsem/redsem/internal/sentinel"
)

// A lease has one owner for its state: l.mu. Every transition happens under
// it, and every request to Redis about the lease (a renewal, the release)
// runs as the lease's one operation in flight (l.op): a second one waits
// for the first to end, so a reply is always applied to the state it was
// asked about. Every such request is bounded by the deadline the holder was
// told (Deadline): none outlives it.
//
// The deadline is one moment. When it passes unrenewed, the timer ends the
// lease as lost at once, whatever runs: Err, Done, the cause of Context
// (and so the context redsem.Do gives fn), the event and the metrics all
// say so together. An operation still in flight is ended (its reply no
// longer changes anything), and the slots are then given up in Redis in
// the background (giveUp), which changes no state of the lease.
//
//	state  event                                  next    where
//	held   renewal answered "renewed"             held    endRenew: Deadline moves to the new one
//	held   renewal answered "gone"                lost    endRenew
//	held   renewal answered "released"            released endRenew: a holder released it (another handle: Resume)
//	held   renewal failed (Redis, ctx)            held    endRenew: Deadline unchanged; watchdog retries sooner
//	held   timer: deadline passed                 lost    fire -> lose: any op in flight is ended; giveUp frees the slots
//	held   Release answered "released"            released Release / releaseLater
//	held   Release answered "nothing held"        lost    Release / releaseLater
//	held   Release failed                         held    releaseOnce: let go (letGo): not renewed any more, Renew refuses; retried in the background unless Redis refused it; ends at Deadline
//	held   MinReplicas renewal answered "gone"    lost    markLost (replicas.go)
//	lost, released: final; a reply that comes after is dropped
//
// So Renew returns nil only when Redis renewed the lease and the local state
// took the new deadline before the old one passed: the loss cannot have
// happened in between (it needs mu and a passed deadline), and it cannot
// happen later before the new deadline.

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

// opKind is the operation in flight on a lease.
type opKind int

const (
	opNone    opKind = iota
	opRenew          // a renewal (the watchdog's or the caller's Renew)
	opRelease        // Release, or its retry in the background
)

// errReleasing is the cause with which Release ends a renewal in flight.
var errReleasing = sentinel.New("redsem: the lease is being released")

// errLetGo is what Renew returns after a Release that failed (letGo).
var errLetGo = fmt.Errorf("%w (Release was called and failed: the lease is let go, its release may yet reach Redis or be retried)", redsem.ErrReleased)

// errReleaseWaits is what Renew returns while a Release waits to run.
var errReleaseWaits = fmt.Errorf("%w (Release was called and waits to run)", redsem.ErrReleased)

// Lease implements redsem.Lease for both variants.
type Lease struct {
	e     *Engine
	id    string
	slots []int
	token int64

	ctx    context.Context // cancelled once released or lost
	cancel context.CancelCauseFunc

	granted time.Time // local time of the grant, for hold times
	done    chan struct{}

	mu       sync.Mutex
	state    leaseState
	deadline time.Time
	answered bool // Redis answered that the lease was released (by this handle or another); a later Release returns nil, whatever the state (it may be lost)

	// The operation in flight (opNone: none); opDone is closed when it
	// ends; cancelOp ends it (Release ends a renewal with errReleasing).
	op        opKind
	opDone    chan struct{}
	cancelOp  context.CancelCauseFunc
	releasing int // Release calls waiting for the op: the watchdog starts no renewal
	// letGo: a Release failed after its request may have been sent (or
	// Redis refused it): the holder let the lease go, a request of it may
	// yet reach Redis, and the release may be retried in the background,
	// so Renew refuses from then on (a renewal that succeeded could be
	// undone by either a moment later).
	letGo bool

	// The watchdog is a timer, not a goroutine: nothing runs between
	// renewals. It renews at renewAt while auto-renewal is on and no
	// operation runs; it always fires at the deadline, where it ends the
	// lease unless a renewal moved the deadline (noRenew: renewals stopped
	// for DisableAutoRenew, MaxHold reached, or a Release that failed).
	timer   *time.Timer
	renewAt time.Time
	noRenew bool
	// due: the watchdog found the renewal due and left it to the engine's
	// batch (renewals.go), which clears it; meanwhile the timer waits for
	// the deadline only.
	due bool
}

var _ redsem.Lease = (*Lease)(nil)

// newLease makes the lease of e for a grant (or of Resume), holding slots
// with token until deadline (local), and registers it with e (see
// leaseSet): fresh. When e has a live lease of that id already (only
// Resume can meet one), it returns that lease instead, not fresh.
func newLease(e *Engine, id string, slots []int, token int64, deadline time.Time) (_ *Lease, fresh bool) {
	l := &Lease{
		e: e, id: id, slots: slots, token: token, deadline: deadline, granted: time.Now(),
		done: make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	// Registered under mu, which is held until the lease is complete: a
	// Resume that finds it in e.leases meanwhile waits for it (mu, then
	// the set's mu: the order finishLocked takes them in).
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := e.leases.add(l); old != nil {
		l.cancel(nil)
		return old, false
	}
	e.use.busy() // a family keeps the member of a live lease; finish undoes it
	// The first renewal comes after a third of the TTL, or sooner when the
	// deadline is nearer than a full TTL (a fair grant not yet claimed
	// lasts only as long as its session; a retried acquire returns what is
	// left of its grant). Without auto-renewal the timer waits for the
	// deadline.
	l.noRenew = e.cfg.DisableAutoRenew
	l.renewAt = time.Now().Add(min(bounds.RenewEvery(e.cfg.LeaseTTL), max(time.Until(deadline)/2, 0)))
	l.timer = time.AfterFunc(time.Hour, l.fire)
	l.arm()
	return l, true
}

// ID is unique per acquisition (a UUID), never reused.
func (l *Lease) ID() string { return l.id }

// Slot is the first of the slots this lease holds.
func (l *Lease) Slot() int { return l.slots[0] }

// Slots is every slot the lease holds, ascending.
func (l *Lease) Slots() []int { return append([]int(nil), l.slots...) }

// Context is cancelled once the lease is lost (cause ErrLeaseLost) or
// released (cause context.Canceled).
func (l *Lease) Context() context.Context { return l.ctx }

// Token is the lease's fencing token.
func (l *Lease) Token() int64 { return l.token }

// Deadline is the local estimate of when the lease expires unless renewed:
// never later than the deadline Redis keeps (see package wire's expiresBy, and the session
// bound of an unclaimed fair grant in acquireFair).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed once the lease is released or lost.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while held or after Release, ErrLeaseLost once lost (also
// after a Release that found it lost).
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lost {
		return redsem.ErrLeaseLost
	}
	return nil
}

// stateErr is what a call on a lease that is no longer held returns.
func (l *Lease) stateErr() error {
	if l.state == lost {
		return redsem.ErrLeaseLost
	}
	return redsem.ErrReleased
}

// arm sets the timer for the next thing the watchdog must do (under mu):
// nothing once the lease ended; the deadline while an operation runs or
// renewals stopped; else the next renewal, or the deadline if sooner.
func (l *Lease) arm() {
	if l.state != held {
		l.timer.Stop()
		return
	}
	at := l.deadline
	if l.op == opNone && !l.noRenew && l.releasing == 0 && !l.due && l.renewAt.Before(at) {
		at = l.renewAt
	}
	l.timer.Reset(max(time.Until(at), 0))
}

// startOp makes kind the lease's operation in flight (under mu, with none
// in flight) and returns its context: parent, bounded by the deadline, and
// ended also by cancelOp (Release, the loss). The timer stays set for the
// deadline.
func (l *Lease) startOp(parent context.Context, kind opKind) context.Context {
	dctx, dcancel := context.WithDeadline(parent, l.deadline)
	ctx, cancel := context.WithCancelCause(dctx)
	l.op, l.opDone = kind, make(chan struct{})
	l.cancelOp = func(cause error) { cancel(cause); dcancel() }
	l.arm()
	return ctx
}

// endOp ends the operation in flight (under mu) and re-arms the timer.
func (l *Lease) endOp() {
	l.cancelOp(nil)
	l.op, l.cancelOp = opNone, nil
	close(l.opDone)
	l.arm()
}

// beginOp waits within ctx until no operation is in flight, then starts one
// of kind and returns its context. It returns the state's error if the
// lease ended first, or ctx's. It takes mu and releases it before it
// returns.
func (l *Lease) beginOp(ctx context.Context, kind opKind) (context.Context, error) {
	for {
		l.mu.Lock()
		if l.state != held {
			err := l.stateErr()
			l.mu.Unlock()
			return nil, err
		}
		if kind == opRenew && (l.letGo || l.releasing > 0) {
			// The holder let the lease go, or a Release waits for the op
			// in flight: no renewal starts (one running when Release was
			// called is ended by it).
			err := errLetGo
			if !l.letGo {
				err = errReleaseWaits
			}
			l.mu.Unlock()
			return nil, err
		}
		if l.op == opNone {
			octx := l.startOp(ctx, kind)
			l.mu.Unlock()
			return octx, nil
		}
		wait := l.opDone
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Renew extends the lease to at least now + the lease TTL (never earlier
// than another handle of it set it). It returns nil only when Redis renewed
// the lease before its Deadline, and Deadline then reports the new
// deadline; ErrLeaseLost if the lease is gone or its Deadline passed first
// (and then the lease is lost for good), ErrReleased after a successful
// Release (or when a Release called meanwhile ended the renewal, or a
// Release through another handle of the lease, Resume's, ended the lease,
// or while a Release waits to run, or after a Release that failed: then it
// asks nothing of Redis),
// or the Redis error if Redis could not be asked; it never re-creates a
// lost lease. The request is bounded by ctx and by the Deadline: a renewal
// in flight never keeps the lease past it.
func (l *Lease) Renew(ctx context.Context) error {
	octx, err := l.beginOp(ctx, opRenew)
	if err != nil {
		return err
	}
	r, err := l.e.door.Renew(octx, l.e.cfg.Client, l.id, false)
	return l.endRenew(octx, r, err, false)
}

// endRenew applies a renewal's outcome (auto: the watchdog's) and ends the
// op; it returns what Renew reports. A reply that comes after the lease
// ended (its deadline passed meanwhile) changes nothing.
func (l *Lease) endRenew(octx context.Context, r wire.RenewReply, err error, auto bool) error {
	l.mu.Lock()
	var ev func()
	switch {
	case l.state != held:
		err = l.stateErr()
	case l.overdue():
		// The reply came at or after the deadline: the lease was lost
		// then, whatever Redis did meanwhile (giveUp undoes a renewal).
		ev = l.lose(time.Now())
		err = redsem.ErrLeaseLost
	case err == nil && r.OK:
		l.deadline = r.Deadline
		l.renewAt = time.Now().Add(bounds.RenewEvery(l.e.cfg.LeaseTTL))
	case err == nil && r.Released:
		// A holder released it: another handle of the lease (Resume), in
		// this process or another. It ends quietly, as released.
		l.answered = true
		ev = l.finishLocked(released, time.Now())
		err = fmt.Errorf("%w (by another holder of the lease)", redsem.ErrReleased)
	case err == nil:
		ev = l.finishLocked(lost, time.Now())
		err = redsem.ErrLeaseLost
	case context.Cause(octx) == errReleasing:
		err = fmt.Errorf("%w (Release was called while the renewal ran)", redsem.ErrReleased)
	default:
		if auto {
			// Redis unreachable: try again soon, until the deadline passes.
			retry := bounds.RenewRetry(l.e.cfg.LeaseTTL)
			l.renewAt = time.Now().Add(retry)
		}
	}
	l.endOp()
	l.mu.Unlock()
	if ev != nil {
		ev()
	}
	return err
}

// fire is the timer: it ends the lease once its deadline passed (lose),
// and has it renewed, with the engine's other leases that are due, when a
// renewal is due and no operation runs (a running one re-arms the timer
// when it ends).
func (l *Lease) fire() {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if !now.Before(l.deadline) {
		ev := l.lose(now)
		l.mu.Unlock()
		ev()
		return
	}
	l.capHold(now)
	if l.op != opNone || l.noRenew || l.releasing > 0 || l.due || now.Before(l.renewAt) {
		l.arm()
		l.mu.Unlock()
		return
	}
	// Due: the engine renews it with the rest of its leases that are due
	// (renewals.go).
	l.due = true
	l.arm()
	l.mu.Unlock()
	l.e.leases.renewDue(l.e.door, l.e.cfg.LeaseTTL)
}

// capHold stops the renewals of a lease held for MaxHold (under mu).
func (l *Lease) capHold(now time.Time) {
	if max := l.e.cfg.MaxHold; max > 0 && now.Sub(l.granted) >= max {
		l.noRenew = true
	}
}

// lose ends a held lease whose deadline passed unrenewed (under mu), and
// returns the report to make once mu is released. The holder stops at this
// moment: Err, Done and the cause of Context say ErrLeaseLost. An operation
// in flight is ended with that cause (its reply is dropped), and giveUp
// frees the slots in Redis.
func (l *Lease) lose(at time.Time) func() {
	ev := l.finishLocked(lost, at)
	l.giveUp()
	return ev
}

// giveUp releases in Redis, in the background and within bounds.ExpireRelease, the
// slots of a lease this handle lost at its deadline, so that waiters are
// woken and the slots can be taken again at once rather than when Redis's
// own deadline (a little later than the local one, by design) passes.
// release.lua's "expire" mode leaves alone a lease that another process
// took a handle of (Resume) and so may still hold, and one that a holder
// released already; either way the lease's state here is final already.
// If Redis cannot be reached in time, the slots expire there on their own.
func (l *Lease) giveUp() {
	ctx, cancel := context.WithTimeout(context.Background(), bounds.ExpireRelease(l.e.cfg.LeaseTTL))
	l.e.background(ctx, func() { cancel() }, func(ctx context.Context) {
		r, _ := l.e.door.ReleaseExpired(ctx, l.id)
		l.e.activeHub().deliverGrants(r.Grants)
	})
}

// Release frees the slots. It returns ErrLeaseLost if the lease was lost
// before it (also when its Deadline passes while the release runs: the
// request is bounded by the Deadline, as every request about the lease
// is); once a call returned nil or ErrLeaseLost, later calls return nil.
// A renewal in flight is ended (its outcome no longer matters). When it
// fails the lease is let go all the same: it stays held, not renewed (Renew
// returns ErrReleased), until its Deadline, and Release may be called
// again; unless Redis answered with an error (the request may have run, or
// may yet run: Redis unreachable, a timeout, ctx ended before or while the
// request was on its way) the release is also retried in the background
// until it succeeds, the lease's deadline passes or the semaphore is
// closed, so that a slot whose release met a failover, a blip or an
// impatient caller comes back soon after instead of at its deadline. If
// the reply is lost and go-redis retries,
// the rerun finds the tombstone the first run left and still reports
// success. The releases of the engine that meet one in flight go together
// in its next call (releases.go); one whose ctx ends before its call is
// sent is left out of it, as a request never sent.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	switch {
	case l.answered:
		l.mu.Unlock()
		return nil
	case l.state == lost:
		l.answered = true // a second call returns nil
		l.mu.Unlock()
		return redsem.ErrLeaseLost
	}
	l.releasing++
	if l.op == opRenew {
		l.cancelOp(errReleasing)
	}
	l.mu.Unlock()
	called := time.Now()
	octx, err := l.beginOp(ctx, opRelease)
	l.mu.Lock()
	l.releasing-- // its wait ended: the release runs (op), or ended
	if err != nil {
		retry := false
		if l.state == held {
			// ctx ended while the op in flight (a renewal it ended, or
			// another release) ran: nothing was sent, and the lease is let
			// go all the same, as after any release that failed, and
			// released in the background.
			l.noRenew, l.letGo, retry = true, true, true
		} else {
			err = nil
			if l.state == lost && !l.answered {
				err = redsem.ErrLeaseLost
			}
			l.answered = true
		}
		l.arm()
		l.mu.Unlock()
		if retry {
			l.releaseLater()
		}
		return err
	}
	l.mu.Unlock()
	retry, err := l.releaseOnce(octx, called, true)
	if retry {
		l.releaseLater()
	}
	return err
}

// overdue reports (under mu) whether the deadline of a held lease has
// passed: a reply that comes then finds the lease lost, whatever it says.
func (l *Lease) overdue() bool { return l.state == held && !time.Now().Before(l.deadline) }

// releaseOnce runs one release request, with the release started as the
// lease's op (beginOp) and octx its context, and ends the op with its
// outcome, under mu:
//   - the lease ended, or its deadline passed, while the request ran: it
//     is lost (then, whatever the reply; lose frees the slots), and
//     releaseOnce returns ErrLeaseLost;
//   - the request failed: the lease stays held, no longer renewed (it ends
//     at its deadline unless released before), and releaseOnce returns the
//     error, and retry when it was transient;
//   - else the reply decides: released (nil), or lost when Redis held
//     nothing for the id (ErrLeaseLost).
//
// A caller's outcome (caller: Release, not its background retry) answers
// the lease's Release, and a later Release returns nil; the background
// retry leaves a lost lease for the next Release to report.
func (l *Lease) releaseOnce(octx context.Context, called time.Time, caller bool) (retry bool, err error) {
	kind, err := l.e.releases.release(octx, l.id)
	var ev func()
	l.mu.Lock()
	switch {
	case l.state != held || l.overdue():
		if l.state == held {
			ev = l.lose(time.Now())
		}
		l.answered = l.answered || caller
		err = redsem.ErrLeaseLost
	case err != nil:
		// The outcome is unknown unless Redis answered with an error: the
		// request may have run, or may yet run (held in the network after
		// the caller's context ended). Either way the lease is let go, and
		// it is retried unless Redis refused it.
		l.noRenew, l.letGo = true, true
		retry = wire.Transient(err) || octx.Err() != nil
	case kind == wire.ReleasedLease:
		l.answered = true
		ev = l.finishLocked(released, called)
	default:
		l.answered = l.answered || caller
		ev = l.finishLocked(lost, called)
		err = redsem.ErrLeaseLost
	}
	l.endOp()
	l.mu.Unlock()
	if ev != nil {
		ev()
	}
	return retry, err
}

// releaseLater retries a Release that failed with a transient error, with
// backoff, until it succeeds, the lease ends (released by another call,
// lost, or its deadline passed) or the semaphore is closed.
func (l *Lease) releaseLater() {
	l.mu.Lock()
	deadline := l.deadline
	l.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	l.e.background(ctx, cancel, func(ctx context.Context) {
		var b bounds.Backoff
		for {
			if !b.Wait(ctx) {
				return
			}
			octx, err := l.beginOp(ctx, opRelease)
			if err != nil {
				return // the lease ended (released by another call, or lost), or its deadline passed
			}
			if retry, _ := l.releaseOnce(octx, time.Now(), false); !retry {
				return
			}
		}
	})
}

func (l *Lease) markLost() {
	l.mu.Lock()
	ev := l.finishLocked(lost, time.Now())
	l.mu.Unlock()
	if ev != nil {
		ev()
	}
}

// finishLocked moves a held lease to its final state (under mu), closes
// Done, ends the operation in flight if any (its reply will change
// nothing) and returns the report to make once mu is released (nil if the
// lease had ended already).
func (l *Lease) finishLocked(st leaseState, at time.Time) func() {
	if l.state != held {
		return nil
	}
	l.state = st
	cause := context.Canceled
	if st == lost {
		cause = redsem.ErrLeaseLost
	}
	// The state and Done first, then Context: whoever the cancellation
	// wakes (an AfterFunc, as redsem.Do's, and the code under fn's context)
	// finds Done closed and Err lost already.
	close(l.done)
	l.cancel(cause)
	if l.op != opNone {
		l.cancelOp(cause)
	}
	l.e.leases.forget(l)
	l.e.use.idle()
	l.timer.Stop()
	kind := redsem.EventReleased
	if st == lost {
		kind = redsem.EventLeaseLost
	}
	ev := redsem.Event{Kind: kind, LeaseID: l.id, Slot: l.slots[0], Token: l.token, Hold: at.Sub(l.granted)}
	return func() { l.e.rep.emit(ev) }
}
