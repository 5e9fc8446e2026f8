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
	evFree  evKind = iota // unfair: a slot may be free, try again
	evGrant               // fair: this waiter was granted a slot
	evGone                // fair: this waiter's queue entry is gone (evicted)
)

type event struct {
	kind     evKind
	slot     int
	token    int64
	deadline time.Time
	// Grants only: at is an early local estimate of when the grant was
	// made; claimed is set when the session's heartbeat reported (and so
	// claimed) it, which makes it safe whatever happened before.
	at      time.Time
	claimed bool
}

// waiter is one goroutine blocked in Acquire.
type waiter struct {
	id      string
	fair    bool
	events  chan event
	h       *hub
	inQueue bool // fair: acquire.lua has queued it at least once (h.mu)
}

// hub is a semaphore's per-process waiting machinery, alive while some
// goroutine waits (and a short while after): one sharded pub/sub
// subscription for wake-ups, and for the fair variant one session whose
// heartbeat keeps all of this process's waiters alive, so that the cost of
// liveness grows with processes, not with waiters.
type hub struct {
	e   *Engine
	sid string // session id (fair)

	readyCh  chan struct{} // closed when subscribed, or on failure
	readyErr error

	mu        sync.Mutex
	ps        *redis.PubSub
	waiters   map[string]*waiter
	unfair    []*waiter // unfair waiters, oldest first
	refs      int
	hint      int64 // ms to the earliest holder deadline at the last reply, -1 none
	claims    bool  // grants were delivered that the session has not claimed yet
	idle      *time.Timer
	closed    bool
	kick      chan struct{}
	quit      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	// Local estimates of the session's life in Redis (fair), under mu: it
	// surely lives until alive, and has lived without a break since
	// liveSince.
	alive     time.Time
	liveSince time.Time
}

// heartbeatEvery is how often a fair session heart-beats: three times per
// QueueTTL, and at least as often as the fallback bound.
func (e *Engine) heartbeatEvery() time.Duration {
	return min(e.cfg.QueueTTL/3, e.cfg.Fallback)
}

// register adds a waiter to the hub, starting the hub if needed, and
// returns once the wake-up subscription is confirmed.
func (e *Engine) register(ctx context.Context, id string, fair bool) (*waiter, error) {
	e.hubMu.Lock()
	if e.closed {
		e.hubMu.Unlock()
		return nil, redsem.ErrClosed
	}
	h := e.hub
	if h == nil {
		h = &hub{
			e: e, sid: strings.ReplaceAll(uuid.NewString(), "-", ""),
			readyCh: make(chan struct{}), waiters: map[string]*waiter{},
			hint: -1, kick: make(chan struct{}, 1), quit: make(chan struct{}),
		}
		e.hub = h
		h.wg.Add(1)
		go h.run()
	}
	w := &waiter{id: id, fair: fair, events: make(chan event, 8), h: h}
	h.mu.Lock()
	h.waiters[id] = w
	if !fair {
		h.unfair = append(h.unfair, w)
	}
	h.refs++
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.mu.Unlock()
	e.hubMu.Unlock()

	select {
	case <-h.readyCh:
		if h.readyErr != nil {
			h.unregister(w)
			return nil, e.wrap(h.readyErr)
		}
		return w, nil
	case <-ctx.Done():
		h.unregister(w)
		return nil, e.gaveUp(ctx)
	}
}

func (h *hub) unregister(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.id] != w {
		return
	}
	delete(h.waiters, w.id)
	if !w.fair {
		for i, u := range h.unfair {
			if u == w {
				h.unfair = append(h.unfair[:i], h.unfair[i+1:]...)
				break
			}
		}
	}
	h.refs--
	if h.refs == 0 && !h.closed {
		h.idle = time.AfterFunc(max(h.e.heartbeatEvery(), 500*time.Millisecond), h.stopIfIdle)
	}
}

// queued records that w is in the queue and the latest expiry hint, and
// moves the next heartbeat earlier if a holder expires sooner.
func (h *hub) queued(w *waiter, hint int64) {
	h.mu.Lock()
	w.inQueue = true
	earlier := hint >= 0 && (h.hint < 0 || hint < h.hint)
	h.hint = hint
	h.mu.Unlock()
	if earlier {
		h.poke()
	}
}

// refreshed records a successful call that renewed the session: sent is
// before the request left, recv after the reply came back.
func (h *hub) refreshed(sent, recv time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.alive.IsZero() && !recv.Before(h.alive) {
		// The session may have expired (e.g. the process was paused)
		// before this call renewed it; grants it had not claimed by then
		// were revoked.
		h.liveSince = recv
	}
	if a := expiresBy(sent, ms(h.e.cfg.QueueTTL)); a.After(h.alive) {
		h.alive = a
	}
}

// trusted reports whether an unclaimed grant made at local time at (an early
// estimate) still stands: the session has lived without a break since then,
// so no expiry can have revoked it. A grant that is not trusted must be
// checked with Redis before it is used.
//
// A trusted grant stays unclaimed until the session's next heartbeat or the
// lease's first renewal claims it, and if the process stops before that, the
// grant dies with the session, which may be long before at + LeaseTTL. So
// trusted also returns until when the grant surely stands: the earliest the
// session can expire.
func (h *hub) trusted(at time.Time) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.alive, !at.Before(h.liveSince) && time.Now().Before(h.alive)
}

func (h *hub) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *hub) stopIfIdle() {
	h.e.hubMu.Lock()
	h.mu.Lock()
	idle := h.refs == 0 && !h.closed
	if idle && h.e.hub == h {
		h.e.hub = nil
	}
	h.mu.Unlock()
	h.e.hubMu.Unlock()
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

// deliver hands an event to a local waiter, if it is still waiting.
func (h *hub) deliver(id string, ev event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.waiters[id]
	if w == nil {
		return
	}
	if ev.kind == evGrant {
		h.claims = true
	}
	select {
	case w.events <- ev:
	default:
	}
}

// wakeUnfair wakes up to n local unfair waiters, oldest first.
func (h *hub) wakeUnfair(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.unfair {
		if n <= 0 {
			return
		}
		select {
		case w.events <- event{kind: evFree}:
			n--
		default:
		}
	}
}

// run subscribes, then receives wake-ups and (fair) heart-beats until shut down.
func (h *hub) run() {
	defer h.wg.Done()
	e := h.e
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	ps := e.cfg.Client.SSubscribe(ctx, e.keys.Free, e.keys.Chan+":s:"+h.sid)
	var err error
	for n := 0; n < 2 && err == nil; {
		var msg any
		if msg, err = ps.Receive(ctx); err == nil {
			if _, ok := msg.(*redis.Subscription); ok {
				n++
			}
		}
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
		h.e.hubMu.Lock()
		if h.e.hub == h {
			h.e.hub = nil
		}
		h.e.hubMu.Unlock()
		close(h.readyCh)
		return
	}
	close(h.readyCh)

	h.wg.Add(1)
	go h.heartbeats()
	for m := range ps.Channel(redis.WithChannelSize(1024)) {
		h.onMessage(m)
	}
}

func (h *hub) onMessage(m *redis.Message) {
	if m.Channel == h.e.keys.Free {
		n := int(toInt(m.Payload))
		h.wakeUnfair(max(n, 1))
		return
	}
	// "g id slot token grant_ms lease_ms"
	f := strings.Fields(m.Payload)
	if len(f) != 6 || f[0] != "g" {
		return
	}
	grantMs, leaseMs := toInt(f[4]), toInt(f[5])
	at := h.e.clock.localAtLeast(grantMs)
	h.deliver(f[1], event{
		kind: evGrant, slot: int(toInt(f[2])), token: toInt(f[3]),
		deadline: expiresBy(at, leaseMs), at: at,
	})
}

// heartbeats keeps the fair session alive while it has queued waiters or
// unclaimed grants, runs early when a holder is due to expire, and makes a
// last claim when the hub shuts down.
func (h *hub) heartbeats() {
	defer h.wg.Done()
	if !h.e.cfg.Fair {
		return
	}
	every := h.e.heartbeatEvery()
	next := time.Now().Add(every)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-h.quit:
			h.beat()
			return
		case <-t.C:
			h.beat()
			next = time.Now().Add(every)
		case <-h.kick: // a new hint: maybe beat earlier, no beat now
		}
		h.mu.Lock()
		at := next
		if h.hint >= 0 && len(h.waiters) > 0 {
			if due := time.Now().Add(time.Duration(h.hint+1) * time.Millisecond); due.Before(at) {
				at = due
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
	}
}

// beat runs one heartbeat for the session, if it has queued waiters or
// unclaimed grants, and delivers what it reports.
func (h *hub) beat() {
	h.mu.Lock()
	var ids []any
	for id, w := range h.waiters {
		if w.fair && w.inQueue {
			ids = append(ids, id)
		}
	}
	needed := len(ids) > 0 || h.claims
	h.claims = false
	h.mu.Unlock()
	if !needed {
		return
	}
	e := h.e
	ctx, cancel := context.WithTimeout(context.Background(), e.heartbeatEvery()+time.Second)
	defer cancel()
	args := append([]any{h.sid, ms(e.cfg.QueueTTL)}, ids...)
	v, sent, err := e.run(ctx, lua.Heartbeat, e.cfg.Limit, args...)
	if err != nil {
		h.mu.Lock()
		h.claims = true // try again next time
		h.mu.Unlock()
		return
	}
	h.refreshed(sent, time.Now())
	e.clock.observe(sent, toInt(v[0]))
	h.mu.Lock()
	h.hint = toInt(v[1])
	h.mu.Unlock()
	for i, k := 2, 0; i+3 < len(v) && k < len(ids); i, k = i+4, k+1 {
		id := ids[k].(string)
		switch toInt(v[i]) {
		case 1:
			h.deliver(id, event{kind: evGrant, slot: int(toInt(v[i+1])), token: toInt(v[i+2]),
				deadline: expiresBy(sent, toInt(v[i+3])), claimed: true})
		case -1:
			h.deliver(id, event{kind: evGone})
		}
	}
}
