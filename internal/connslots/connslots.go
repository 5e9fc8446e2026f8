// Package connslots holds the slots of pooled database connections
// (redsemsql's database/sql connections, redsempgx's pgxpool ones): each
// open connection holds one lease of a redsem.Semaphore, and a connection
// that its pool does not use gives its slot back when a caller of any
// process waits for one.
//
// The protocol across processes: a Connect that finds every slot taken (a
// TryAcquire fails) and has waited demandAfter for one first closes an
// idle connection of its own pool; when its pool has none it publishes a
// demand notice (POOL WAITER-SEQ) on the semaphore's channel ({name}:want,
// in the semaphore's hash tag), and again every demandEvery while it
// waits. Each other pool of the semaphore that could give a slot back
// claims the waiter with SET NX on {name}:want:claim:WAITER (same hash
// tag, kept owedFor); the one that wins gives one slot back: an idle
// connection at once, else the next of its connections to return to its
// pool (it owes the waiter one, for owedFor). The others do nothing: one
// give-back per waiter at a time, however often it asks.
//
// Time slices: a connection gives its slot back to another pool's waiter
// only once it has held it MinHold (from the grant), so that busy pools
// that share the limit rotate a connection once a slice, not after each
// query. A pool with no connection that old waits until its oldest is,
// plus claimDelay, before it claims a waiter, so that a pool that can give
// back sooner claims first; a returning connection pays what its pool owes
// only if it is that old. A Connect's own pool's idle connections are
// given back to it at once, whatever their age (the pool needs the slot,
// and the connection is not serving). An idle connection whose lease is
// lost closes at once.
package connslots

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/google/uuid"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/detach"
)

// DefaultConnectTimeout bounds a Connect's wait for a slot when the
// options give no bound.
const DefaultConnectTimeout = 10 * time.Second

// ErrConnectTimeout is wrapped by the error of a Connect that got no slot
// within its bound (Options.ConnectTimeout).
var ErrConnectTimeout = errors.New("connect timeout")

// DefaultMinHold is how long a connection keeps its slot before it gives it
// back to another process's waiter when the options give no MinHold: long
// enough that a rotation's new connection (a few ms) is a small share of a
// slice (two busy pools at the limit ran 0.87-1.00x the queries of one
// alone: BenchmarkShare in redsemsql and redsempgx), short enough that a
// waiter is served within about half a second plus a connect.
const DefaultMinHold = 500 * time.Millisecond

// Options tune a pool's slots.
type Options struct {
	// ConnectTimeout bounds an Acquire whose context has no deadline (0:
	// DefaultConnectTimeout; negative: only its context bounds it).
	ConnectTimeout time.Duration
	// BoundAll makes ConnectTimeout bound every wait, not only those
	// without a deadline (pgx dials under a deadline of its own, never
	// the caller's).
	BoundAll bool
	// MinHold is how long a connection keeps its slot (from its grant)
	// before it gives it back to a waiter of another pool (0:
	// DefaultMinHold, or half a shorter bounded ConnectTimeout; negative:
	// at once).
	MinHold time.Duration
}

// Demand: a Connect that has waited demandAfter for a slot asks for one,
// and again every demandEvery while it waits. A connection idle for less
// than minIdle is passing from one query to the next and is left alone. A
// pool with no idle connection it may give back waits claimDelay (after
// its oldest connection has held its slot MinHold) before it claims a
// waiter, so that a pool with one (which can give back at once) wins it.
// A claimed give-back that no returning connection paid within owedFor is
// dropped, and the claim ends with it: the waiter, if it still waits, has
// asked again by then, and any pool may claim it again.
const (
	demandAfter = 10 * time.Millisecond
	demandEvery = 100 * time.Millisecond
	minIdle     = 5 * time.Millisecond
	claimDelay  = 10 * time.Millisecond
	owedFor     = demandEvery + demandEvery/2
)

// Pool is the slots of one connection pool (one connector, one pgxpool).
type Pool struct {
	sem     redsem.Semaphore
	demand  *demand // nil: sem is not ours; demand stays in this pool
	id      string  // on demand notices, so that a pool ignores its own
	prefix  string  // of errors: "redsemsql", "redsempgx"
	timeout time.Duration
	always  bool          // the timeout bounds every wait, not only those without a deadline
	minHold time.Duration // 0: give back at once
	// stalled: until when (unix ns) its connections' releases go on in the
	// background at once, a release having just outlasted
	// bounds.ConnRelease (Slot.release).
	stalled atomic.Int64

	mu        sync.Mutex
	slots     map[*Slot]struct{}   // open, not given back
	owed      map[string]time.Time // claimed give-backs, by waiter: each due before its time
	answering map[string]time.Time // waiters this pool is about to claim: their last notice
	listening bool
	closed    bool
	stop      context.CancelFunc // ends the subscription
	stopped   chan struct{}      // closed when the subscription ended
}

// New returns the slots of one pool over sem. Errors are prefixed with
// prefix; a Connect whose context has no deadline waits at most
// opts.ConnectTimeout for a slot. A context with a deadline is the
// caller's bound, and is the only one, unless opts.BoundAll is set. A
// zero MinHold is DefaultMinHold, or half a bounded ConnectTimeout if that
// is shorter. It returns a *redsem.ConfigError, naming the field as
// prefix.Options.FIELD (or "sem"), for a nil sem and for a MinHold at or
// above a bounded ConnectTimeout (a waiter of another pool with the same
// options would give up before any connection gave its slot back).
func New(sem redsem.Semaphore, prefix string, opts Options) (*Pool, error) {
	if sem == nil {
		return nil, &redsem.ConfigError{Field: "sem", Reason: prefix + " needs a semaphore, got nil"}
	}
	timeout, minHold := opts.ConnectTimeout, opts.MinHold
	if timeout == 0 {
		timeout = DefaultConnectTimeout
	}
	switch {
	case minHold == 0:
		minHold = DefaultMinHold
		if timeout > 0 {
			minHold = min(minHold, timeout/2)
		}
	case minHold < 0:
		minHold = 0
	case timeout > 0 && minHold >= timeout:
		bound := timeout.String()
		if opts.ConnectTimeout == 0 {
			bound += ", the default"
		}
		return nil, &redsem.ConfigError{Field: prefix + ".Options.MinHold", Reason: fmt.Sprintf(
			"%v is not shorter than Options.ConnectTimeout (%s): a dial that waits for a slot would give up "+
				"before a busy connection of another process gave one back; shorten MinHold (negative: give "+
				"back at once) or lengthen ConnectTimeout (negative: unbounded)", minHold, bound)}
	}
	return &Pool{sem: sem, demand: demandOf(sem), id: uuid.NewString(), prefix: prefix,
		timeout: timeout, always: opts.BoundAll, minHold: minHold,
		slots: map[*Slot]struct{}{}, owed: map[string]time.Time{}, answering: map[string]time.Time{}}, nil
}

// Acquire waits for a slot within ctx (and the connect timeout, when ctx
// has no deadline); when every slot is taken (a first TryAcquire fails),
// it asks idle connections (of this pool, else of any) to give one back
// while it waits. The slot is in use; the caller attaches its connection
// with Attach, or calls Closed if connecting failed. On failure it returns
// an error prefixed with the pool's prefix, wrapping the cause (ctx.Err()
// when ctx ended, ErrConnectTimeout with the semaphore's error when the
// bound passed), and holds nothing.
func (p *Pool) Acquire(ctx context.Context) (*Slot, error) {
	p.listen()
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if _, bounded := ctx.Deadline(); p.timeout > 0 && (p.always || !bounded) {
		wctx, cancel = context.WithTimeoutCause(ctx, p.timeout, ErrConnectTimeout)
	}
	defer cancel()
	// One attempt first: only a caller that finds every slot taken asks
	// for one (an Acquire slowed by a loaded machine or a distant Redis
	// would otherwise ask while a slot is free, and make an idle
	// connection close for nothing).
	lease, err := p.sem.TryAcquire(wctx)
	if err != nil {
		dctx, stopDemand := context.WithCancel(wctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.ask(dctx)
		}()
		lease, err = p.sem.Acquire(wctx)
		stopDemand()
		<-done
	}
	if err != nil {
		open, idle := p.Count()
		if ctx.Err() == nil && errors.Is(context.Cause(wctx), ErrConnectTimeout) {
			return nil, fmt.Errorf("%s: no connection slot within %v (%w; this pool: %d open, %d idle): %w",
				p.prefix, p.timeout, ErrConnectTimeout, open, idle, err)
		}
		return nil, fmt.Errorf("%s: no connection slot (this pool: %d open, %d idle): %w", p.prefix, open, idle, err)
	}
	s := &Slot{pool: p, lease: lease, held: time.Now(), gone: make(chan struct{})}
	p.mu.Lock()
	p.slots[s] = struct{}{}
	p.mu.Unlock()
	go s.watch()
	return s, nil
}

// ask asks for a slot after demandAfter, then every demandEvery, until
// ctx ends: this pool's idle connections first, else every pool's.
func (p *Pool) ask(ctx context.Context) {
	waiter := uuid.NewString()
	t := time.NewTimer(demandAfter)
	defer t.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !p.reclaim(false) && p.demand != nil {
			// Redis down: Acquire reports it.
			_ = p.demand.publish(ctx, fmt.Sprintf("%s %s-%d", p.id, waiter, seq))
		}
		t.Reset(demandEvery)
	}
}

// listen subscribes to the semaphore's demand notices, once.
func (p *Pool) listen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.demand == nil || p.listening || p.closed {
		return
	}
	p.listening = true
	ctx, cancel := context.WithCancel(context.Background())
	p.stop, p.stopped = cancel, make(chan struct{})
	go p.serve(ctx)
}

// serve answers the demand notices of other pools, until Close. Each
// notice is answered in a goroutine of its own (an answer may wait
// claimDelay, then for Redis), so that notices are read as they come.
func (p *Pool) serve(ctx context.Context) {
	var answers sync.WaitGroup
	defer close(p.stopped)
	defer answers.Wait() // ctx is done: they return at once
	ps := p.demand.subscribe(ctx)
	defer func() { _ = ps.Close() }()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			from, notice, ok := strings.Cut(m.Payload, " ")
			if ok && from != p.id {
				answers.Go(func() { p.answer(ctx, notice) })
			}
		}
	}
}

// answer gives one slot back for a notice (WAITER-SEQ) if this pool
// claims its waiter: a connection that held its slot minHold, idle at
// once, else the next such connection to return to the pool. A pool with
// no such idle connection waits claimDelay, plus until its oldest
// connection has held its slot minHold, before it claims (if the waiter
// still asks by then), so that a pool that can give back sooner claims
// first.
func (p *Pool) answer(ctx context.Context, notice string) {
	waiter := notice
	if i := strings.LastIndexByte(notice, '-'); i > 0 {
		waiter = notice[:i]
	}
	now := time.Now()
	p.mu.Lock()
	due, owes := p.owed[waiter]
	_, answering := p.answering[waiter]
	if answering {
		p.answering[waiter] = now // it still asks
	}
	if answering || (owes && now.Before(due)) {
		p.mu.Unlock()
		return // this pool answers that waiter already
	}
	p.answering[waiter] = now
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.answering, waiter)
		p.mu.Unlock()
	}()
	open, ready, wait := p.readiness(now)
	if open == 0 {
		return // nothing to give back
	}
	if ready == 0 {
		// Let a pool that can give back sooner claim it first.
		t := time.NewTimer(claimDelay + wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if open, _, _ = p.readiness(time.Now()); open == 0 {
			return
		}
		p.mu.Lock()
		last := p.answering[waiter]
		p.mu.Unlock()
		if time.Since(last) > owedFor {
			return // it asks every demandEvery: served meanwhile, or gone
		}
	}
	won, err := p.demand.claim(ctx, waiter, owedFor)
	if err != nil || !won {
		return
	}
	if p.reclaim(true) {
		return
	}
	p.mu.Lock()
	p.owed[waiter] = time.Now().Add(owedFor)
	p.mu.Unlock()
}

// mature reports whether s has held its slot minHold at now.
func (p *Pool) mature(s *Slot, now time.Time) bool {
	return now.Sub(s.held) >= p.minHold
}

// readiness counts, at now, the open connections and the idle ones (at
// least minIdle) that held their slots minHold, and returns how long until
// the first connection will have held its slot minHold (0 if one has).
func (p *Pool) readiness(now time.Time) (open, ready int, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	wait = -1
	for s := range p.slots {
		open++
		w := max(s.held.Add(p.minHold).Sub(now), 0)
		if wait < 0 || w < wait {
			wait = w
		}
		if t, ok := s.idleSince(); ok && now.Sub(t) >= minIdle && w == 0 {
			ready++
		}
	}
	return open, ready, max(wait, 0)
}

// payOwed reports whether s, returning to its pool, should go back for a
// give-back this pool claimed (and not owedFor ago), and counts it paid:
// only if s has held its slot minHold.
func (p *Pool) payOwed(s *Slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.owed) == 0 {
		return false
	}
	now := time.Now()
	var first string
	var firstDue time.Time
	for w, due := range p.owed {
		if !now.Before(due) {
			delete(p.owed, w)
		} else if first == "" || due.Before(firstDue) {
			first, firstDue = w, due
		}
	}
	if first == "" || !p.mature(s, now) {
		return false
	}
	delete(p.owed, first)
	return true
}

// reclaim gives back the slot of the connection idle the longest (at least
// minIdle); with slice set, only of one that held its slot minHold. false
// if there is none.
func (p *Pool) reclaim(slice bool) bool {
	now := time.Now()
	for {
		var best *Slot
		var since time.Time
		p.mu.Lock()
		for s := range p.slots {
			if slice && !p.mature(s, now) {
				continue
			}
			if t, ok := s.idleSince(); ok && now.Sub(t) >= minIdle && (best == nil || t.Before(since)) {
				best, since = s, t
			}
		}
		p.mu.Unlock()
		if best == nil {
			return false
		}
		if best.giveBack() {
			return true
		}
		// taken meanwhile: look again
	}
}

// Count returns how many of the pool's connections are open and idle.
func (p *Pool) Count() (open, idle int) {
	return p.countIdle(time.Time{})
}

// countIdle counts the open connections, and those idle since at least
// minIdle before now (all idle ones for a zero now).
func (p *Pool) countIdle(now time.Time) (open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.slots {
		open++
		if t, ok := s.idleSince(); ok && (now.IsZero() || now.Sub(t) >= minIdle) {
			idle++
		}
	}
	return open, idle
}

// Close ends the pool's demand subscription (its connections keep their
// slots until they close).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	stop, stopped := p.stop, p.stopped
	p.mu.Unlock()
	if stop != nil {
		stop()
		// The subscription ends at once, unless its first dial to an
		// unreachable Redis is in flight: that ends on its own.
		select {
		case <-stopped:
		case <-time.After(bounds.PoolClose):
		}
	}
}

func (p *Pool) forget(s *Slot) {
	p.mu.Lock()
	delete(p.slots, s)
	p.mu.Unlock()
}

// A slot's connection is in use (from Acquire, and from each Use), idle
// (from Returned), given back (closed and its lease released while idle,
// for a waiter) or closed.
type state uint8

const (
	inUse state = iota
	idle
	givenBack
	closed
)

// Slot is the lease of one open connection.
type Slot struct {
	pool  *Pool
	lease redsem.Lease
	held  time.Time     // when the slot was granted
	gone  chan struct{} // closed when the connection was given back or closed
	once  sync.Once     // releases the lease

	// mu orders giving back against every use of the connection: the
	// connection is closed under mu, and a use that finds it given back
	// touches nothing.
	mu    sync.Mutex
	close func() error // closes the connection, to give it back
	st    state
	since time.Time // idle since
}

// Lease returns the slot's lease.
func (s *Slot) Lease() redsem.Lease { return s.lease }

// Attach sets the function that closes the slot's connection when it is
// given back (called with the slot's lock held).
func (s *Slot) Attach(close func() error) {
	s.mu.Lock()
	s.close = close
	s.mu.Unlock()
}

// Use marks the connection in use; false if it was given back or closed,
// or its lease was lost: then the connection must not be used.
func (s *Slot) Use() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == givenBack || s.st == closed {
		return false
	}
	s.st = inUse
	return s.lease.Err() == nil
}

// Returned is called when the connection returns to its pool: true marks
// it idle (it may give its slot back to a waiter later); false means the
// pool must close it: it was given back, its lease is lost, or this pool
// owes a waiter of another pool a slot and this connection, having held
// its slot MinHold, pays it. valid reports whether the connection itself
// is fit for reuse.
func (s *Slot) Returned(valid bool) bool {
	s.mu.Lock()
	bad := s.st == givenBack || s.st == closed || s.lease.Err() != nil || !valid
	s.mu.Unlock()
	// The pool's lock is not taken under the slot's (reclaim takes them
	// the other way round); in use, the slot is not given back meanwhile.
	if bad || s.pool.payOwed(s) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == givenBack || s.st == closed {
		return false
	}
	s.st, s.since = idle, time.Now()
	return true
}

// freshGrace is how long a new connection marked idle by Idle is left
// alone, so that the caller it was opened for takes it first.
const freshGrace = 100 * time.Millisecond

// Idle marks a new connection idle, as Returned does, without paying what
// the pool owes: for a connection that its pool may keep without having
// used it (database/sql's opener goroutine puts the connections it opens
// straight into its pool, with no call that Returned could hook; pgxpool
// keeps those it opens for MinConns). It may be given back only once it
// has been idle freshGrace (plus the usual 5 ms), so that the caller it
// was opened for, if any, takes it first. A connection whose lease is
// lost closes at once.
func (s *Slot) Idle() {
	s.mu.Lock()
	if s.st != inUse {
		s.mu.Unlock()
		return
	}
	s.st, s.since = idle, time.Now().Add(freshGrace)
	lost := s.lease.Err() != nil
	s.mu.Unlock()
	if lost {
		s.giveBack()
	}
}

// Gone reports whether the connection was given back or closed.
func (s *Slot) Gone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st == givenBack || s.st == closed
}

// Locked runs f with the slot's lock held (so not during a give-back),
// telling it whether the connection was given back or closed.
func (s *Slot) Locked(f func(gone bool) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return f(s.st == givenBack || s.st == closed)
}

// Closed is called when the connection closed (or never opened): it
// releases the lease, once. It reports whether the connection had been
// given back already (then it was closed then).
func (s *Slot) Closed() (wasGivenBack bool) {
	s.mu.Lock()
	wasGivenBack = s.st == givenBack
	if s.st != givenBack && s.st != closed {
		close(s.gone)
	}
	s.st = closed
	s.mu.Unlock()
	s.pool.forget(s)
	s.release()
	return wasGivenBack
}

func (s *Slot) release() {
	s.once.Do(func() {
		// Briefly: the caller is a pool closing a connection on its own
		// caller's goroutine (database/sql closes its idle ones one after
		// another). A release that does not finish by then goes on in the
		// background (the lease's own retries), or the slot comes back at
		// the lease's deadline; and while one just did not, the next ones
		// do not wait at all.
		d := bounds.ConnRelease
		if time.Now().UnixNano() < s.pool.stalled.Load() {
			d = 0
		}
		err := detach.Release(context.Background(), s.lease, d)
		if d > 0 && errors.Is(err, context.DeadlineExceeded) {
			s.pool.stalled.Store(time.Now().Add(bounds.ConnReleaseStall).UnixNano())
		}
	})
}

// idleSince reports when the connection went idle, if it is.
func (s *Slot) idleSince() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.since, s.st == idle
}

// watch closes the connection when its lease is lost while it is idle
// (one in use is closed by its pool when it returns, Returned answering
// false), until the connection is given back or closed.
func (s *Slot) watch() {
	select {
	case <-s.gone:
	case <-s.lease.Done():
		if s.lease.Err() != nil {
			s.giveBack()
		}
	}
}

// giveBack closes an idle connection and releases its lease; false if it
// is no longer idle.
func (s *Slot) giveBack() bool {
	s.mu.Lock()
	if s.st != idle {
		s.mu.Unlock()
		return false
	}
	s.st = givenBack
	close(s.gone)
	if s.close != nil {
		_ = s.close()
	}
	s.mu.Unlock()
	s.pool.forget(s)
	s.release()
	return true
}
