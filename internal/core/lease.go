package core

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/lua"
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
	slot  int
	token int64

	granted time.Time // local time of the grant, for hold times

	mu       sync.Mutex
	deadline time.Time
	state    leaseState
	done     chan struct{}

	stopRenew chan struct{} // closed to stop the watchdog
	renewDone chan struct{} // closed when the watchdog has exited
}

var _ redsem.Lease = (*Lease)(nil)

func (e *Engine) newLease(id string, slot int, token int64, deadline time.Time) *Lease {
	l := &Lease{
		e: e, id: id, slot: slot, token: token, deadline: deadline, granted: time.Now(),
		done: make(chan struct{}), stopRenew: make(chan struct{}), renewDone: make(chan struct{}),
	}
	if e.cfg.DisableAutoRenew {
		close(l.renewDone)
	} else {
		go l.watchdog()
	}
	return l
}

// ID is unique per acquisition (a UUID), never reused.
func (l *Lease) ID() string { return l.id }

// Slot is which of the limit's slots this lease holds.
func (l *Lease) Slot() int { return l.slot }

// Token is the lease's fencing token.
func (l *Lease) Token() int64 { return l.token }

// Deadline is the local estimate of when the lease expires unless renewed.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed once the lease is released or lost.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while held or after Release, ErrLeaseLost once lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lost {
		return redsem.ErrLeaseLost
	}
	return nil
}

// Renew extends the lease by the lease TTL from now. It returns ErrLeaseLost
// if the lease is gone (and then the lease is lost for good), or the Redis
// error if Redis could not be asked; it never re-creates a lost lease.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	switch st {
	case lost:
		return redsem.ErrLeaseLost
	case released:
		return redsem.ErrLeaseLost
	}
	v, sent, err := l.e.run(ctx, lua.Renew, l.e.cfg.Limit, l.id, ms(l.e.cfg.LeaseTTL))
	if err != nil {
		return err
	}
	l.e.clock.observe(sent, toInt(v[2]))
	if toInt(v[0]) != 1 {
		l.markLost()
		return redsem.ErrLeaseLost
	}
	l.mu.Lock()
	if l.state == held {
		l.deadline = sent.Add(time.Duration(toInt(v[1])) * time.Millisecond)
	}
	l.mu.Unlock()
	return nil
}

// Release stops the watchdog, then frees the slot. A second call returns
// nil. It returns ErrLeaseLost if the lease was lost before it. On a Redis
// error the lease stays held (not renewed) and Release may be called again.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	switch l.state {
	case released:
		l.mu.Unlock()
		return nil
	case lost:
		l.state = released // a second call returns nil
		l.mu.Unlock()
		return redsem.ErrLeaseLost
	}
	l.mu.Unlock()
	called := time.Now()
	l.stopWatchdog() // no renewal may race the release

	v, sent, err := l.e.run(ctx, lua.Release, l.e.cfg.Limit, l.id)
	if err != nil {
		return err
	}
	l.e.clock.observe(sent, toInt(v[1]))
	l.e.deliverGrants(v, 2, sent)
	if toInt(v[0]) == 1 {
		l.finish(released, called)
		return nil
	}
	l.finish(lost, called)
	l.mu.Lock()
	l.state = released
	l.mu.Unlock()
	return redsem.ErrLeaseLost
}

func (l *Lease) stopWatchdog() {
	l.mu.Lock()
	select {
	case <-l.stopRenew:
	default:
		close(l.stopRenew)
	}
	l.mu.Unlock()
	<-l.renewDone
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
	select {
	case <-l.stopRenew:
	default:
		close(l.stopRenew)
	}
	l.mu.Unlock()
	kind := redsem.EventReleased
	if st == lost {
		kind = redsem.EventLeaseLost
	}
	l.e.emit(redsem.Event{Kind: kind, LeaseID: l.id, Slot: l.slot, Token: l.token, Hold: at.Sub(l.granted)})
}

// watchdog renews the lease every third of its TTL. If Redis says the lease
// is gone, or cannot be reached before the deadline, the lease is lost.
func (l *Lease) watchdog() {
	defer close(l.renewDone)
	ttl := l.e.cfg.LeaseTTL
	every := ttl / 3
	retry := max(min(ttl/10, time.Second), time.Millisecond)
	next := every
	for {
		t := time.NewTimer(next)
		select {
		case <-l.stopRenew:
			t.Stop()
			return
		case <-t.C:
		}
		deadline := l.Deadline()
		if !time.Now().Before(deadline) {
			l.markLost()
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := l.Renew(ctx)
		cancel()
		switch {
		case err == nil:
			next = every
		case errors.Is(err, redsem.ErrLeaseLost):
			l.markLost()
			return
		default:
			// Redis unreachable: try again soon, until the deadline passes.
			next = min(retry, time.Until(deadline))
			if next <= 0 {
				l.markLost()
				return
			}
		}
	}
}
