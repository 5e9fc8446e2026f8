package core

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/lua"
)

type evKind int

const (
	evFree    evKind = iota // unfair: slots may be free, try again
	evGrant                 // fair: this waiter was granted its slots
	evRequeue               // fair: ask Redis again (session renewed under a new id, or messages may have been lost)
	evWeight                // fair: SetLimit (SetRate) made the limit (the rate's) smaller than this waiter's weight
	evWake                  // fair: the rate lets this head waiter in after a delay: beat then (handled by the hub)
)

type event struct {
	kind    evKind
	grant   grant // evGrant
	limit   int   // evWeight
	rate    bool  // evWeight: the rate's limit, not the limit
	evicted bool  // evRequeue: the waiter lost its place (its session died, or an operator removed it)
	wait    int64 // evWake: ms from the script's run
}

// waiter is one goroutine blocked in Acquire; the hub only delivers events
// to it (acquire.go owns the waiting).
type waiter struct {
	id     string
	n      int
	fair   bool
	events chan event
	h      *hub
	e      *Engine // the semaphore (a family's member) it waits on
}

// hub is a semaphore's per-process waiting machinery, alive while some
// goroutine waits (and a short while after): one pub/sub subscription for
// wake-ups, and for the fair variant one session whose heartbeat keeps all
// of this process's waiters alive, so that the cost of liveness grows with
// processes, not with waiters.
//
// The members of a keyed family share one hub: their keys share the
// family's sessions key and channel base, so the one session, its one
// subscription and its one heartbeat serve the waiters of every member
// (waiter ids are unique, so grants find their waiter by id alone).
type hub struct {
	// e is the engine whose settings (client, channel base, variant,
	// intervals) the hub uses: the semaphore, or the family member whose
	// waiter started the hub (members share those settings).
	e *Engine

	readyCh  chan struct{} // closed when subscribed (and, fair, the session made), or on failure
	readyErr error

	mu      sync.Mutex
	sid     string  // fair session id; replaced when the session died
	last    *Engine // the engine of the latest waiter: idle beats run on its keys
	ps      *redis.PubSub
	waiters map[string]*waiter
	unfair  []*waiter // unfair waiters, oldest first
	// Per engine with waiters (one, or a family's members): how many
	// waiters, and when to beat early on its keys, just after its earliest
	// holder may expire (the beat admits waiters into that holder's slots).
	count map[*Engine]int
	due   map[*Engine]time.Time
	// gate is, per engine, the one unfair waiter of this process that
	// sleeps until the rate's window has room (takeGate, passGate): the
	// others wait for it, or for a freed slot, instead of all trying at
	// the moment the window frees one slot.
	gate   map[*Engine]*waiter
	idle   *time.Timer
	closed bool

	renewing sync.Mutex // one session renewal at a time

	kick      chan struct{}
	quit      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// heartbeatEvery is how often a fair session heart-beats: three times per
// QueueTTL, and at least as often as the fallback bound.
func (e *Engine) heartbeatEvery() time.Duration {
	return min(e.cfg.QueueTTL/3, e.cfg.Fallback)
}

func newSessionID() string { return strings.ReplaceAll(uuid.NewString(), "-", "") }

// register adds a waiter for id (n slots) to the hub, starting the hub if
// needed, and returns once the hub is ready. Its errors are raw (the
// acquire call classifies them).
func (e *Engine) register(ctx context.Context, id string, n int) (*waiter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // no hub started (its session would be made) for a call that ended
	}
	if e.fam != nil {
		if err := e.fam.checkShards(ctx); err != nil {
			return nil, err // no session made in a shard of a layout that is not the family's
		}
	}
	mu, slot := e.hubSlot()
	mu.Lock()
	if e.isClosed() {
		mu.Unlock()
		return nil, redsem.ErrClosed
	}
	h := *slot
	if h == nil {
		h = &hub{
			e: e, sid: newSessionID(), readyCh: make(chan struct{}), waiters: map[string]*waiter{},
			count: map[*Engine]int{}, due: map[*Engine]time.Time{},
			kick: make(chan struct{}, 1), quit: make(chan struct{}),
		}
		*slot = h
		h.wg.Add(1)
		go h.run()
	}
	w := &waiter{id: id, n: n, fair: e.cfg.Fair, events: make(chan event, 8), h: h, e: e}
	h.mu.Lock()
	h.waiters[id] = w
	h.count[e]++
	h.last = e
	if !w.fair {
		h.unfair = append(h.unfair, w)
	}
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.mu.Unlock()
	mu.Unlock()

	select {
	case <-h.readyCh:
		if h.readyErr != nil {
			h.unregister(w)
			return nil, h.readyErr
		}
		return w, nil
	case <-ctx.Done():
		h.unregister(w)
		return nil, ctx.Err()
	}
}

// takeGate makes w the waiter of its engine that waits for the rate's
// window, unless another one is; it reports whether w is (now) that one.
func (h *hub) takeGate(w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.gate[w.e]; g != nil && g != w {
		return false
	}
	if h.gate == nil {
		h.gate = map[*Engine]*waiter{}
	}
	h.gate[w.e] = w
	return true
}

// passGate ends w's wait for the rate's window, if it was the one waiting
// (granted, gone, or now held back by the slots): the next unfair waiter
// of its engine in this process is woken to try at once (the window may
// have more room, and someone must wait for it next).
func (h *hub) passGate(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate[w.e] != w {
		return
	}
	delete(h.gate, w.e)
	for _, u := range h.unfair {
		if u != w && u.e == w.e {
			select {
			case u.events <- event{kind: evFree}:
			default: // already woken
			}
			return
		}
	}
}

func (h *hub) unregister(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.id] != w {
		return
	}
	delete(h.waiters, w.id)
	if h.count[w.e]--; h.count[w.e] <= 0 {
		delete(h.count, w.e)
		delete(h.due, w.e)
	}
	if !w.fair {
		for i, u := range h.unfair {
			if u == w {
				h.unfair = append(h.unfair[:i], h.unfair[i+1:]...)
				break
			}
		}
	}
	if len(h.waiters) == 0 && !h.closed {
		h.idle = time.AfterFunc(max(h.e.heartbeatEvery(), 500*time.Millisecond), h.stopIfIdle)
	}
}

// session returns the fair session id that queue entries are made under.
func (h *hub) session() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sid
}

// queued records the latest expiry hint of e (ms until its earliest
// holder may expire, -1 none), and moves the next heartbeat earlier if a
// holder expires sooner: the heartbeat admits waiters into the slots of
// expired holders.
func (h *hub) queued(e *Engine, hint int64) {
	if h.setHint(e, hint) {
		h.poke()
	}
}

// setHint records e's hint (kept only while e has waiters) and reports
// whether it moved e's early beat earlier.
func (h *hub) setHint(e *Engine, hint int64) (earlier bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hint < 0 || h.count[e] == 0 {
		delete(h.due, e)
		return false
	}
	due := time.Now().Add(time.Duration(hint+1) * time.Millisecond)
	old, ok := h.due[e]
	h.due[e] = due
	return !ok || due.Before(old)
}

// wakeAt moves e's early beat to at, if it has none due sooner (and
// waiters), and reports whether it moved.
func (h *hub) wakeAt(e *Engine, at time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.count[e] == 0 {
		return false
	}
	if old, ok := h.due[e]; ok && old.Before(at) && time.Now().Before(old) {
		return false
	}
	h.due[e] = at
	return true
}

func (h *hub) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *hub) stopIfIdle() {
	mu, slot := h.e.hubSlot()
	mu.Lock()
	h.mu.Lock()
	idle := len(h.waiters) == 0 && !h.closed
	if idle && *slot == h {
		*slot = nil
	}
	h.mu.Unlock()
	mu.Unlock()
	if idle {
		h.shutdown()
	}
}

// shutdown stops the hub's goroutines and waits for them.
func (h *hub) shutdown() {
	h.closeOnce.Do(func() {
		h.mu.Lock()
		h.closed = true
		if h.idle != nil {
			h.idle.Stop()
		}
		ps := h.ps
		h.mu.Unlock()
		close(h.quit)
		if ps != nil {
			_ = ps.Close()
		}
	})
	h.wg.Wait()
}

// deliver hands an event to a local waiter, if it is still waiting, and
// returns it (nil if it was not).
func (h *hub) deliver(id string, ev event) *waiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.waiters[id]
	if w == nil {
		return nil
	}
	select {
	case w.events <- ev:
	default:
	}
	return w
}

// engineOf returns the engine that the local waiter id waits on, or nil.
func (h *hub) engineOf(id string) *Engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.waiters[id]; w != nil {
		return w.e
	}
	return nil
}

// broadcast hands ev to every local waiter.
func (h *hub) broadcast(ev event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.waiters {
		select {
		case w.events <- ev:
		default:
		}
	}
}

// wakeUnfair wakes local unfair waiters, oldest first, that fit in free
// slots: as many as the slots allow, never all of them for one slot.
func (h *hub) wakeUnfair(free int) { h.wakeUnfairOf("", free) }

// wakeUnfairOf is wakeUnfair for the waiters of the semaphore whose meta
// key is meta (of any, if meta is ""): the members of an unfair family
// share one freed-slot channel.
func (h *hub) wakeUnfairOf(meta string, free int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.unfair {
		if free <= 0 {
			return
		}
		if w.n > free || (meta != "" && w.e.keys.List[KeyMeta] != meta) {
			continue
		}
		select {
		case w.events <- event{kind: evFree}:
			free -= w.n
		default: // already woken
		}
	}
}

// subscribe and unsubscribe follow the client: sharded pub/sub on a
// cluster, plain pub/sub otherwise (the scripts publish likewise).
func (h *hub) subscribe(ctx context.Context, ps *redis.PubSub, channels ...string) error {
	if h.e.pub == "SPUBLISH" {
		return ps.SSubscribe(ctx, channels...)
	}
	return ps.Subscribe(ctx, channels...)
}

func (h *hub) unsubscribe(ctx context.Context, ps *redis.PubSub, channels ...string) error {
	if h.e.pub == "SPUBLISH" {
		return ps.SUnsubscribe(ctx, channels...)
	}
	return ps.Unsubscribe(ctx, channels...)
}

// run subscribes (and, fair, makes the session), then receives wake-ups
// and heart-beats until shut down.
func (h *hub) run() {
	defer h.wg.Done()
	e := h.e
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	channels := []string{e.keys.Free}
	if e.cfg.Fair {
		channels = []string{e.keys.Chan + ":s:" + h.sid}
	}
	var ps *redis.PubSub
	if e.pub == "SPUBLISH" {
		ps = e.cfg.Client.SSubscribe(ctx, channels...)
	} else {
		ps = e.cfg.Client.Subscribe(ctx, channels...)
	}
	var err error
	for n := 0; n < len(channels) && err == nil; {
		var msg any
		if msg, err = ps.Receive(ctx); err == nil {
			if _, ok := msg.(*redis.Subscription); ok {
				n++
			}
		}
	}
	if err == nil && e.cfg.Fair {
		err = h.beat(ctx, e, h.session(), "new")
	}
	cancel()
	h.mu.Lock()
	h.ps = ps
	closed := h.closed
	h.mu.Unlock()
	if err != nil || closed {
		_ = ps.Close()
		h.readyErr = err
		if err == nil {
			h.readyErr = redsem.ErrClosed
		}
		mu, slot := h.e.hubSlot()
		mu.Lock()
		if *slot == h {
			*slot = nil
		}
		mu.Unlock()
		close(h.readyCh)
		return
	}
	close(h.readyCh)

	if e.cfg.Fair {
		h.wg.Add(1)
		go h.heartbeats(ps)
	}
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		switch m := m.(type) {
		case *redis.Message:
			h.onMessage(m)
		case *redis.Subscription:
			// After the initial subscription, a confirmation means that
			// go-redis reconnected (or the session channel changed):
			// messages may have been lost meanwhile, so every waiter asks
			// Redis again.
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				h.resync()
			}
		}
	}
}

// resync makes every local waiter ask Redis again: fair waiters re-run
// their acquire (which reports a grant or their place, or queues them
// again), unfair ones retry.
func (h *hub) resync() {
	if h.e.cfg.Fair {
		h.broadcast(event{kind: evRequeue})
	} else {
		h.broadcast(event{kind: evFree})
	}
}

func (h *hub) onMessage(m *redis.Message) {
	if m.Channel == h.e.keys.Free {
		// "n meta-key" (lib.lua's notify_free): n slots free in the
		// semaphore whose meta key that is; a bare "n" (an older version)
		// wakes waiters of any.
		count, meta, _ := strings.Cut(m.Payload, " ")
		h.wakeUnfairOf(meta, max(int(toInt(count)), 1))
		return
	}
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
		msg.ev.grant.deadline = we.clock.localAtLeast(msg.deadline).Add(-time.Millisecond)
		// The channel names the session the waiter was queued under when
		// Redis granted it: the waiter refuses a grant of another session.
		msg.ev.grant.sid = strings.TrimPrefix(m.Channel, h.e.keys.Chan+":s:")
		h.deliver(msg.id, msg.ev)
	case evWeight:
		h.deliver(msg.id, msg.ev)
	case evWake:
		// The rate's window holds back this head waiter until wait ms after
		// the script ran: beat on its semaphore's keys then (the beat admits
		// it). The message came after the script ran, so the beat is not
		// early.
		if we := h.engineOf(msg.id); we != nil && h.wakeAt(we, time.Now().Add(time.Duration(msg.ev.wait+1)*time.Millisecond)) {
			h.poke()
		}
	case evRequeue:
		// An operator removed this waiter from the queue: it queues again
		// (and reports the eviction from its own goroutine: an Observer
		// may call Close, which waits for this one).
		msg.ev.evicted = true
		h.deliver(msg.id, msg.ev)
	}
}

// message is a decoded message of a fair session's channel.
type message struct {
	id       string // the waiter it is for
	ev       event  // evGrant (grant.deadline not set), evWeight or evRequeue
	deadline int64  // evGrant: the grant's deadline, server ms
}

// parseMessage decodes the payload of a message on a fair session's
// channel: "g id token deadline_ms slots" (a grant), "x id limit" (SetLimit
// made the limit smaller than the waiter's weight; "x id limit rate":
// SetRate made the rate's), "w id ms" (the rate holds back the head waiter
// id for ms) or "r id" (an operator removed the waiter). It reports false
// for anything else; it never panics.
func parseMessage(payload string) (message, bool) {
	f := strings.Fields(payload)
	switch {
	case len(f) == 5 && f[0] == "g":
		r := reader{script: "grant message", v: []any{f[1], f[2], f[3], f[4]}}
		g := grant{id: r.str(), token: r.int()}
		dl := r.int()
		g.slots = r.slots()
		if r.err != nil {
			return message{}, false
		}
		return message{id: g.id, ev: event{kind: evGrant, grant: g}, deadline: dl}, true
	case len(f) == 3 && f[0] == "x":
		return message{id: f[1], ev: event{kind: evWeight, limit: int(toInt(f[2]))}}, true
	case len(f) == 4 && f[0] == "x" && f[3] == "rate":
		return message{id: f[1], ev: event{kind: evWeight, limit: int(toInt(f[2])), rate: true}}, true
	case len(f) == 3 && f[0] == "w":
		return message{id: f[1], ev: event{kind: evWake, wait: max(toInt(f[2]), 0)}}, true
	case len(f) == 2 && f[0] == "r":
		return message{id: f[1], ev: event{kind: evRequeue}}, true
	}
	return message{}, false
}

// heartbeats keeps the fair session alive for as long as the hub runs (the
// hub stops once it had no waiter for a while), whether or not a waiter is
// registered at the tick: a process whose fair calls are all granted at
// once registers each for one round trip only, and its session must not
// die meanwhile (its next waiter would queue under a dead session). It also
// beats early when a holder is due to expire (the beat admits waiters into
// its slots).
func (h *hub) heartbeats(ps *redis.PubSub) {
	defer h.wg.Done()
	every := h.e.heartbeatEvery()
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
		for e, due := range h.due {
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
		case <-h.quit:
			return
		case <-t.C:
			early := target != nil && h.waiting(target)
			if !early {
				// The periodic beat: on some engine with waiters (a
				// family's members take turns at random), else on the
				// engine of the latest waiter.
				target = h.anyWaiting(h.lastEngine())
			}
			ctx, cancel := context.WithTimeout(context.Background(), every+time.Second)
			sid := h.session()
			switch err := h.beat(ctx, target, sid, "old"); {
			case err == errSessionDied:
				_ = h.renewSession(ctx, sid)
			case err != nil && early:
				// A failed early beat is not run again at once (a refusing
				// Redis would have it spin): the periodic one follows.
				h.mu.Lock()
				delete(h.due, target)
				h.mu.Unlock()
			}
			cancel()
			if !early {
				next = time.Now().Add(every)
			}
		case <-h.kick: // a new hint: maybe beat earlier, no beat now
		}
	}
}

type sessionError struct{}

func (sessionError) Error() string { return "redsem: fair session died" }

var errSessionDied error = sessionError{}

// beat runs one heartbeat for the session on e's keys (extending the
// session, shared by a family's members, and admitting e's waiters whose
// turn came) and delivers the grants it made. It returns errSessionDied
// when the session had expired in Redis (this process paused or was cut
// off for longer than QueueTTL).
func (h *hub) beat(ctx context.Context, e *Engine, sid, age string) error {
	v, sent, err := e.run(ctx, lua.Heartbeat, e.cfg.Limit, sid, ms(e.cfg.QueueTTL), age)
	if err != nil {
		return err
	}
	r := reader{script: "heartbeat", v: v}
	now, alive, hint := r.int(), r.int(), r.int()
	if r.err != nil {
		return e.wrap(r.err)
	}
	e.clock.observe(sent, now)
	h.setHint(e, hint)
	e.deliverGrants("heartbeat", v, 3, now, sent)
	if alive != 1 {
		return errSessionDied
	}
	return nil
}

// renewSession replaces the session dead, which died (its heartbeats did
// not reach Redis for QueueTTL: the process was paused or cut off), with a
// new one: it subscribes to the new session's channel, makes the session,
// and has every waiter queue again under it (their old places are forfeit,
// as for any process that missed its heartbeats for QueueTTL; each reports
// its eviction). It does nothing when the session is no longer dead (a
// waiter and the heartbeat may both find it dead: one renews it).
func (h *hub) renewSession(ctx context.Context, dead string) error {
	h.renewing.Lock()
	defer h.renewing.Unlock()
	h.mu.Lock()
	if h.sid != dead {
		h.mu.Unlock()
		return nil
	}
	sid, ps, target := newSessionID(), h.ps, h.last
	h.mu.Unlock()
	e := h.e
	if ps != nil {
		if err := h.subscribe(ctx, ps, e.keys.Chan+":s:"+sid); err != nil {
			return err
		}
	}
	if err := h.beat(ctx, h.anyWaiting(target), sid, "new"); err != nil {
		return err
	}
	h.mu.Lock()
	h.sid = sid
	h.mu.Unlock()
	if ps != nil {
		_ = h.unsubscribe(ctx, ps, e.keys.Chan+":s:"+dead)
	}
	h.broadcast(event{kind: evRequeue, evicted: true})
	return nil
}

// lastEngine is the engine of the latest waiter (the hub's own before any).
func (h *hub) lastEngine() *Engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil {
		return h.last
	}
	return h.e
}

// waiting reports whether e has waiters in the hub.
func (h *hub) waiting(e *Engine) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[e] > 0
}

// anyWaiting returns an engine with waiters (a random one of a family's
// members), or def if none has.
func (h *hub) anyWaiting(def *Engine) *Engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	for e := range h.count {
		return e
	}
	return def
}

func (h *hub) snapshot() []*waiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*waiter, 0, len(h.waiters))
	for _, w := range h.waiters {
		out = append(out, w)
	}
	return out
}
