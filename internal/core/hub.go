package core

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// grant is a grant as a script reply or a session message reports it
// (package wire decodes both).
type grant = wire.Grant

type evKind int

const (
	evFree     evKind = iota // unfair: slots may be free, try again
	evGrant                  // fair: this waiter was granted its slots
	evRequeue                // fair: ask Redis again (session replaced under a new id, or messages may have been lost)
	evWeight                 // fair: SetLimit (SetRate) made the limit (the rate's) smaller than this waiter's weight
	evWake                   // fair: the rate lets this head waiter in after a delay: beat then (handled by the session)
	evRateSet                // fair: SetRate ran (in any process): what the former rate held back is no one's reason (handled by the session)
	evRateHeld               // fair: the rate's window holds the queue's head (of any process) for a while (handled by the session)
)

type event struct {
	kind    evKind
	grant   grant // evGrant
	limit   int   // evWeight
	rate    bool  // evWeight: the rate's limit, not the limit
	evicted bool  // evRequeue: the waiter lost its place (its session died, or an operator removed it)
	wait    int64 // evWake, evRateHeld: ms from the script's run
	at      int64 // evRateSet: the server time (ms) at which SetRate ran; evRateHeld: at which the script ran
}

// waiter is one goroutine blocked in Acquire; the hub only delivers events
// to it (acquire.go owns the waiting).
type waiter struct {
	id     string
	n      int
	events chan event
	h      *hub
	e      *Engine // the semaphore (a family's member) it waits on
	// granted: its call was granted (unfair; written and read by the
	// call's goroutine only).
	granted bool
}

// hub is a semaphore's per-process subscription, alive while some goroutine
// waits (and a short while after), and the local waiters it serves. What
// the subscription carries is its listener's business, chosen by variant
// when the hub starts: the fair session (session.go: one channel per
// session, grants and requeues, and the heartbeat that keeps all of this
// process's waiters alive), or the unfair wake list (unfairwait.go:
// freed-slot notices, handed to the oldest waiters that fit, and the
// rate's gate).
//
// The members of a keyed family share one hub per shard: their keys share
// the family's sessions key and channel base, so one subscription (and for
// the fair variant one session and one heartbeat) serves the waiters of
// every member (waiter ids are unique, so events find their waiter by id).
type hub struct {
	// e is the engine whose settings (client, channel base, intervals) the
	// hub uses: the semaphore, or the family member whose waiter started
	// the hub (members share those settings).
	e *Engine
	l listener

	readyCh  chan struct{} // closed when subscribed (and the listener started), or on failure
	readyErr error

	// mu guards the fields below, and the listener's state.
	mu      sync.Mutex
	ps      *redis.PubSub
	waiters map[string]*waiter
	last    *Engine // the engine of the latest waiter
	// count is, per engine with waiters (one, or a family's members), how
	// many.
	count  map[*Engine]int
	idle   *time.Timer
	closed bool

	quit      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// listener is what a hub's subscription serves, by variant.
type listener interface {
	// channel is the channel to subscribe to first.
	channel() string
	// start runs once subscribed, before any waiter is served (the fair
	// session is made here).
	start(ctx context.Context) error
	// run is the listener's background work while the hub runs (the fair
	// heartbeat), on a goroutine of the hub's; it returns when quit closes.
	run(quit <-chan struct{})
	// handle takes a message of the subscription.
	handle(m *redis.Message)
	// resync makes every local waiter ask Redis again: messages may have
	// been lost (the subscription was made again).
	resync()
	// joined is called (under h.mu) when w registered, dropped when it
	// unregistered; left when e has no waiter left in the hub.
	joined(w *waiter)
	dropped(w *waiter)
	left(e *Engine)
}

// activeHub returns the engine's hub, nil if none runs.
func (e *Engine) activeHub() *hub {
	mu, slot := e.hubSlot()
	mu.Lock()
	defer mu.Unlock()
	return *slot
}

// listening reports whether e's hub runs and is subscribed: a waiter that
// registers now is served at once, without waiting for a subscription.
func listening(e *Engine) bool {
	h := e.activeHub()
	if h == nil {
		return false
	}
	select {
	case <-h.readyCh:
		return h.readyErr == nil
	default:
		return false
	}
}

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
			e: e, readyCh: make(chan struct{}), waiters: map[string]*waiter{}, count: map[*Engine]int{},
			quit: make(chan struct{}),
		}
		h.l = e.variant.listener(h)
		*slot = h
		h.wg.Add(1)
		go h.run()
	}
	w := &waiter{id: id, n: n, events: make(chan event, 8), h: h, e: e}
	h.mu.Lock()
	h.waiters[id] = w
	h.count[e]++
	h.last = e
	h.l.joined(w)
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

func (h *hub) unregister(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.id] != w {
		return
	}
	delete(h.waiters, w.id)
	if h.count[w.e]--; h.count[w.e] <= 0 {
		delete(h.count, w.e)
		h.l.left(w.e)
	}
	h.l.dropped(w)
	if len(h.waiters) == 0 && !h.closed {
		h.idle = time.AfterFunc(max(bounds.Heartbeat(h.e.cfg.QueueTTL, h.e.cfg.Fallback), bounds.HubIdle), h.stopIfIdle)
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

// shutdown stops the hub's goroutines and waits for them, at most
// bounds.Shutdown.
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
			// Not waited for: go-redis's PubSub.Close takes a lock that its
			// own reconnect holds while it says HELLO to a Redis that does
			// not answer (until the client's read timeout, and its retries).
			go func() { _ = ps.Close() }()
		}
	})
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(bounds.Shutdown)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
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

// run subscribes and starts the listener, then hands it the messages
// until shut down.
func (h *hub) run() {
	defer h.wg.Done()
	e := h.e
	// Bounded, and ended by shutdown too (which closes ps, known to it
	// from here on): Close must not wait for a Redis that does not answer.
	ctx, cancel := context.WithTimeout(context.Background(), bounds.Subscribe)
	stopOnQuit := afterClose(h.quit, cancel)
	defer stopOnQuit()
	var ps *redis.PubSub
	if e.pub == "SPUBLISH" {
		ps = e.cfg.Client.SSubscribe(ctx, h.l.channel())
	} else {
		ps = e.cfg.Client.Subscribe(ctx, h.l.channel())
	}
	h.mu.Lock()
	h.ps = ps
	h.mu.Unlock()
	var err error
	for subscribed := false; !subscribed && err == nil; {
		var msg any
		if msg, err = ps.Receive(ctx); err == nil {
			_, subscribed = msg.(*redis.Subscription)
		}
	}
	if err == nil {
		err = h.l.start(ctx)
	}
	cancel()
	h.mu.Lock()
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

	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.l.run(h.quit)
	}()
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		switch m := m.(type) {
		case *redis.Message:
			h.l.handle(m)
		case *redis.Subscription:
			// After the initial subscription, a confirmation means that
			// go-redis reconnected (or the session channel changed):
			// messages may have been lost meanwhile, so every waiter asks
			// Redis again.
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				h.l.resync()
			}
		}
	}
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
func (h *hub) hasWaiters(e *Engine) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[e] > 0
}

// allWaiting returns the engines with waiters (a family's members where
// this process waits), or def alone if none has.
func (h *hub) allWaiting(def *Engine) []*Engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.count) == 0 {
		return []*Engine{def}
	}
	out := make([]*Engine, 0, len(h.count))
	for e := range h.count {
		out = append(out, e)
	}
	return out
}

// listener returns h's listener; nil for a nil hub.
func (h *hub) listener() listener {
	if h == nil {
		return nil
	}
	return h.l
}

// deliverGrants wakes the local waiters named in a script reply's grant
// list, without waiting for the pub/sub message; nothing for a nil hub
// (no waiter of this process).
func (h *hub) deliverGrants(g wire.Grants) {
	if h == nil {
		return
	}
	for _, gr := range g.Decode() {
		h.deliver(gr.ID, event{kind: evGrant, grant: gr})
	}
}
