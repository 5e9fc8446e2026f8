package core

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// The fair variant's waiting room: how a call waits (fairWait, at the end
// of the file: queue under the session, then wait for a grant addressed to
// that attempt) and the session that keeps its place and hands it its grant.
// The unfair variant's room is unfairwait.go.

// session is a fair semaphore's queue session in this process (one per
// semaphore, or per family shard): its id, under which every waiter of the
// process queues; the heartbeat that keeps it, and so their places, alive
// (heartbeat.lua, at a cost that grows with processes, not waiters). It
// lives as long as its hub. When Redis says the
// session died (the process paused or was cut off for longer than
// QueueTTL), replace gives it a new id and every waiter queues again under the
// new one. It is the listener of its hub's subscription: its id's channel
// carries its waiters' grants and requeues.
type session struct {
	h *hub

	// Under h.mu:
	id string // replaced by replace when the session died
	// due is, per engine with waiters, when to beat early on its keys:
	// just after its earliest holder may expire (the beat admits waiters
	// into that holder's slots).
	due map[*Engine]time.Time

	replacing sync.Mutex    // one replacement at a time
	kick      chan struct{} // a new hint: the heartbeat loop looks at due again
}

func newSession(h *hub) *session {
	return &session{h: h, id: newSessionID(), due: map[*Engine]time.Time{}, kick: make(chan struct{}, 1)}
}

func newSessionID() string { return strings.ReplaceAll(uuid.NewString(), "-", "") }

// ID returns the session id that queue entries are made under now.
func (s *session) ID() string {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.id
}

// session returns the hub's fair session (nil for the unfair variant).
func (h *hub) session() *session {
	s, _ := h.l.(*session)
	return s
}

func (s *session) channelOf(id string) string { return s.h.e.keys.Chan + ":s:" + id }

func (s *session) channel() string { return s.channelOf(s.ID()) }

// start makes the session in Redis, once its channel is subscribed.
func (s *session) start(ctx context.Context) error {
	return s.beat(ctx, s.h.e, s.ID(), "new")
}

func (s *session) joined(w *waiter) {}

func (s *session) left(e *Engine)    { delete(s.due, e) }
func (s *session) dropped(w *waiter) {}

// resync makes every local waiter re-run its acquire (which reports a
// grant or its place, or queues it again).
func (s *session) resync() { s.h.broadcast(event{kind: evRequeue}) }

// queued records the latest expiry hint of e (ms until its earliest
// holder may expire, -1 none), and moves the next heartbeat earlier if a
// holder expires sooner: the heartbeat admits waiters into the slots of
// expired holders.
func (s *session) queued(e *Engine, hint int64) {
	if s.setHint(e, hint) {
		s.poke()
	}
}

// setHint records e's hint (kept only while e has waiters) and reports
// whether it moved e's early beat earlier.
func (s *session) setHint(e *Engine, hint int64) (earlier bool) {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if hint < 0 || s.h.count[e] == 0 {
		delete(s.due, e)
		return false
	}
	due := time.Now().Add(time.Duration(hint+1) * time.Millisecond)
	old, ok := s.due[e]
	s.due[e] = due
	return !ok || due.Before(old)
}

// wakeAt moves e's early beat to at, if it has none due sooner (and
// waiters), and reports whether it moved.
func (s *session) wakeAt(e *Engine, at time.Time) bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if s.h.count[e] == 0 {
		return false
	}
	if old, ok := s.due[e]; ok && old.Before(at) && time.Now().Before(old) {
		return false
	}
	s.due[e] = at
	return true
}

func (s *session) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// handle takes a message of the session's channel.
func (s *session) handle(m *redis.Message) {
	h := s.h
	msg, ok := parseMessage(m.Payload)
	if !ok {
		return
	}
	switch msg.ev.kind {
	case evGrant:
		// The grant's server deadline, in local time by the clock of the
		// engine its waiter waits on (a family's members each keep one).
		we := h.engineOf(msg.id)
		if we == nil {
			return
		}
		msg.ev.grant.Deadline = grantDeadline(we.door.LocalAtLeast(msg.deadline), time.Now(), msg.deadline, msg.ev.grant.Token)
		// The channel names the session the waiter was queued under when
		// Redis granted it: the waiter refuses a grant of another session.
		msg.ev.grant.SID = strings.TrimPrefix(m.Channel, h.e.keys.Chan+":s:")
		h.deliver(msg.id, msg.ev)
	case evWeight:
		h.deliver(msg.id, msg.ev)
	case evWake:
		// The rate's window holds back this head waiter until wait ms after
		// the script ran: beat on its semaphore's keys then (the beat admits
		// it). The message came after the script ran, so the beat is not
		// early.
		if we := h.engineOf(msg.id); we != nil {
			at := time.Now().Add(time.Duration(msg.ev.wait+1) * time.Millisecond)
			we.rateHeld.hold(at, 0) // the message does not say when its script ran
			if s.wakeAt(we, at) {
				s.poke()
			}
		}
	case evRateSet:
		// SetRate ran, in this process or another, at server time at: the
		// waiters of that semaphore here were not held back by the former
		// rate from then on (rateHold.setRate; a waiter behind a head the
		// window held hears no reply of its own that says so).
		for _, e := range h.enginesOf(msg.meta) {
			e.rateHeld.setRate(msg.ev.at)
		}
	case evRateHeld:
		// The window holds the queue's head of that semaphore (a waiter of
		// this process or another's) for wait ms after the script ran: the
		// waiters queued behind it here were held back by the rate.
		until := time.Now().Add(time.Duration(msg.ev.wait+1) * time.Millisecond)
		for _, e := range h.enginesOf(msg.meta) {
			e.rateHeld.hold(until, msg.ev.at)
		}
	case evRequeue:
		// An operator removed this waiter from the queue: it queues again
		// (and reports the eviction from its own goroutine: an Observer
		// may call Close, which waits for this one).
		msg.ev.evicted = true
		h.deliver(msg.id, msg.ev)
	}
}

// enginesOf returns the hub's engines with waiters whose meta key is meta
// (a semaphore's, or a family member's).
func (h *hub) enginesOf(meta string) []*Engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*Engine
	for e := range h.count {
		if e.keys.List[KeyMeta] == meta {
			out = append(out, e)
		}
	}
	return out
}

// grantDeadline is the local deadline of a grant message received at
// local time got, whose server deadline is deadlineMs and token token:
// mapped, the deadline through the engine's server clock (localAtLeast),
// less a millisecond (as wire's expiresBy), which is never late while the server's
// clock runs evenly. A step forward of the server's clock since the
// engine's latest reply makes it late by the step; it is then after the
// grant's whole lifetime counted from when the message came (the grant was
// made before, at a server time at most its token: tokens are never below
// the server clock in µs), and grantDeadline returns the zero time instead:
// the waiter asks Redis again, and the reply gives the deadline counted
// from the server's own clock.
func grantDeadline(mapped, got time.Time, deadlineMs, token int64) time.Time {
	d := mapped.Add(-time.Millisecond)
	life := time.Duration(deadlineMs)*time.Millisecond - time.Duration(token)*time.Microsecond
	if d.After(got.Add(life)) {
		return time.Time{}
	}
	return d
}

// message is a decoded message of a fair session's channel.
type message struct {
	id       string // the waiter it is for ("" for evRateSet, evRateHeld)
	ev       event  // evGrant (grant.deadline not set), evWeight, evWake, evRequeue, evRateSet or evRateHeld
	deadline int64  // evGrant: the grant's deadline, server ms
	meta     string // evRateSet, evRateHeld: the meta key of the semaphore whose rate it speaks of
}

// parseMessage decodes the payload of a message on a fair session's
// channel (wire.ParseMessage) as the event it hands its waiter. It reports
// false for anything else; it never panics.
func parseMessage(payload string) (message, bool) {
	m, ok := wire.ParseMessage(payload)
	if !ok {
		return message{}, false
	}
	out := message{id: m.ID}
	switch m.Kind {
	case 'g':
		out.ev, out.deadline = event{kind: evGrant, grant: m.Grant}, m.Grant.Until
	case 'x':
		out.ev = event{kind: evWeight, limit: m.Limit, rate: m.Rate}
	case 'w':
		out.ev = event{kind: evWake, wait: m.Wait}
	case 'r':
		out.ev = event{kind: evRequeue}
	case 'n':
		out.ev, out.meta = event{kind: evRateSet, at: m.At}, m.Meta
	case 'h':
		out.ev, out.meta = event{kind: evRateHeld, at: m.At, wait: m.Wait}, m.Meta
	}
	return out, true
}

// run is the heartbeat: it keeps the session alive for as long as the hub
// runs (the hub stops once it had no waiter for a while), whether or not a
// waiter is registered at the tick: a process whose fair calls are all
// granted at once registers each for one round trip only, and its session
// must not die meanwhile (its next waiter would queue under a dead
// session). It also beats early when a holder is due to expire (the beat
// admits waiters into its slots).
func (s *session) run(quit <-chan struct{}) {
	h := s.h
	every := bounds.Heartbeat(h.e.cfg.QueueTTL, h.e.cfg.Fallback)
	next := time.Now().Add(every)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		// The next beat: the periodic one, or sooner just after the
		// earliest holder of an engine with waiters may expire (the hint of
		// its latest reply, which may have come before this loop started).
		// An early beat runs on that engine's keys: its expiry and
		// admission work is per semaphore. Any beat keeps the session alive.
		h.mu.Lock()
		at := next
		var target *Engine
		for e, due := range s.due {
			if due.Before(at) {
				at, target = due, e
			}
		}
		h.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(time.Until(at))

		select {
		case <-quit:
			return
		case <-t.C:
			early := target != nil && h.hasWaiters(target)
			if !early {
				// The periodic beat: on some engine with waiters (a
				// family's members take turns), else on the engine of the
				// latest waiter. Either beat also keeps alive the keys of
				// every other member where this process waits (beat).
				target = h.allWaiting(h.lastEngine())[0]
			}
			// Bounded, and ended by the hub's shutdown too: Close must not
			// wait for a beat into a Redis that does not answer.
			ctx, cancel := context.WithTimeout(context.Background(), every+bounds.BeatSlack)
			stopOnQuit := afterClose(quit, cancel)
			id := s.ID()
			switch err := s.beat(ctx, target, id, "old"); {
			case err == wire.ErrSessionDied:
				_ = s.replace(ctx, id)
			case err != nil && early:
				// A failed early beat is not run again at once (a refusing
				// Redis would have it spin): the periodic one follows.
				h.mu.Lock()
				delete(s.due, target)
				h.mu.Unlock()
			}
			stopOnQuit()
			cancel()
			if !early {
				next = time.Now().Add(every)
			}
		case <-s.kick: // a new hint: maybe beat earlier, no beat now
		}
	}
}

// beat runs one heartbeat for session id on e's keys (extending the
// session, shared by a family's members, with the keys of every member
// where this process waits, and admitting e's waiters whose turn came;
// heartbeat.lua's grants go to their waiters) and records e's expiry hint. It returns wire.ErrSessionDied when the session had expired in
// Redis.
func (s *session) beat(ctx context.Context, e *Engine, id, age string) error {
	// The other members of the family where this process waits: one beat
	// keeps their keys (and so their queue entries) alive too, whatever
	// their number.
	var keep []string
	for _, o := range s.h.allWaiting(e) {
		if o != e {
			keep = append(keep, o.keys.memberBase())
		}
	}
	r, err := e.door.Heartbeat(ctx, id, age, keep)
	e.activeHub().deliverGrants(r.Grants)
	if err != nil && err != wire.ErrSessionDied {
		return err
	}
	s.setHint(e, r.Hint)
	return err
}

// replace replaces the session dead, which died (its heartbeats did not
// reach Redis for QueueTTL: the process was paused or cut off), with a new
// one: it subscribes to the new session's channel, makes the session, and
// has every waiter queue again under it (their old places are forfeit, as
// for any process that missed its heartbeats for QueueTTL; each reports
// its eviction). It does nothing when the session is no longer dead (a
// waiter and the heartbeat may both find it dead: one renews it).
func (s *session) replace(ctx context.Context, dead string) error {
	s.replacing.Lock()
	defer s.replacing.Unlock()
	h := s.h
	h.mu.Lock()
	if s.id != dead {
		h.mu.Unlock()
		return nil
	}
	id, ps, target := newSessionID(), h.ps, h.last
	h.mu.Unlock()
	if ps != nil {
		if err := h.subscribe(ctx, ps, s.channelOf(id)); err != nil {
			return err
		}
	}
	if err := s.beat(ctx, h.allWaiting(target)[0], id, "new"); err != nil {
		return err
	}
	h.mu.Lock()
	s.id = id
	h.mu.Unlock()
	if ps != nil {
		_ = h.unsubscribe(ctx, ps, s.channelOf(dead))
	}
	h.broadcast(event{kind: evRequeue, evicted: true})
	return nil
}

// afterClose calls f once ch closes, unless the returned stop is called
// first (as context.AfterFunc does for a context).
func afterClose(ch <-chan struct{}, f func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			f()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// ---- the fair call's wait ----

// fairWait is the fair strategy: the call registers with the hub (whose
// session keeps its queue entry alive), queues, and waits for its grant,
// delivered by the hub from a release reply or a session message.
//
// The call's goroutine is the one owner of its waiter's state: the hub only
// hands it events, and it decides what each means against the queue
// attempt it made last (its session and its floor, see wire.AcquireReply.floor). A
// waiter is, in turn:
//
//	asking   acquire.lua runs (queue mode)         granted: done; queued: waiting; session died: replace it, ask again
//	waiting  a grant for the last attempt          done (unless its deadline passed: ask again)
//	waiting  a grant from an older attempt         ask again (a delayed message, or from before a data loss)
//	waiting  "evicted as too heavy"                ask again: the reply says ErrWeight if it still is
//	waiting  resync, session replaced, removed     ask again
//
// So only a reply to the latest attempt, or a grant that Redis made after
// it (its token above the attempt's floor, on the attempt's session), ends
// the call with a lease: a message that answers an earlier attempt can
// never hand out a slot that Redis no longer gives this waiter.
type fairWait struct{}

func (fairWait) next(c *call) (grant, bool, error) {
	if c.w == nil {
		w, err := c.e.register(c.ctx, c.id, c.n)
		if err != nil {
			return grant{}, false, err
		}
		c.w = w
	}
	s := c.w.h.session()
	sid := s.ID()
	a, err := c.attempt("queue", sid)
	switch {
	case err == nil && a.Code == wire.CodeGranted:
		return a.Grant(), true, nil
	case errors.Is(err, wire.ErrSessionDied):
		// Its session expired (the process was paused, or cut off): a new
		// one, and every waiter of the process queues again.
		return grant{}, false, s.replace(c.ctx, sid)
	case err != nil:
		return grant{}, false, err
	}
	s.queued(c.e, a.Hint)
	return c.awaitGrant(c.w, sid, a.Floor)
}

func (fairWait) listener(h *hub) listener { return newSession(h) }

func (fairWait) done(c *call) {
	if c.w != nil {
		c.w.h.unregister(c.w)
	}
}

// awaitGrant waits for w's grant after a queue attempt under session sid
// whose floor was floor. It returns the grant (ok), or ok false when the
// waiter must ask Redis again (an event that this attempt cannot settle).
func (c *call) awaitGrant(w *waiter, sid string, floor int64) (g grant, ok bool, err error) {
	for {
		select {
		case ev := <-w.events:
			switch ev.kind {
			case evGrant:
				g := ev.grant
				if g.Token <= floor || (g.SID != "" && g.SID != sid) {
					// Made before this attempt ran: a delayed message, or one
					// from before a data loss. Redis says what holds now.
					c.e.rep.warn().LogAttrs(context.Background(), slog.LevelDebug, "redsem: a grant older than the queue attempt refused",
						slog.String("semaphore", c.e.cfg.Name), slog.String("waiter", c.id), slog.Int64("token", g.Token))
					return grant{}, false, nil
				}
				if !time.Now().Before(g.Deadline) {
					// Granted, but this process learned too late, or cannot
					// tell when the grant ends (grantDeadline): ask again.
					return grant{}, false, nil
				}
				return g, true, nil
			case evWeight:
				// SetLimit or SetRate made this waiter too heavy, or did so to
				// an earlier queue entry of it: the reply to asking again is
				// ErrWeight if it still is (and then nothing is left queued).
				return grant{}, false, nil
			case evRequeue:
				if ev.evicted {
					c.e.rep.emit(redsem.Event{Kind: redsem.EventWaiterEvicted, LeaseID: c.id})
				}
				return grant{}, false, nil
			}
		case <-c.ctx.Done():
			return grant{}, false, c.ctx.Err()
		}
	}
}

func (fairWait) leaveAtClose(c *call) bool {
	ctx, cancel := context.WithTimeout(c.parent, bounds.CloseUndo)
	defer cancel()
	r, err := c.e.door.Release(ctx, c.id, "undo")
	c.e.activeHub().deliverGrants(r.Grants)
	return err == nil
}

func (fairWait) tag() string      { return "f" }
func (fairWait) localQueue() bool { return false }
