package core

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redsem/redsem"
)

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

// Lease implements redsem.Lease for both variants.
type Lease struct {
	e     *Engine
	id    string
	slots []int
	token int64

	ctx    context.Context // cancelled once released or lost
	cancel context.CancelCauseFunc

	granted time.Time // local time of the grant, for hold times

	mu       sync.Mutex
	deadline time.Time
	state    leaseState
	released bool // Release was called (a lost lease stays lost)
	done     chan struct{}

	// The watchdog is a timer, not a goroutine: nothing runs between
	// renewals, and stopping it costs no context switch. It renews the
	// lease while auto-renewal is on; once renewals stop (DisableAutoRenew,
	// MaxHold reached, a Release that failed) it fires at the deadline and
	// gives the lease up (see expire).
	timer   *time.Timer // (under mu)
	stopped bool        // a Release runs or the lease ended: the timer does nothing (under mu)
	noRenew bool        // the timer only waits for the deadline (under mu)
	// cancelRenewal ends a watchdog renewal in flight (under mu), so that
	// Release never waits for a renewal stuck on an unresponsive Redis.
	cancelRenewal context.CancelFunc
	renewing      sync.Mutex // held while a watchdog renewal runs
}

var _ redsem.Lease = (*Lease)(nil)

func (e *Engine) newLease(id string, slots []int, token int64, deadline time.Time) *Lease {
	l := &Lease{
		e: e, id: id, slots: slots, token: token, deadline: deadline, granted: time.Now(),
		done: make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	e.busy() // a family keeps the member of a live lease; finish undoes it
	// The first renewal comes after a third of the TTL, or sooner when the
	// deadline is nearer than a full TTL (a fair grant not yet claimed
	// lasts only as long as its session; a retried acquire returns what is
	// left of its grant). Without auto-renewal the timer waits for the
	// deadline.
	first := min(e.cfg.LeaseTTL/3, max(time.Until(deadline)/2, 0))
	l.mu.Lock()
	if e.cfg.DisableAutoRenew {
		l.noRenew = true
		first = time.Until(deadline)
	}
	l.timer = time.AfterFunc(first, l.watchdog)
	l.mu.Unlock()
	return l
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
// never later than the deadline Redis keeps (see expiresBy, and the session
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

// Renew extends the lease by the lease TTL from now. It returns ErrLeaseLost
// if the lease is gone (and then the lease is lost for good), ErrReleased
// after a successful Release, or the Redis error if Redis could not be
// asked; it never re-creates a lost lease.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	switch st {
	case released:
		return redsem.ErrReleased
	case lost:
		return redsem.ErrLeaseLost
	}
	ok, deadline, err := l.e.renew(ctx, l.id)
	if err != nil {
		return err
	}
	if !ok {
		l.markLost()
		return redsem.ErrLeaseLost
	}
	l.mu.Lock()
	if l.state == held {
		l.deadline = deadline
		if l.noRenew && !l.stopped {
			l.timer.Reset(time.Until(deadline)) // the deadline moved
		}
	}
	l.mu.Unlock()
	return nil
}

// Release stops the watchdog, then frees the slots. A second call returns
// nil. It returns ErrLeaseLost if the lease was lost before it. On a Redis
// error the lease stays held (not renewed) and Release may be called again;
// after a transient error (Redis unreachable, a timeout) the release is
// also retried in the background until it succeeds or the lease's
// deadline, so that a slot whose release met a failover or a blip comes
// back soon after instead of at its deadline.
// If the reply is lost and go-redis retries, the rerun finds the tombstone
// the first run left and still reports success.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	if l.state == lost {
		l.released = true // a second call returns nil
		l.mu.Unlock()
		return redsem.ErrLeaseLost
	}
	l.mu.Unlock()
	called := time.Now()
	l.stopWatchdog() // no renewal may race the release

	kind, _, err := l.e.release(ctx, l.id, "owner")
	if err != nil {
		// Still held, no longer renewed: the lease ends at its deadline
		// unless Release is called again before.
		l.mu.Lock()
		if l.state == held {
			l.stopped, l.noRenew = false, true
			l.timer.Reset(time.Until(l.deadline))
		}
		l.mu.Unlock()
		if Transient(err) {
			l.releaseLater()
		}
		return err
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	if kind == ReleasedLease {
		l.finish(released, called)
		return nil
	}
	l.finish(lost, called)
	return redsem.ErrLeaseLost
}

// releaseLater retries a Release that failed with a transient error, with
// backoff, until it succeeds, the lease ends (released by another call,
// lost, or its deadline passed) or the semaphore is closed.
func (l *Lease) releaseLater() {
	e := l.e
	l.mu.Lock()
	deadline := l.deadline
	l.mu.Unlock()
	e.undos.Add(1)
	go func() {
		defer e.undos.Done()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		stop := context.AfterFunc(e.stopped, cancel)
		defer stop()
		for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			if !sleepCtx(ctx, jitter(wait)) {
				return
			}
			l.mu.Lock()
			over := l.released || l.state != held
			l.mu.Unlock()
			if over {
				return
			}
			called := time.Now()
			kind, _, err := e.release(ctx, l.id, "owner")
			if err != nil {
				if Transient(err) {
					continue
				}
				return
			}
			l.mu.Lock()
			l.released = true
			l.mu.Unlock()
			if kind == ReleasedLease {
				l.finish(released, called)
			} else {
				l.finish(lost, called)
			}
			return
		}
	}()
}

// stopWatchdog stops the renewals and waits for one in progress to end.
func (l *Lease) stopWatchdog() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	if l.cancelRenewal != nil {
		l.cancelRenewal()
	}
	l.mu.Unlock()
	l.renewing.Lock() // wait for a renewal in progress
	l.renewing.Unlock()
}

func (l *Lease) markLost() { l.finish(lost, time.Now()) }

// finish moves a held lease to its final state, closes Done and reports it.
func (l *Lease) finish(st leaseState, at time.Time) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	l.state = st
	close(l.done)
	l.e.idle()
	if st == lost {
		l.cancel(redsem.ErrLeaseLost)
	} else {
		l.cancel(context.Canceled)
	}
	l.stopped = true
	l.timer.Stop()
	l.mu.Unlock()
	kind := redsem.EventReleased
	if st == lost {
		kind = redsem.EventLeaseLost
	}
	l.e.emit(redsem.Event{Kind: kind, LeaseID: l.id, Slot: l.slots[0], Token: l.token, Hold: at.Sub(l.granted)})
}

// watchdog runs every third of the lease TTL and renews the lease. If
// Redis says the lease is gone, or cannot be reached before the deadline,
// the lease is lost; after a failed attempt it tries again sooner. Once
// renewals stop (noRenew, or MaxHold reached) it runs at the deadline only,
// and gives the lease up then (expire).
func (l *Lease) watchdog() {
	l.renewing.Lock()
	defer l.renewing.Unlock()
	l.mu.Lock()
	stopped, noRenew := l.stopped, l.noRenew
	l.mu.Unlock()
	if stopped {
		return
	}
	ttl := l.e.cfg.LeaseTTL
	deadline := l.Deadline()
	if !time.Now().Before(deadline) {
		l.expire()
		return
	}
	if max := l.e.cfg.MaxHold; max > 0 && time.Since(l.granted) >= max {
		noRenew = true // held for MaxHold: no more renewals
	}
	if noRenew {
		l.mu.Lock()
		l.noRenew = true
		if !l.stopped {
			l.timer.Reset(time.Until(deadline))
		}
		l.mu.Unlock()
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	l.mu.Lock()
	l.cancelRenewal = cancel
	stopped = l.stopped
	l.mu.Unlock()
	if stopped {
		cancel()
		return
	}
	err := l.Renew(ctx)
	cancel()
	l.mu.Lock()
	l.cancelRenewal = nil
	stopped = l.stopped
	l.mu.Unlock()
	if stopped && err != nil && !errors.Is(err, redsem.ErrLeaseLost) {
		return // cancelled by stopWatchdog: the release decides
	}
	next := ttl / 3
	switch {
	case err == nil:
	case errors.Is(err, redsem.ErrLeaseLost):
		l.markLost()
		return
	default:
		// Redis unreachable: try again soon, until the deadline passes.
		retry := max(min(ttl/10, time.Second), time.Millisecond)
		next = min(retry, time.Until(deadline))
	}
	l.mu.Lock()
	if !l.stopped {
		l.timer.Reset(max(next, 0))
	}
	l.mu.Unlock()
}

// expire gives up a lease whose deadline passed unrenewed: it releases the
// slots in Redis at once (best effort, at most releaseBound: the entry may
// still be listed for a moment past the local deadline, which is early by
// design), so that waiters are woken and the slots can be taken again, and
// then marks the lease lost. When Done closes the slots are free, or Redis
// could not be reached in time (then they expire there on their own).
func (l *Lease) expire() {
	ctx, cancel := context.WithTimeout(context.Background(), l.e.releaseBound())
	_, _, _ = l.e.release(ctx, l.id, "force")
	cancel()
	l.markLost()
}
