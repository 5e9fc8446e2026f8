package property_test

// The machines' fault layer and the checks that need it: the clients of the
// semaphores under test hold script replies and pub/sub messages back
// (redistest.Delayer) in a "storm", so that the engine's goroutines (the
// caller, the hub's message loop, the heartbeat, a lease's deadline timer)
// meet in the orders a slow network makes; actions choose holds of their
// own (renewAtDeadline, doAtDeadline, flush). After every action, the raw keys are
// checked against lua/lib_*.lua's layout (redistest.Layout.Check) and the
// leases the library reports held against each other.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"pgregory.net/rapid"
)

// stormConfig is the fault layer of the machines' clients: in a storm,
// some script replies and pub/sub reads (and the reads of one connection
// in five) are held for up to a few tens of ms; REDSEM_SOAK=1 makes storms
// heavier.
func stormConfig(seed uint64) redistest.DelayConfig {
	c := redistest.DelayConfig{Seed: seed, Replies: redistest.MatchScripts(), ReplyOdds: 0.2, ReadOdds: 0.3,
		SlowConnOdds: 0.2, Max: 20 * time.Millisecond}
	if soak() {
		c.ReplyOdds, c.ReadOdds, c.Max = 0.3, 0.5, 30*time.Millisecond
	}
	return c
}

// renewCalls selects the calls of renew.lua, however the engine makes them.
var renewCalls = redistest.MatchScript(lua.Renew.Hash(), lua.Renew.Function())

// storm switches the random holds on or off.
func (m *machine) storm(rt *rapid.T) {
	on := rapid.Bool().Draw(rt, "storm_on")
	m.delay.SetOn(on)
	rt.Logf("storm %v (held so far: %+v)", on, m.delay.Stats())
}

// checkLayout reads the semaphore's keys in one MULTI and checks them
// against the Lua library's invariants (see redistest.Layout.Check). The limit is
// not checked there: SetLimit may lower it below what live holders hold
// (checkStatus checks what was granted against the limits in force).
func (m *machine) checkLayout(rt *rapid.T) {
	ctx, cancel := m.ctx()
	defer cancel()
	l, err := redistest.ReadLayout(ctx, m.rdb, m.keys.List)
	if err != nil {
		fatalf(rt, "read the keys: %v", err)
	}
	if p := l.Check(0); !p.OK() {
		layoutFail(rt, "the keys break the Lua library's layout: ", p)
	}
}

// layoutFail logs the problems in full and fails with their kinds only: a
// message that does not change between runs, as rapid's shrinking needs.
func layoutFail(rt *rapid.T, prefix string, p redistest.LayoutProblems) {
	rt.Helper()
	rt.Log(prefix + p.String())
	fmt.Fprintln(os.Stderr, "property failed:", prefix+p.String())
	rt.Fatalf("%s%s", prefix, p.Summary())
}

// checkHeldLeases: no two leases that the library reports held (not
// ended, Err nil, Deadline ahead) share a slot. Leases granted before the
// last loss of every key are left out: that loss ended them in Redis, and
// their holders cannot know before they renew.
func (m *machine) checkHeldLeases(rt *rapid.T) {
	now := time.Now()
	owner := map[int]*entity{}
	for _, e := range m.ents {
		// Every handle: a lease's loss is one moment, its Deadline(): no
		// handle reports a lease held past it (Done open, Err nil).
		for _, f := range e.former {
			if live(f.l) && now.Sub(f.l.Deadline()) > handleSlack {
				fatalf(rt, "a former handle of %s reports the lease held %v past its Deadline()", e, now.Sub(f.l.Deadline()))
			}
		}
		l := e.lease
		if l == nil {
			continue
		}
		if live(l) && now.Sub(l.Deadline()) > handleSlack {
			fatalf(rt, "%s reports its lease held %v past its Deadline()", e, now.Sub(l.Deadline()))
		}
		if l.Token() < m.restartUs || !live(l) || !now.Before(l.Deadline()) {
			continue
		}
		for _, s := range l.Slots() {
			if o := owner[s]; o != nil {
				fatalf(rt, "%s and %s are both reported held (deadlines %v and %v ahead) and share slot %d",
					o, e, o.lease.Deadline().Sub(now), l.Deadline().Sub(now), s)
			}
			owner[s] = e
		}
	}
}

// handleSlack is how long past its Deadline() a handle may still report
// its lease held: the deadline timer's lateness on a loaded machine.
const handleSlack = 150 * time.Millisecond

// live reports whether a handle reports its lease held: Done open, Err nil.
func live(l redsem.Lease) bool {
	select {
	case <-l.Done():
		return false
	default:
	}
	return l.Err() == nil
}

// doSem is a semaphore whose Acquire is the machine's TryAcquire of a
// crash lease, so that redsem.Do runs on a lease the model knows.
type doSem struct {
	redsem.Semaphore
	acquire func() (redsem.Lease, error)
}

func (s doSem) Acquire(context.Context) (redsem.Lease, error) { return s.acquire() }

// doAtDeadline runs redsem.Do, the entry point users call, on a lease of
// the crash semaphore (crashTTL, no auto-renewal): fn works until its
// context ends, which must happen at the lease's Deadline() (plus the
// timer's lateness), with ErrLeaseLost as its cause; Do then reports the
// loss. Replies and pub/sub messages may be held meanwhile (a storm).
func (m *machine) doAtDeadline(rt *rapid.T) {
	var e *entity
	var end time.Time
	var deadline time.Time
	var cause error
	err := redsem.Do(context.Background(), doSem{Semaphore: m.crash, acquire: func() (redsem.Lease, error) {
		if e = m.tryAcquire(rt, true); e == nil {
			return nil, redsem.ErrNoSlot
		}
		return e.lease, nil
	}}, func(fctx context.Context, l redsem.Lease) error {
		select {
		case <-fctx.Done():
		case <-time.After(crashTTL + 5*time.Second):
		}
		end, deadline, cause = time.Now(), l.Deadline(), context.Cause(fctx)
		return nil
	})
	if e == nil {
		return // no slot
	}
	// Lost at its deadline: given up in Redis in the background, or it
	// expires there at its own deadline (e.death as granted).
	e.localLost, e.handleDone = true, true
	rt.Logf("Do on %s: fn's context ended %v after Deadline(): %v; Do: %v", e, end.Sub(deadline), cause, err)
	if !errors.Is(cause, redsem.ErrLeaseLost) || !errors.Is(err, redsem.ErrLeaseLost) {
		fatalf(rt, "Do on %s: fn's context ended with %v and Do returned %v, want ErrLeaseLost for both", e, cause, err)
	}
	if late := end.Sub(deadline); late > handleSlack {
		fatalf(rt, "Do on %s: fn's context ended %v after the lease's Deadline()", e, late)
	}
}

// renewAtDeadline renews a lease of the crash semaphore (crashTTL, no
// auto-renewal) a few ms before its local deadline, with the renewal's
// reply held past that deadline: the lease's deadline timer fires while
// the renewal, which ran in Redis in time, is on its way back. The lease
// gives itself up at the deadline (released in Redis at once). Renew may
// report the lease lost, but if it reports it renewed, the lease must be
// held: not ended, and listed by Redis.
func (m *machine) renewAtDeadline(rt *rapid.T) {
	lead := time.Duration(rapid.SampledFrom([]int{1, 3, 6}).Draw(rt, "renew_lead_ms")) * time.Millisecond
	hold := time.Duration(rapid.SampledFrom([]int{10, 30, 60}).Draw(rt, "renew_hold_ms")) * time.Millisecond
	var cands []*entity
	for _, e := range m.held() {
		if e.ttl == crashTTL.Milliseconds() && !e.localLost && time.Until(e.lease.Deadline()) > lead+2*time.Millisecond {
			cands = append(cands, e)
		}
	}
	var e *entity
	if len(cands) > 0 {
		e = cands[rapid.IntRange(0, len(cands)-1).Draw(rt, "renew_lease")]
	} else if e = m.tryAcquire(rt, true); e == nil {
		return // no slot for a new one
	}
	time.Sleep(time.Until(e.lease.Deadline().Add(-lead)))
	m.delay.HoldNext(renewCalls, hold)
	w, err := m.renewOne(rt, e)
	m.delay.DropHolds() // unused if Renew answered without Redis
	rt.Logf("renewed %s %v before its deadline, reply held %v: %v", e, lead, hold, err)
	if err != nil {
		return
	}
	// Renewed during w: Redis keeps it until at least w.b + crashTTL.
	ctx, cancel := m.ctx()
	defer cancel()
	_, zerr := m.rdb.ZScore(ctx, m.keys.List[core.KeyHolders], e.id).Result()
	ended := false
	select {
	case <-e.lease.Done():
		ended = true
	default:
	}
	lerr := e.lease.Err()
	if callEnd() >= e.death.lo-guard {
		return // too late to tell (a stalled machine)
	}
	switch {
	case errors.Is(zerr, redis.Nil):
		fatalf(rt, "Renew of %s returned nil (call at [%d,%d]), yet Redis has no holder entry for it: it was released while the renewal's reply was on its way (lease ended %v, Err %v)", e, w.b, w.a, ended, lerr)
	case zerr != nil:
		fatalf(rt, "holder entry of %s: %v", e, zerr)
	case ended || lerr != nil:
		fatalf(rt, "Renew of %s returned nil (call at [%d,%d]), yet the lease ended at once (Err %v)", e, w.b, w.a, lerr)
	}
}
