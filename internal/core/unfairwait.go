package core

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// The unfair variant's waiting room: how a call waits (unfairWait: sleep
// until a freed-slot notice, the rate's window or the fallback poll, then
// ask again) and the listener that wakes it (unfairWake: the local wake
// list and the rate's gate). The fair variant's room is session.go.

// unfairWait is the unfair strategy: the call tries; once refused it
// subscribes to freed-slot notices (and tries again at once, so that a slot
// freed meanwhile is not missed), then tries on each notice, or when the
// earliest holder may have expired, or after the fallback interval.
type unfairWait struct{}

func (unfairWait) next(c *call) (grant, bool, error) {
	if c.w == nil && !c.tried && listening(c.e) {
		// Other calls of this process wait on the semaphore: its hub
		// listens already. Joined first, the call's first attempt asks
		// for notices ("wait"), so that a call that must wait costs one
		// refused attempt, not two (the one before subscribing and the
		// one after).
		w, err := c.e.register(c.ctx, c.id, c.n)
		if err != nil {
			return grant{}, false, err
		}
		c.w = w
		if at, ok := wakeOf(w).behind(w); ok && c.e.cfg.Rate.IsZero() && c.e.rateHeld.none() {
			// An older call of this process waits for as many slots: the
			// next freed slot wakes it first. This call waits behind it
			// instead of trying for that slot too (a try that one of the
			// two would have made in vain): woken by a notice that has
			// room for it as well, when the older one's sleep ends (the
			// earliest holder deadline it was told, or its fallback poll:
			// both may find slots that no notice announces), or when the
			// older one leaves ungranted (done). Not under a rate: a call
			// that ends waiting says when the window has room
			// (RateLimitedError), which only an attempt's reply tells.
			d := min(max(time.Until(at), 0)+time.Millisecond, waitFor(c.e.cfg.Fallback, -1, -1))
			return grant{}, false, sleep(c, w, d, true)
		}
	}
	if c.w != nil {
		wakeOf(c.w).trying(c.w)
	}
	mode := "try"
	if c.w != nil {
		mode = "wait"
	}
	a, err := c.attempt(mode, "")
	switch {
	case err != nil:
		return grant{}, false, err
	case a.Code == wire.CodeGranted:
		if c.w != nil {
			c.w.granted = true
		}
		return a.Grant(), true, nil
	case c.w == nil:
		w, err := c.e.register(c.ctx, c.id, c.n)
		c.w = w
		return grant{}, false, err // registered: try again at once
	}
	w, e := c.w, c.e
	// When the rate's window holds it back, one waiter of this process
	// (per semaphore) sleeps until the window has room and, once granted,
	// wakes the next; the others sleep as if the slots held them back. So
	// the moment the window frees a slot costs one try per process, not one
	// per waiter.
	d := waitFor(e.cfg.Fallback, a.Hint, a.RateMs)
	if a.RateMs < 0 {
		wakeOf(w).passGate(w)
	} else if !wakeOf(w).takeGate(w) {
		// The hint is the sooner of a holder's expiry and the window's
		// room: only the former, if sooner, wakes it.
		hint := a.Hint
		if hint >= a.RateMs {
			hint = -1
		}
		d = waitFor(e.cfg.Fallback, hint, -1)
	}
	return grant{}, false, sleep(c, w, d, false)
}

// sleep waits for a freed-slot notice to w, for d, or for the call's end
// (its error); behind: w has made no attempt yet (it waits behind an older
// waiter).
func sleep(c *call, w *waiter, d time.Duration, behind bool) error {
	u := wakeOf(w)
	u.asleep(w, time.Now().Add(d), behind)
	defer u.awake(w)
	c.timer.Reset(d)
	defer c.timer.Stop()
	select {
	case <-w.events: // evFree
	case <-c.timer.C:
	case <-c.ctx.Done():
		// A wake-up received but not used goes to the next waiter.
		select {
		case ev := <-w.events:
			if ev.kind == evFree {
				wakeOf(w).wake(1)
			}
		default:
		}
		return c.ctx.Err()
	}
	return nil
}

func (unfairWait) listener(h *hub) listener { return &unfairWake{h: h} }

func (unfairWait) done(c *call) {
	if c.w == nil {
		return
	}
	w, u := c.w, wakeOf(c.w)
	u.passGate(w)
	w.h.unregister(w)
	// A wake-up that came while it was awake and went unused is not passed
	// on: most were sent for slots that the attempt under way took (handing
	// them on cost a refused attempt per hold); wakeOf sends to waiters
	// asleep first, and each waiter's own sleep ends by the earliest holder
	// deadline it was told (or the fallback), which bounds the rare one lost.
	if !w.granted {
		// It leaves ungranted (its context ended, an error, ErrWeight):
		// the calls that waited behind it without trying try now.
		u.wakeBehind(w)
	}
}

// waitFor is how long an unfair waiter sleeps without a message: until just
// after the earliest holder deadline, at most fallback (Options.Fallback),
// with ±20% jitter;
// or, when the rate held it back (rateMs >= 0, a slot was free) and its
// window has room before Fallback, exactly until then (and a millisecond),
// so that the grant comes when the rate allows it.
func waitFor(fallback time.Duration, hint, rateMs int64) time.Duration {
	d := fallback
	if r := time.Duration(rateMs+1) * time.Millisecond; rateMs >= 0 && r <= d {
		return r
	}
	if hint >= 0 {
		if h := time.Duration(hint+1) * time.Millisecond; h < d {
			d = h
		}
	}
	return bounds.Jitter(d, 0.2)
}

func (unfairWait) leaveAtClose(*call) bool { return false }
func (unfairWait) tag() string             { return "u" }
func (unfairWait) localQueue() bool        { return true }

// wakeOf is the wake list of w's hub (an unfair one).
func wakeOf(w *waiter) *unfairWake { return w.h.l.(*unfairWake) }

// unfairWake is the unfair variant's listener: freed-slot notices on the
// semaphore's (the family's) free channel wake the oldest local waiters
// that fit.
//
// Its state is guarded by the hub's mu: list, the local waiters oldest
// first; sleeping, those that sleep until a notice, and untried, those of
// them that made no attempt yet (they wait behind an older one); and gate, per engine, the one waiter of this process that sleeps
// until the rate's window has room (takeGate, passGate): the others wait
// for it, or for a freed slot, instead of all trying at the moment the
// window frees one slot.
type unfairWake struct {
	h        *hub
	list     []*waiter
	gate     map[*Engine]*waiter
	sleeping map[*waiter]time.Time // the waiters in sleep, with when it ends (behind)
	untried  map[*waiter]bool      // the waiters that sleep behind another, no attempt made yet
}

func (u *unfairWake) channel() string                 { return u.h.e.keys.Free }
func (u *unfairWake) start(ctx context.Context) error { return nil }
func (u *unfairWake) run(quit <-chan struct{})        {}
func (u *unfairWake) joined(w *waiter)                { u.list = append(u.list, w) }
func (u *unfairWake) left(e *Engine)                  {}
func (u *unfairWake) resync()                         { u.h.broadcast(event{kind: evFree}) }

func (u *unfairWake) dropped(w *waiter) {
	delete(u.sleeping, w)
	delete(u.untried, w)
	if i := slices.Index(u.list, w); i >= 0 {
		u.list = slices.Delete(u.list, i, i+1)
	}
}

// count returns how many local waiters it holds.
func (u *unfairWake) count() int {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	return len(u.list)
}

// handle takes "n meta-key" (the Lua library's notify_free): n slots free in the
// semaphore whose meta key that is; a bare "n" (an older version) wakes
// waiters of any.
func (u *unfairWake) handle(m *redis.Message) {
	count, meta, wait, at, held := wire.ParseFree(m.Payload)
	if held {
		// "0 META ms at": slots are free but the rate's window holds the
		// next grant back for ms: nobody is woken; the waiters of that
		// semaphore that give up meanwhile were held by the rate.
		u.rateHeldOf(meta, time.Duration(wait+1)*time.Millisecond, at)
		return
	}
	u.wakeOf(meta, count)
}

// rateHeldOf records that the rate's window holds back the next grant of
// the semaphore whose meta key is meta for d, as a script that ran at
// server time at (ms) found (rateHold).
func (u *unfairWake) rateHeldOf(meta string, d time.Duration, at int64) {
	until := time.Now().Add(d)
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	for _, w := range u.list {
		if w.e.keys.List[KeyMeta] == meta {
			w.e.rateHeld.hold(until, at)
		}
	}
}

// wake wakes local unfair waiters, oldest first, that fit in free slots:
// as many as the slots allow, never all of them for one slot.
func (u *unfairWake) wake(free int) { u.wakeOf("", free) }

// wakeOf is wake for the waiters of the semaphore whose meta
// key is meta (of any, if meta is ""): the members of an unfair family
// share one freed-slot channel. A notice that names a family's total
// (its f:tot key: leases left the total) wakes the waiters of every
// member of that family.
//
// A waiter awake (trying) takes a wake-up too, into its buffer: if its
// attempt is refused, it tries again at once; if granted, the wake-up is
// dropped (it was most likely for the slot that attempt took: sending it
// to a sleeping waiter instead costs a refused attempt per hold in a
// contended run, 2.3 acquire calls per hold against 1.1). A freed slot it
// announced that nobody took is found by the waiters' next wake: the
// earliest holder deadline or the fallback poll.
func (u *unfairWake) wakeOf(meta string, free int) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	for _, w := range u.list {
		if free <= 0 {
			return
		}
		if w.n > free || (meta != "" && w.e.keys.List[KeyMeta] != meta && !w.e.keys.isTotal(meta)) {
			continue
		}
		select {
		case w.events <- event{kind: evFree}:
			free -= w.n
		default: // already woken
		}
	}
}

// wakeBehind wakes the calls that wait behind w (of its engine, no attempt
// made yet), w leaving ungranted: each tries.
func (u *unfairWake) wakeBehind(w *waiter) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	for _, o := range u.list {
		if o.e == w.e && u.untried[o] {
			select {
			case o.events <- event{kind: evFree}:
			default:
			}
		}
	}
}

// behind reports whether an older local waiter of w's engine, refused as
// many slots as w wants, sleeps until a notice (none pending), and when its
// sleep ends: the oldest that fit are woken first (wakeOf), so a slot
// freed from now on that w could take goes to it. One awake (trying, or
// woken by a notice not yet taken) may leave slots free that no notice
// will announce: w tries then.
func (u *unfairWake) behind(w *waiter) (time.Time, bool) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	for _, o := range u.list {
		if o == w {
			return time.Time{}, false
		}
		if at, ok := u.sleeping[o]; ok && o.e == w.e && o.n == w.n && len(o.events) == 0 {
			return at, true
		}
	}
	return time.Time{}, false
}

// asleep records that w sleeps until a notice, or until; untried: it made
// no attempt yet.
func (u *unfairWake) asleep(w *waiter, until time.Time, untried bool) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	if u.sleeping == nil {
		u.sleeping = map[*waiter]time.Time{}
		u.untried = map[*waiter]bool{}
	}
	u.sleeping[w] = until
	if untried {
		u.untried[w] = true
	}
}

// awake records that w's sleep ended.
func (u *unfairWake) awake(w *waiter) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	delete(u.sleeping, w)
}

// trying records that w makes an attempt: it no longer waits behind
// another.
func (u *unfairWake) trying(w *waiter) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	delete(u.untried, w)
}

// takeGate makes w the waiter of its engine that waits for the rate's
// window, unless another one is; it reports whether w is (now) that one.
func (u *unfairWake) takeGate(w *waiter) bool {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	if g := u.gate[w.e]; g != nil && g != w {
		return false
	}
	if u.gate == nil {
		u.gate = map[*Engine]*waiter{}
	}
	u.gate[w.e] = w
	return true
}

// passGate ends w's wait for the rate's window, if it was the one waiting
// (granted, gone, or now held back by the slots): the next unfair waiter
// of its engine in this process is woken to try at once (the window may
// have more room, and someone must wait for it next).
func (u *unfairWake) passGate(w *waiter) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	if u.gate[w.e] == w {
		delete(u.gate, w.e)
		if i := slices.IndexFunc(u.list, func(o *waiter) bool { return o != w && o.e == w.e }); i >= 0 {
			select {
			case u.list[i].events <- event{kind: evFree}:
			default: // already woken
			}
		}
	}
}
