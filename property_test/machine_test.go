package property_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
	"pgregory.net/rapid"
)

const (
	normalTTL  = 10 * time.Second       // leases that end only by release or restart
	crashTTL   = 80 * time.Millisecond  // leases whose holder never renews (a crashed holder)
	queueTTL   = 3 * time.Second        // live waiters' session TTL
	fallback   = 100 * time.Millisecond // waiters ask Redis at least this often
	rawQueueMs = 120                    // a raw (dead) remote waiter's session TTL
	rawLeaseMs = 150                    // the lease a raw waiter asks for
	maxPending = 5                      // live waiters at once
	waitBound  = 5 * time.Second        // bound on every wait for a condition
	leakMargin = 1000 + 200             // the Lua library's MARGIN_MS plus slack, ms
	recordLife = 15 * time.Second       // the Lua library's TOMB_MS: release and cancellation records
	pruneEvery = 1000                   // ms: the Lua library's prune step runs at most this often
)

func TestUnfairStateMachine(t *testing.T) { runMachine(t, false) }
func TestFairStateMachine(t *testing.T)   { runMachine(t, true) }

// machineSkip returns the actions named in REDSEM_MACHINE_SKIP (comma
// separated), which the machines leave out: to look past a known bug that
// one kind of action finds first (e.g. "renew,renewAtDeadline").
func machineSkip() map[string]bool {
	out := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("REDSEM_MACHINE_SKIP"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out[s] = true
		}
	}
	return out
}

// runMachine runs rapid's state machine against one dedicated redis-server,
// reused by every check with a fresh semaphore name per check.
func runMachine(t *testing.T, isFair bool) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	checks, began := 0, time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		trace("%s: check %d at %.1fs", t.Name(), checks, time.Since(began).Seconds())
		m := newMachine(t, rt, srv, rdb, isFair)
		defer m.stop()
		actions := map[string]func(*rapid.T){
			"":                m.check,
			"tryAcquire":      func(rt *rapid.T) { m.tryAcquire(rt, false) },
			"tryAcquireCrash": func(rt *rapid.T) { m.tryAcquire(rt, true) },
			"acquireShort":    m.acquireShort,
			"release":         m.release,
			"releaseTwice":    m.releaseTwice,
			"releaseTogether": m.releaseTogether,
			"releaseFails":    m.releaseFails,
			"renew":           m.renew,
			"sleep":           m.sleep,
			"setLimit":        m.setLimit,
			"restart":         m.restart,
			"flush":           m.flush,
			"tryAtEdge":       m.tryAtEdge,
			"renewAtDeadline": m.renewAtDeadline,
			"doAtDeadline":    m.doAtDeadline,
			"storm":           m.storm,
			"resume":          m.resume,
		}
		if isFair {
			actions["enqueue"] = m.enqueue
			actions["enqueueDead"] = m.enqueueDead
			actions["cancel"] = m.cancelWaiter
		} else {
			actions["acquireBehind"] = m.acquireBehind
		}
		for name := range machineSkip() {
			delete(actions, name)
		}
		rt.Repeat(actions)
		m.drainAndCheckLeak(rt)
	})
}

// machine drives one semaphore name and its model.
type machine struct {
	t    *testing.T
	fair bool
	srv  *redistest.Server
	rdb  *redis.Client
	name string
	keys core.Keys

	base  int // the limit the clients were built with
	limit int // the limit in force
	// rate: the clients' Options.Rate (zero in half the checks); grants
	// lists every grant observed since the last restart (which loses the
	// window), for the rate's invariant.
	rate   redsem.Rate
	grants []*entity

	norm  redsem.Semaphore // normalTTL, no auto-renew; its Acquire queues live waiters
	crash redsem.Semaphore // crashTTL, no auto-renew: holders that stop renewing
	// other is another process's semaphore of the name (its own client,
	// without the fault layer; normalTTL, no auto-renew): the resume
	// action hands leases to it.
	other redsem.Semaphore
	close func()
	// delay is the fault layer on cli, the client of norm and crash (rdb,
	// the test's own client, has none): random holds of script replies and
	// of pub/sub messages while it is on (a "storm", drawn per check and
	// switched by the storm action), and the holds that actions choose.
	delay *redistest.Delayer
	cli   *redis.Client

	ents        []*entity
	byID        map[string]*entity
	maxToken    int64 // highest token observed so far
	nextArrival int
	counter     int
	lastWrite   int64 // start of the last call that ran expire() and admit()
	lastPrune   int64 // start of the last call that ran prune() when due (acquire, release, heartbeat)
	restartUs   int64 // µs of the last loss of every key (restart, flush); earlier tokens are lost
}

func newMachine(t *testing.T, rt *rapid.T, srv *redistest.Server, rdb *redis.Client, isFair bool) *machine {
	m := &machine{t: t, fair: isFair, srv: srv, rdb: rdb, name: redistest.Name(t), byID: map[string]*entity{}}
	m.base = rapid.IntRange(1, 3).Draw(rt, "limit")
	m.limit = m.base
	m.keys = core.KeysFor(core.DefaultPrefix, m.name)
	if rapid.Bool().Draw(rt, "rated") {
		// Few and short windows, so that the rate binds often within a
		// check: weights up to the rate's limit, periods a few actions long.
		m.rate = redsem.Rate{
			Limit: rapid.IntRange(2, 5).Draw(rt, "rate_limit"),
			Per:   time.Duration(rapid.SampledFrom([]int{200, 350, 500}).Draw(rt, "rate_per_ms")) * time.Millisecond,
		}
	}
	m.delay = redistest.NewDelayer(stormConfig(rapid.Uint64().Draw(rt, "delay_seed")))
	m.delay.SetOn(rapid.IntRange(0, 2).Draw(rt, "storm_die") == 0) // a third of the checks start stormy
	m.cli = m.delay.NewClient(srv.Options())
	cli := m.cli
	oc := redis.NewClient(srv.Options()) // the other process's client
	var err error
	if isFair {
		var a, b *fair.Semaphore
		a, err = fair.New(cli, m.name, m.base, fair.Options{LeaseTTL: normalTTL, QueueTTL: queueTTL,
			DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		if err == nil {
			b, err = fair.New(cli, m.name, m.base, fair.Options{LeaseTTL: crashTTL, QueueTTL: queueTTL,
				DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		}
		m.norm, m.crash = a, b
		m.close = func() { _ = a.Close(); _ = b.Close(); _ = cli.Close() }
		if err == nil {
			m.other, err = fair.New(oc, m.name, m.base, fair.Options{LeaseTTL: normalTTL, QueueTTL: queueTTL,
				DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		}
	} else {
		var a, b *unfair.Semaphore
		a, err = unfair.New(cli, m.name, m.base, unfair.Options{LeaseTTL: normalTTL,
			DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		if err == nil {
			b, err = unfair.New(cli, m.name, m.base, unfair.Options{LeaseTTL: crashTTL,
				DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		}
		m.norm, m.crash = a, b
		m.close = func() { _ = a.Close(); _ = b.Close(); _ = cli.Close() }
		if err == nil {
			m.other, err = unfair.New(oc, m.name, m.base, unfair.Options{LeaseTTL: normalTTL,
				DisableAutoRenew: true, FallbackInterval: fallback, Rate: m.rate})
		}
	}
	if err != nil {
		_ = cli.Close()
		_ = oc.Close()
		fatalf(rt, "new: %v", err)
	}
	closeMain := m.close
	m.close = func() {
		closeMain()
		_ = m.other.Close()
		_ = oc.Close()
	}
	return m
}

// limitArg is ARGV[3] of a raw script call by a client of the machine's
// limit and rate (the Lua library's client_arg).
func (m *machine) limitArg() any {
	if m.rate.IsZero() {
		return m.base
	}
	return fmt.Sprintf("%d:%d:%d", m.base, m.rate.Limit, m.rate.Per.Milliseconds())
}

// maxWeight is the largest weight a request may have: the limit in force,
// and the rate's limit if there is a rate.
func (m *machine) maxWeight() int {
	if !m.rate.IsZero() {
		return min(m.limit, m.rate.Limit)
	}
	return m.limit
}

// checkRate asserts the rate's invariant on the grants observed since the
// last restart: no window of length Per holds more than Limit granted
// slots. Grant times are the tokens (server µs, never below the server
// clock at the grant; a window (t - Per, t] ending at a grant's token is
// the one that matters, each holding the grants with tokens in it).
func (m *machine) checkRate(rt *rapid.T) {
	if m.rate.IsZero() {
		return
	}
	per := m.rate.Per.Microseconds()
	for _, g := range m.grants {
		sum := 0
		var in []string
		for _, o := range m.grants {
			if o.token > g.token-per && o.token <= g.token {
				sum += o.weight
				in = append(in, fmt.Sprintf("%s(%d)@%d", o.label, o.weight, o.token))
			}
		}
		if sum > m.rate.Limit {
			fatalf(rt, "rate %v: the window (%d, %d] µs holds %d granted slots: %v", m.rate, g.token-per, g.token, sum, in)
		}
	}
}

// windowMayHold is how many slots may count in the rate's window of a
// script that ran at server ms at or after from: every grant observed with
// a token in the period before from, and every grant that may have been
// made and not observed yet (a queued waiter's, but for the ids in
// queued: waiters that a Status read after from lists as still queued).
func (m *machine) windowMayHold(from int64, queued map[string]bool) int {
	per := m.rate.Per.Microseconds()
	sum := 0
	for _, e := range m.ents {
		switch {
		case e.granted:
			if e.token > from*1000-per && e.token >= m.restartUs {
				sum += e.weight
			}
		case e.gone:
			// Gone without being seen granted, it may have been granted
			// before it went, as late as grantedBy.
			if e.grantedBy*1000 > from*1000-per && e.grantedBy*1000 >= m.restartUs {
				sum += e.weight
			}
		case queued[e.id]:
		case e.kind == kRaw || (e.kind == kGo && e.pending):
			sum += e.weight
		}
	}
	return sum
}

func (m *machine) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (m *machine) add(e *entity, prefix string) {
	m.counter++
	e.label = fmt.Sprintf("%s%d", prefix, m.counter)
	m.ents = append(m.ents, e)
	if e.id != "" {
		m.byID[e.id] = e
	}
}

// counts returns how many slots (the sum of the weights) are certainly held
// throughout w and how many may be held at its start, and whether the fair
// queue is certainly empty.
func (m *machine) counts(w window) (certain, possible int, queueEmpty bool) {
	queueEmpty = true
	for _, e := range m.ents {
		c, p := e.holds(w)
		if c {
			certain += e.weight
		}
		if p {
			possible += e.weight
		}
		if e.mayQueue(w) {
			queueEmpty = false
		}
	}
	return
}

// granted records the slots granted to e, checking its token and slots:
// as many as its weight, ascending, below the limit, and none of them held
// by another live lease.
func (m *machine) granted(rt *rapid.T, e *entity, slots []int, token int64, w window) {
	if e.granted {
		if !slices.Equal(e.slots, slots) || e.token != token {
			fatalf(rt, "%s: Redis says slots %v token %d, earlier slots %v token %d", e.label, slots, token, e.slots, e.token)
		}
		return
	}
	if token <= e.floor {
		fatalf(rt, "%s: token %d is not above %d, a token issued before it", e.label, token, e.floor)
	}
	if len(slots) != e.weight {
		fatalf(rt, "%s: granted %d slots %v for weight %d", e.label, len(slots), slots, e.weight)
	}
	for i, slot := range slots {
		if slot < 0 || slot >= e.limitAt {
			fatalf(rt, "%s: slot %d outside [0, %d)", e.label, slot, e.limitAt)
		}
		if i > 0 && slots[i-1] >= slot {
			fatalf(rt, "%s: slots %v not ascending", e.label, slots)
		}
	}
	for _, o := range m.ents {
		if o == e || !o.granted {
			continue
		}
		for _, slot := range slots {
			if slices.Contains(o.slots, slot) {
				if c, _ := o.holds(w); c {
					fatalf(rt, "%s: slot %d is also held by live %s", e.label, slot, o)
				}
			}
		}
	}
	e.granted, e.slots, e.token = true, slices.Clone(slots), token
	m.maxToken = max(m.maxToken, token)
	m.grants = append(m.grants, e)
	m.checkRate(rt)
}

// takeLease records a lease that Acquire or TryAcquire returned during w.
func (m *machine) takeLease(rt *rapid.T, l redsem.Lease, n int, ttl time.Duration, floor int64, w window, arrival int) *entity {
	sem := m.norm
	if ttl == crashTTL {
		sem = m.crash
	}
	e := &entity{kind: kLease, id: l.ID(), lease: l, sem: sem, weight: n, ttl: ttl.Milliseconds(), floor: floor,
		limitAt: m.limit, arrival: arrival}
	e.death = after(w, e.ttl)
	if m.fair {
		// A grant made while Acquire queued lasts until the earlier of grant
		// + TTL and the queue session's deadline (until its first renewal);
		// the Deadline the lease reports is never later than Redis's.
		e.death.lo = min(e.death.lo, l.Deadline().UnixMilli())
	}
	m.add(e, "L")
	m.granted(rt, e, l.Slots(), l.Token(), w)
	if l.Slot() != l.Slots()[0] {
		fatalf(rt, "%s: Slot() %d is not Slots()[0]", e, l.Slot())
	}
	rt.Logf("%s granted at [%d,%d], deadline %v", e, w.b, w.a, e.death)
	return e
}

// noJump checks that a newcomer e, granted during w, jumped nobody: every
// waiter that was certainly queued before it must have been granted first.
func (m *machine) noJump(rt *rapid.T, e *entity, w window) {
	if !m.fair {
		return
	}
	for _, o := range m.ents {
		if o == e || o.gone || o.arrival < 0 || o.arrival > e.arrival {
			continue
		}
		switch o.kind {
		case kGo:
			if o.pending && !o.granted {
				m.await(rt, o)
			}
			if o.gone || !o.granted {
				continue
			}
		case kRaw:
			if !o.death.aliveThroughout(w) {
				continue
			}
			if !o.granted {
				ctx, cancel := m.ctx()
				slots, token, ok, err := m.leaseRecord(ctx, o.id)
				cancel()
				checkNow := callStart()
				if err != nil {
					fatalf(rt, "lease record: %v", err)
				}
				if !ok {
					if o.death.lo-guard > checkNow {
						fatalf(rt, "%s was granted although live waiter %s, queued before it, is still waiting", e, o)
					}
					continue
				}
				m.granted(rt, o, slots, token, window{w.b, checkNow})
			}
		default:
			continue
		}
		if o.token >= e.token {
			fatalf(rt, "%s jumped the queue: %s, queued before it, got the later token", e, o)
		}
	}
}

// leaseRecord reads the lease that Redis keeps for id, held or expired but
// not yet removed: its meta record "L|token|slots|owner" (see lua/lib_*.lua).
// ok is false when id has no lease record (queued, evicted or gone).
func (m *machine) leaseRecord(ctx context.Context, id string) (slots []int, token int64, ok bool, err error) {
	v, err := m.rdb.HGet(ctx, m.keys.List[core.KeyMeta], id).Result()
	if errors.Is(err, redis.Nil) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	f := strings.Split(v, "|")
	if f[0] != "L" {
		return nil, 0, false, nil
	}
	if len(f) < 4 {
		return nil, 0, false, fmt.Errorf("bad lease record %q of %s", v, id)
	}
	if token, err = strconv.ParseInt(f[1], 10, 64); err != nil {
		return nil, 0, false, fmt.Errorf("bad lease record %q of %s: %v", v, id, err)
	}
	for _, x := range strings.Split(f[2], ",") {
		slot, err := strconv.Atoi(x)
		if err != nil {
			return nil, 0, false, fmt.Errorf("bad lease record %q of %s: %v", v, id, err)
		}
		slots = append(slots, slot)
	}
	return slots, token, true, nil
}

// await waits (bounded) for a live waiter's Acquire to return.
func (m *machine) await(rt *rapid.T, e *entity) {
	select {
	case r := <-e.result:
		m.settle(rt, e, r)
	case <-time.After(waitBound):
		fatalf(rt, "%s: Acquire still waiting after %v although it should have been granted", e.label, waitBound)
	}
}

// settle records what a live waiter's Acquire returned.
func (m *machine) settle(rt *rapid.T, e *entity, r goResult) {
	e.pending = false
	if r.err != nil {
		e.endErr = r.err.Error()
		if e.weightOut && errors.Is(r.err, redsem.ErrWeight) {
			e.gone = true // the limit fell below its weight: it left the queue
			return
		}
		if !e.cancelled {
			fatalf(rt, "%s: Acquire failed: %v", e, r.err)
		}
		if !errors.Is(r.err, context.Canceled) {
			fatalf(rt, "%s: cancelled Acquire returned %v, want context.Canceled", e.label, r.err)
		}
		e.gone = true
		e.grantedBy = callEnd() // a grant that the undo took back still counts in the window
		return
	}
	e.cancelled = false // it won the race with its cancel: a lease like any other
	if e.id == "" {
		e.id = r.l.ID()
		m.byID[e.id] = e
	} else if e.id != r.l.ID() {
		fatalf(rt, "%s: lease id %s, waiter id %s", e.label, r.l.ID(), e.id)
	}
	e.lease, e.sem = r.l, m.norm
	e.ttl = normalTTL.Milliseconds()
	if r.l.Token() < m.restartUs {
		if e.requeued {
			// Redis listed it again after the data loss (queued, or
			// granted since): only a grant made since may answer it.
			fatalf(rt, "%s: Acquire returned a grant from before the data loss (token %d, slots %v; the loss came at %d µs) after it had queued again", e.label, r.l.Token(), r.l.Slots(), m.restartUs)
		}
		// Granted before the last restart and returned after it: lost.
		trace("%s returned a grant from before the data loss, before it queued again", e.label)
		e.death = span{}
		e.granted, e.slots, e.token = true, r.l.Slots(), r.l.Token()
		return
	}
	now := callEnd()
	e.death = span{e.launched + e.ttl, now + e.ttl} // granted between its launch and now
	// A grant made while it queued lasts until the earlier of grant + TTL
	// and its queue session's deadline (until its first renewal); the
	// Deadline the lease reports is never later than Redis's.
	e.death.lo = min(e.death.lo, r.l.Deadline().UnixMilli())
	m.granted(rt, e, r.l.Slots(), r.l.Token(), window{now, now})
	rt.Logf("%s returned a lease", e)
}

// collect records every live waiter's Acquire that has returned.
func (m *machine) collect(rt *rapid.T) {
	for _, e := range m.ents {
		if e.kind == kGo && e.pending {
			select {
			case r := <-e.result:
				m.settle(rt, e, r)
			default:
			}
		}
	}
}

// check runs after every action: Status against the model (checkStatus),
// the raw keys against lua/lib_*.lua's layout (checkLayout), and the leases
// the library reports held against each other (checkHeldLeases).
func (m *machine) check(rt *rapid.T) {
	m.checkStatus(rt)
	m.checkLayout(rt)
	m.checkHeldLeases(rt)
}

// checkStatus compares Redis's Status with the model.
func (m *machine) checkStatus(rt *rapid.T) {
	m.collect(rt)
	ctx, cancel := m.ctx()
	defer cancel()
	b := callStart()
	st, err := m.norm.Status(ctx)
	w := window{b, callEnd()}
	if err != nil {
		fatalf(rt, "status: %v", err)
	}
	if st.Limit != m.limit {
		fatalf(rt, "status limit %d, model %d", st.Limit, m.limit)
	}
	if st.Rate != m.rate || st.RateGranted > m.rate.Limit {
		fatalf(rt, "status rate %v, %d granted in the window; model rate %v", st.Rate, st.RateGranted, m.rate)
	}
	hs := slices.Clone(st.Holders)
	slices.SortFunc(hs, func(x, y redsem.Holder) int { return int(x.Token - y.Token) })
	slots := map[int]string{}
	heldSum := 0 // the weights of the holders listed so far (smaller tokens)
	for i, h := range hs {
		e := m.byID[h.ID]
		if e == nil {
			fatalf(rt, "unknown holder %s (slots %v token %d): a cancelled or failed acquire left slots behind", h.ID, h.Slots, h.Token)
		}
		if e.gone {
			fatalf(rt, "%s was released or cancelled but still holds slots %v", e, h.Slots)
		}
		if e.lease != nil && !e.death.mayBeAliveAt(w) {
			fatalf(rt, "%s expired (deadline %v) or was lost, but Status lists it at [%d,%d]", e, e.death, w.b, w.a)
		}
		if len(h.Slots) == 0 || h.Slot != h.Slots[0] {
			fatalf(rt, "%s: Status shows Slot %d, Slots %v", e, h.Slot, h.Slots)
		}
		m.granted(rt, e, h.Slots, h.Token, w)
		if i > 0 && hs[i-1].Token == h.Token {
			fatalf(rt, "two holders share token %d", h.Token)
		}
		for _, slot := range h.Slots {
			if o, dup := slots[slot]; dup {
				fatalf(rt, "slot %d held by %s and %s", slot, o, e)
			}
			slots[slot] = e.String()
		}
		// The holders with smaller tokens are live now, so they were live
		// when e was granted: with e, their weights summed to heldSum+weight.
		if heldSum+e.weight > e.limitAt {
			fatalf(rt, "%s was granted while %d slots were held by live holders (limit %d): %v", e, heldSum, e.limitAt, describe(m, hs))
		}
		heldSum += e.weight
	}
	m.checkDeadlines(rt, hs, w)
	if !m.fair {
		if len(st.Waiters) > 0 {
			fatalf(rt, "unfair semaphore lists waiters %v", st.Waiters)
		}
		return
	}
	// Fair: waiters are known, not cancelled, in arrival order.
	last := -1
	minQueued := int(^uint(0) >> 1)
	for _, wt := range st.Waiters {
		e := m.byID[wt.ID]
		if e == nil {
			fatalf(rt, "unknown waiter %s at position %d: a cancelled Acquire left its queue entry", wt.ID, wt.Position)
		}
		if e.gone || e.cancelled {
			why := "was released or left"
			switch {
			case e.endErr != "":
				why = "left (its Acquire returned: " + e.endErr + ")"
			case e.cancelled:
				why = "was cancelled"
			}
			fatalf(rt, "waiter %s %s but is still queued at position %d", e, why, wt.Position)
		}
		if e.lease != nil {
			fatalf(rt, "%s holds a lease but is still queued", e)
		}
		if wt.Weight != e.weight {
			fatalf(rt, "%s queued with weight %d, asked for %d", e, wt.Weight, e.weight)
		}
		if e.arrival >= 0 {
			if e.arrival < last {
				fatalf(rt, "queue order %v disagrees with arrival order", describeW(m, st.Waiters))
			}
			last = e.arrival
			minQueued = min(minQueued, e.arrival)
		}
	}
	// Admissions in queue order: nobody who arrived after a live queued
	// waiter holds a slot.
	for _, h := range hs {
		if e := m.byID[h.ID]; e.arrival > minQueued {
			fatalf(rt, "%s holds a slot although it arrived after a waiter still queued: %v", e, describeW(m, st.Waiters))
		}
	}
	// Granted waiters got their tokens in arrival order.
	var ws []*entity
	for _, e := range m.ents {
		if e.granted && e.arrival >= 0 {
			ws = append(ws, e)
		}
	}
	slices.SortFunc(ws, func(x, y *entity) int { return x.arrival - y.arrival })
	for i := 1; i < len(ws); i++ {
		if ws[i].token < ws[i-1].token {
			fatalf(rt, "admissions out of queue order: %s arrived before %s but got a later token", ws[i-1], ws[i])
		}
	}
	// The head waiter never waits while as many slots as it wants are free,
	// unless a holder may have ended after the last script that admits ran
	// (then a heartbeat admits).
	// With a rate the head may also wait for room in the window: while it
	// may have been full recently (the waiter's process beats when the
	// window has room; guard covers the timer's delay).
	queued := map[string]bool{}
	for _, wt := range st.Waiters {
		queued[wt.ID] = true
	}
	if len(st.Waiters) > 0 && heldSum+st.Waiters[0].Weight <= st.Limit &&
		(m.rate.IsZero() || m.windowMayHold(w.b-guard, queued)+st.Waiters[0].Weight <= m.rate.Limit) {
		maybe := 0
		for _, e := range m.ents {
			if !e.gone && (e.granted || e.kind == kRaw) && e.death.endsWithin(m.lastWrite, w.a) {
				maybe += e.weight
			}
		}
		if heldSum+maybe+st.Waiters[0].Weight <= st.Limit {
			fatalf(rt, "waiters %v wait (the head for %d) while %d of %d slots are held", describeW(m, st.Waiters), st.Waiters[0].Weight, heldSum, st.Limit)
		}
	}
	// Dead waiters are evicted by the first script that prunes (at most once
	// a second: acquire, release, heartbeat) a second after they die, or
	// sooner by admit at the head; their grants end with the next script.
	for _, e := range m.ents {
		if e.kind == kRaw && e.death.hi+pruneEvery+guard <= m.lastPrune && e.death.hi > 0 {
			if _, err := m.rdb.ZScore(ctx, m.keys.List[core.KeyQueue], e.id).Result(); !errors.Is(err, redis.Nil) {
				fatalf(rt, "dead waiter %s (session ended by %d) still in the queue after a script pruned at %d (err %v)", e, e.death.hi, m.lastPrune, err)
			}
		}
		if e.kind == kRaw && e.death.hi+guard <= m.lastWrite && e.death.hi > 0 {
			if _, err := m.rdb.ZScore(ctx, m.keys.List[core.KeyHolders], e.id).Result(); !errors.Is(err, redis.Nil) {
				fatalf(rt, "dead waiter %s (its lease or session ended by %d) still holds a slot after a script ran at %d (err %v)", e, e.death.hi, m.lastWrite, err)
			}
		}
	}
}

// checkDeadlines checks that Lease.Deadline is never late: a lease that
// Redis no longer lists during w (and that no release or restart ended) must
// report a Deadline no later than the end of w.
func (m *machine) checkDeadlines(rt *rapid.T, hs []redsem.Holder, w window) {
	listed := map[string]bool{}
	for _, h := range hs {
		listed[h.ID] = true
	}
	for _, e := range m.ents {
		if e.lease == nil || e.gone || e.death == (span{}) || listed[e.id] {
			continue
		}
		if d := e.lease.Deadline().UnixMilli(); d > w.a {
			fatalf(rt, "%s is gone from Redis before the Deadline its lease reports: gone at [%d,%d], deadline %d", e, w.b, w.a, d)
		}
	}
}

func describe(m *machine, hs []redsem.Holder) string {
	var s []string
	for _, h := range hs {
		s = append(s, m.byID[h.ID].String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

func describeW(m *machine, ws []redsem.Waiter) string {
	var s []string
	for _, w := range ws {
		if e := m.byID[w.ID]; e != nil {
			s = append(s, fmt.Sprintf("%s#%d", e.label, e.arrival))
		} else {
			s = append(s, w.ID)
		}
	}
	return "[" + strings.Join(s, " ") + "]"
}

// drawWeight draws the n of an AcquireN or TryAcquireN: in [1, limit], or
// (over, one draw in ten) limit+1, which must fail with ErrWeight and
// leave nothing in Redis (check finds any holder or waiter it does not
// know).
func (m *machine) drawWeight(rt *rapid.T) (n int, over bool) {
	if rapid.IntRange(0, 9).Draw(rt, "over_die") == 9 { // shrinks away from it
		return m.limit + 1, true
	}
	return rapid.IntRange(1, m.maxWeight()).Draw(rt, "weight"), false
}

// tryAcquire: one TryAcquireN, by a holder that renews (never expires) or
// one that crashes (never renews, crashTTL). It returns the lease's entity,
// or nil if none was granted.
func (m *machine) tryAcquire(rt *rapid.T, crash bool) *entity {
	sem, ttl := m.norm, normalTTL
	if crash {
		sem, ttl = m.crash, crashTTL
	}
	n, over := m.drawWeight(rt)
	ctx, cancel := m.ctx()
	defer cancel()
	floor := m.maxToken
	w := window{b: callStart()}
	l, err := sem.TryAcquireN(ctx, n)
	w.a = callEnd()
	m.lastPrune = w.b
	if over {
		// acquire.lua refuses n above the limit before it admits anyone:
		// no lastWrite.
		if !errors.Is(err, redsem.ErrWeight) {
			fatalf(rt, "TryAcquireN(%d) with limit %d: %v, want ErrWeight", n, m.limit, err)
		}
		return nil
	}
	m.lastWrite = w.b
	certain, possible, queueEmpty := m.counts(w)
	var rl *redsem.RateLimitedError
	if errors.As(err, &rl) {
		// Refused by the rate: a slot was free, nobody queued, and the
		// window was full when the script ran. RetryAfter may pass Per by
		// a millisecond: the window keeps grants at their tokens, which run
		// a few µs ahead of the server clock when grants share a µs, and
		// RetryAfter is rounded up to whole ms.
		if m.rate.IsZero() || rl.Rate != m.rate || rl.RetryAfter < 0 || rl.RetryAfter > m.rate.Per+time.Millisecond ||
			!errors.Is(err, redsem.ErrRateLimited) || !errors.Is(err, redsem.ErrNoSlot) {
			fatalf(rt, "TryAcquireN(%d) refused by rate %v: %v (RetryAfter %v; model rate %v)", n, rl.Rate, err, rl.RetryAfter, m.rate)
		}
		if held := m.windowMayHold(w.b, nil); held+n <= m.rate.Limit {
			fatalf(rt, "TryAcquireN(%d) refused by the rate although at most %d slots were granted in the %v before", n, held, m.rate.Per)
		}
		rt.Logf("TryAcquireN(%d): rate limited, retry after %v", n, rl.RetryAfter)
		return nil
	}
	if err != nil {
		if !errors.Is(err, redsem.ErrNoSlot) {
			fatalf(rt, "TryAcquireN(%d): %v", n, err)
		}
		if possible+n <= m.limit && queueEmpty {
			fatalf(rt, "TryAcquireN(%d) refused although at most %d of %d slots may be held and nobody queues", n, possible, m.limit)
		}
		rt.Logf("TryAcquireN(%d): no slot (%d..%d of %d held)", n, certain, possible, m.limit)
		return nil
	}
	if certain+n > m.limit {
		fatalf(rt, "TryAcquireN(%d) granted slots %v token %d although %d of %d slots are certainly held", n, l.Slots(), l.Token(), certain, m.limit)
	}
	e := m.takeLease(rt, l, n, ttl, floor, w, m.arrive())
	m.noJump(rt, e, w)
	return e
}

// tryAtEdge (with a rate): when the window is full, a TryAcquire timed
// just before its oldest grant leaves it (0.7 ms before, by the tokens):
// the window must still refuse it. A window that lets grants go a little
// early passes every other action, which comes at random times.
func (m *machine) tryAtEdge(rt *rapid.T) {
	if m.rate.IsZero() {
		rt.Skip("no rate")
	}
	per := m.rate.Per.Microseconds()
	now := time.Now().UnixMicro()
	var in []*entity
	sum := 0
	for _, g := range m.grants {
		if g.token > now-per {
			in = append(in, g)
			sum += g.weight
		}
	}
	if sum < m.rate.Limit {
		rt.Skip("the window has room")
	}
	slices.SortFunc(in, func(x, y *entity) int { return int(x.token - y.token) })
	// The oldest grant whose leaving makes room for one slot.
	edge, left := int64(0), sum
	for _, g := range in {
		left -= g.weight
		if left < m.rate.Limit {
			edge = g.token + per
			break
		}
	}
	d := time.Duration(edge-700-time.Now().UnixMicro()) * time.Microsecond
	if d < 0 {
		rt.Skip("too late")
	}
	time.Sleep(d)
	m.tryAcquire(rt, false)
}

func (m *machine) arrive() int {
	if !m.fair {
		return -1
	}
	m.nextArrival++
	return m.nextArrival
}

// acquireShort: a blocking AcquireN with a short deadline.
func (m *machine) acquireShort(rt *rapid.T) {
	// Few, far apart values: shrinking cannot creep to a borderline timing.
	d := time.Duration(rapid.SampledFrom([]int{10, 60}).Draw(rt, "deadline_ms")) * time.Millisecond
	n, over := m.drawWeight(rt)
	if over {
		ctx, cancel := m.ctx()
		defer cancel()
		b := callStart()
		_, err := m.norm.AcquireN(ctx, n)
		m.lastPrune = b // refused before admit ran: no lastWrite
		if !errors.Is(err, redsem.ErrWeight) {
			fatalf(rt, "AcquireN(%d) with limit %d: %v, want ErrWeight", n, m.limit, err)
		}
		return
	}
	floor := m.maxToken
	arrival := m.arrive()
	b := callStart()
	_, possible, queueEmpty := m.counts(window{b, b})
	mustSucceed := possible+n <= m.limit && queueEmpty &&
		(m.rate.IsZero() || m.windowMayHold(b, nil)+n <= m.rate.Limit)
	if mustSucceed {
		// A slot is free now: the call must get it. It gets a generous
		// bound, so that a stall of this busy machine is not taken for a
		// failure (speed is not what this test measures).
		d = waitBound
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	w := window{b: b}
	l, err := m.norm.AcquireN(ctx, n)
	w.a = callEnd()
	if err != nil {
		// No lastWrite: the deadline may have ended before any script ran.
		if !errors.Is(err, context.DeadlineExceeded) {
			fatalf(rt, "AcquireN(%d): %v, want an error matching context.DeadlineExceeded", n, err)
		}
		if mustSucceed {
			fatalf(rt, "AcquireN(%d) timed out after %v although at most %d of %d slots were held and nobody queued (%v)", n, d, possible, m.limit, err)
		}
		rt.Logf("AcquireN(%d, %v): timed out", n, d)
		m.awaitUndo(rt)
		// It may have been granted before its undo took the grant back:
		// that grant still counts in the rate's window.
		m.add(&entity{kind: kLease, weight: n, gone: true, grantedBy: callEnd(), arrival: -1}, "T")
		return
	}
	m.lastWrite, m.lastPrune = w.b, w.b // its first attempt ran after b
	certain, _, _ := m.counts(w)
	if certain+n > m.limit {
		fatalf(rt, "AcquireN(%d) granted slots %v token %d although %d of %d slots are certainly held throughout", n, l.Slots(), l.Token(), certain, m.limit)
	}
	e := m.takeLease(rt, l, n, normalTTL, floor, w, arrival)
	m.noJump(rt, e, w)
}

// acquireBehind (unfair): k callers of one process Acquire a slot each at
// once, so that the later ones may wait behind an earlier one (a caller
// that finds an older waiter of its process asleep for as many slots sleeps
// behind it without trying, and is woken when that one is granted or
// gives up); the leases the machine holds are released back to back (two
// freed-slot notices in a row, the second perhaps landing on a waiter
// whose attempt is already granted); each caller, once granted, holds its
// lease a moment and releases it. Each grant is checked as any other (slots
// nobody holds, within the limit and the rate), and every caller must be
// granted within waitBound unless something the machine cannot release
// may hold every slot that long.
func (m *machine) acquireBehind(rt *rapid.T) {
	if rapid.IntRange(0, 2).Draw(rt, "behind_die") != 0 {
		rt.Skip("acquireBehind is slow (a rate's window, crashed holders' deadlines): a third of the draws")
	}
	k := rapid.IntRange(2, 3).Draw(rt, "callers")
	hold := time.Duration(rapid.SampledFrom([]int{0, 2}).Draw(rt, "hold_ms")) * time.Millisecond
	releaseHeld := rapid.Bool().Draw(rt, "release_held")
	floor := m.maxToken
	b := callStart()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	ctx, stop := context.WithCancel(ctx) // ended early when a caller may not be granted
	defer stop()
	type result struct {
		l   redsem.Lease
		err error
	}
	results := make(chan result, k)
	sem := m.norm
	for range k {
		go func() {
			l, err := sem.Acquire(ctx)
			results <- result{l, err}
		}()
	}
	time.Sleep(10 * time.Millisecond) // the callers wait (or were granted at once): the state, not an assertion
	if releaseHeld {
		for _, e := range m.held() {
			m.releaseOne(rt, e)
		}
	}
	// Live if a slot is certainly free within waitBound/2, leases the
	// callers take aside: none of what may hold every other slot lives
	// that long.
	late := window{b: b + waitBound.Milliseconds()/2, a: b + waitBound.Milliseconds()/2}
	_, stuck, _ := m.counts(late)
	mustSucceed := stuck+1 <= m.limit
	if !mustSucceed {
		// Not asserted: the callers get a moment, not waitBound (the
		// machine's checks stay short).
		time.AfterFunc(50*time.Millisecond, stop)
	}
	undone := false
	for got := 0; got < k; got++ {
		r := <-results
		w := window{b: b, a: callEnd()}
		if r.err != nil {
			if !errors.Is(r.err, context.DeadlineExceeded) && !errors.Is(r.err, context.Canceled) {
				fatalf(rt, "Acquire (one of %d callers of one process): %v, want an error matching its context's", k, r.err)
			}
			if mustSucceed {
				fatalf(rt, "Acquire (one of %d callers of one process) not granted within %v although at most %d of %d slots may be held by others then (%v)", k, waitBound, stuck, m.limit, r.err)
			}
			undone = true
			m.add(&entity{kind: kLease, weight: 1, gone: true, grantedBy: callEnd(), arrival: -1}, "T")
			continue
		}
		m.lastWrite, m.lastPrune = b, b
		e := m.takeLease(rt, r.l, 1, normalTTL, floor, w, -1)
		time.Sleep(hold)
		m.releaseOne(rt, e)
	}
	if undone {
		m.awaitUndo(rt)
	}
	rt.Logf("%d callers of one process, held leases released: %v", k, releaseHeld)
	trace("acquireBehind: %d callers, live %v, %v", k, mustSucceed, time.Since(time.UnixMilli(b)))
}

// held returns the entities with a lease object not yet released.
func (m *machine) held() []*entity {
	var out []*entity
	for _, e := range m.ents {
		if !e.gone && e.lease != nil && !e.handleDone {
			out = append(out, e)
		}
	}
	return out
}

func (m *machine) pickHeld(rt *rapid.T) *entity {
	hs := m.held()
	if len(hs) == 0 {
		rt.Skip("no lease")
	}
	return hs[rapid.IntRange(0, len(hs)-1).Draw(rt, "lease")]
}

// expectLive checks a Renew/Release result against e's deadline span.
func expectLive(rt *rapid.T, op string, e *entity, w window, err error) {
	switch {
	case err != nil && !errors.Is(err, redsem.ErrLeaseLost):
		fatalf(rt, "%s %s: %v", op, e, err)
	case err != nil && e.death.aliveThroughout(w):
		fatalf(rt, "%s %s: lease lost before its deadline %v (call at [%d,%d])", op, e, e.death, w.b, w.a)
	case err == nil && !e.death.mayBeAliveAt(w):
		fatalf(rt, "%s %s succeeded after its deadline %v (call at [%d,%d])", op, e, e.death, w.b, w.a)
	}
}

func (m *machine) release(rt *rapid.T) { m.releaseOne(rt, m.pickHeld(rt)) }

func (m *machine) releaseOne(rt *rapid.T, e *entity) {
	r := m.startRelease(e)
	r.run()
	m.settleRelease(rt, r)
}

// releasing is one Release call of a lease: whether the lease had ended
// before it (it then answers without Redis), its window and its result.
type releasing struct {
	e           *entity
	endedBefore bool
	w           window
	err         error
}

// startRelease prepares e's Release; run makes the call (on any goroutine);
// settleRelease checks its result against the model and updates the model
// (on the machine's goroutine).
func (m *machine) startRelease(e *entity) *releasing {
	// A lease already known lost (by the test, or by the lease itself: one
	// not renewed is given up at its deadline) answers without Redis.
	r := &releasing{e: e}
	select {
	case <-e.lease.Done():
		r.endedBefore = true
	default:
	}
	return r
}

func (r *releasing) run() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.w.b = callStart()
	r.err = r.e.lease.Release(ctx)
	r.w.a = callEnd()
}

// releaseFails releases a held lease whose release.lua reply is held past
// the caller's short context (timed out, or cancelled): Redis ran the
// release, the caller is told the context's error, the lease stays held
// here unrenewed and its release is retried in the background; or (a third
// of the draws) with a context ended already, while a renewal of the lease
// is in flight (its reply held): nothing is sent, and the lease is let go
// and released in the background all the same. Meanwhile
// Renew returns ErrReleased (the holder let the lease go: a renewal would
// be undone by the retry a moment later), and the retry then finds the
// release done: the lease ends released, or lost if its deadline came
// first.
func (m *machine) releaseFails(rt *rapid.T) {
	e := m.pickHeld(rt)
	select {
	case <-e.lease.Done():
		m.releaseOne(rt, e) // ended already: Release answers without Redis
		return
	default:
	}
	defer m.delay.DropHolds()
	// The caller's context times out, or the caller cancels it: either
	// way the request is on its way, and may yet run. Or (duringRenewal)
	// the caller's context has ended already when it calls Release while
	// a renewal of the lease is in flight: nothing is sent.
	var ctx context.Context
	var cancel context.CancelFunc
	renewed := make(chan error, 1)
	switch mode := rapid.IntRange(0, 2).Draw(rt, "releaseFailsMode"); mode {
	case 0, 1:
		m.delay.HoldNext(redistest.MatchScript(lua.Release.Hash(), lua.Release.Function()), redistest.MaxDelay)
		ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
		if mode == 1 {
			ctx, cancel = context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
		}
	default:
		if d := time.Until(e.lease.Deadline()); d < crashTTL && rapid.Bool().Draw(rt, "releaseFailsLate") {
			// A short lease, 10 ms before its deadline: the background
			// release's first retry comes after it, so the lease ends lost
			// while Redis lists it until the renewal's new deadline.
			time.Sleep(d - 10*time.Millisecond)
		}
		held := m.delay.Stats().HeldReplies
		m.delay.HoldNext(renewCalls, redistest.MaxDelay)
		go func() {
			rctx, rcancel := m.ctx()
			defer rcancel()
			renewed <- e.lease.Renew(rctx)
		}()
		for i := 0; i < 500 && m.delay.Stats().HeldReplies == held; i++ {
			time.Sleep(time.Millisecond) // until its reply is held (or 0.5 s: Release then meets no renewal)
		}
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		defer func() {
			// The renewal Release ended: ErrReleased, or lost where the
			// model allows (its deadline passed first).
			if rerr := <-renewed; rerr != nil && !errors.Is(rerr, redsem.ErrReleased) && !errors.Is(rerr, redsem.ErrLeaseLost) {
				fatalf(rt, "the Renew of %s that Release ended: %v", e, rerr)
			}
		}()
	}
	w := window{b: callStart()}
	err := e.lease.Release(ctx)
	w.a = callEnd()
	cancel()
	if err == nil || errors.Is(err, redsem.ErrLeaseLost) {
		// The held reply came as the context ended and won, or the lease's
		// deadline passed first: as any release.
		trace("releaseFails: Release %v (no retry)", err)
		m.settleRelease(rt, &releasing{e: e, w: w, err: err})
		return
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		fatalf(rt, "Release %s with its reply held: %v, want the context's error", e, err)
	}
	// Lost instead is right when the lease's deadline passed, or when
	// Redis may have lost it meanwhile (a flush, a restart): the retry
	// then finds nothing held.
	deadline := e.lease.Deadline()
	mayBeLost := func(err error, w window) bool {
		return errors.Is(err, redsem.ErrLeaseLost) && (!time.Now().Before(deadline) || !e.death.aliveThroughout(w))
	}
	rctx, rcancel := m.ctx()
	rw := window{b: callStart()}
	rerr := e.lease.Renew(rctx)
	rw.a = callEnd()
	rcancel()
	if !errors.Is(rerr, redsem.ErrReleased) && !mayBeLost(rerr, rw) {
		fatalf(rt, "Renew %s while its failed Release is retried: %v, want ErrReleased", e, rerr)
	}
	select {
	case <-e.lease.Done():
	case <-time.After(5 * time.Second):
		fatalf(rt, "%s: the background release did not end the lease in 5s", e)
	}
	if lerr := e.lease.Err(); lerr != nil && !mayBeLost(lerr, window{b: w.b, a: callEnd()}) {
		fatalf(rt, "%s after its background release: Err %v", e, lerr)
	}
	if lerr := e.lease.Err(); lerr != nil && !time.Now().Before(e.lease.Deadline()) {
		// Lost at its deadline before the background release reached
		// Redis (its retries end there; a resumed lease's give-up leaves it
		// to other handles): Redis may list the lease until its death,
		// which a renewal in flight (mode 2, or an automatic one) may have
		// moved, its reply never seen. (CI, 2026-12-07: the machine said
		// gone, Redis listed the resumed lease until the renewed deadline.)
		e.localLost, e.handleDone = true, true
		e.death = span{e.death.lo, max(e.death.hi, callEnd()+e.ttl)}
		rt.Logf("%s lost before its background release (Renew meanwhile: %v), may live until %v", e, rerr, e.death)
		trace("releaseFails: lost at its deadline before the background release; Renew %v", rerr)
		return
	}
	// Redis ran the release within the call's window.
	if !e.localLost {
		m.lastWrite, m.lastPrune = max(m.lastWrite, w.b), max(m.lastPrune, w.b)
	}
	e.gone = true
	rt.Logf("released %s in the background (Renew meanwhile: %v)", e, rerr)
	trace("releaseFails: Renew %v; then Err %v", rerr, e.lease.Err())
}

// releaseTogether releases 2 to 6 held leases at once: the releases of one
// process's semaphore that meet one of its release calls in flight go
// together in its next call (releasemany.lua, core's releases.go). Each is
// checked as releaseOne checks one.
func (m *machine) releaseTogether(rt *rapid.T) {
	hs := m.held()
	if len(hs) < 2 {
		rt.Skip("fewer than two leases")
	}
	k := rapid.IntRange(2, min(6, len(hs))).Draw(rt, "k")
	picks := rapid.SliceOfNDistinct(rapid.IntRange(0, len(hs)-1), k, k, rapid.ID[int]).Draw(rt, "leases")
	rs := make([]*releasing, k)
	for i, p := range picks {
		rs[i] = m.startRelease(hs[p])
	}
	if rapid.Bool().Draw(rt, "holdFirst") {
		// The first release's reply held: the others meet it in flight
		// and queue (one process's: the machine's own clients).
		m.delay.HoldNext(redistest.MatchScript(lua.Release.Hash(), lua.Release.Function()), redistest.MaxDelay/2)
		defer m.delay.DropHolds()
	}
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(r.run)
	}
	wg.Wait()
	for _, r := range rs {
		m.settleRelease(rt, r)
	}
}

func (m *machine) settleRelease(rt *rapid.T, r *releasing) {
	e, endedBefore, w, err := r.e, r.endedBefore, r.w, r.err
	if !e.localLost && !endedBefore {
		m.lastWrite, m.lastPrune = max(m.lastWrite, w.b), max(m.lastPrune, w.b)
	}
	expectLive(rt, "Release", e, w, err)
	if err != nil && (e.localLost || endedBefore || w.a >= e.lease.Deadline().UnixMilli()) {
		// Lost locally, at its deadline: Redis was not asked, and may list
		// the lease until its death.
		e.localLost, e.handleDone = true, true
	} else {
		e.gone = true
	}
	rt.Logf("released %s: %v", e, err)
}

func (m *machine) releaseTwice(rt *rapid.T) {
	e := m.pickHeld(rt)
	m.releaseOne(rt, e)
	ctx, cancel := m.ctx()
	defer cancel()
	if err := e.lease.Release(ctx); err != nil {
		fatalf(rt, "second Release of %s: %v, want nil", e, err)
	}
}

func (m *machine) renew(rt *rapid.T) { m.renewOne(rt, m.pickHeld(rt)) }

// renewOne renews e's lease, checks the result against the model and
// returns it, and the window of the call.
func (m *machine) renewOne(rt *rapid.T, e *entity) (window, error) {
	ctx, cancel := m.ctx()
	defer cancel()
	// A lease given up at its deadline (no renewal: the crash holders) is
	// lost before Renew is called, which then sends nothing.
	endedBefore := false
	select {
	case <-e.lease.Done():
		endedBefore = true
	default:
	}
	w := window{b: callStart()}
	err := e.lease.Renew(ctx)
	w.a = callEnd()
	expectLive(rt, "Renew", e, w, err)
	if err != nil {
		if !e.localLost && !endedBefore {
			m.lastWrite = w.b // a failed renewal runs expire()
		}
		switch {
		case endedBefore || e.localLost:
			// Nothing was sent: the lease's end in Redis is as it was.
		case callEnd() >= e.lease.Deadline().UnixMilli():
			// The lease's deadline passed while the renewal was in flight:
			// the lease ended then, but Redis may have run the renewal
			// (its reply came too late); the give-up at the deadline
			// undoes it, or else it lives until the renewed deadline.
			e.death = span{e.death.lo, max(e.death.hi, w.a+e.ttl)}
		default:
			e.death = span{} // Redis answered: it is gone
		}
		e.localLost = true
		rt.Logf("renew %s: lost (%v)", e, e.death)
		return w, err
	}
	e.death = after(w, e.ttl)
	rt.Logf("renewed %s until %v", e, e.death)
	return w, nil
}

// dropRaw settles a raw waiter heavier than the limit SetLimit set during
// w: SetLimit dropped it if it still waited, but a script may have granted
// it before (a raw waiter never learns of its grant). A lease record says
// it holds its slots; with none, it either waited or was granted and its
// lease has ended since (its slots are free again, its grant counts in the
// rate's window until it leaves).
func (m *machine) dropRaw(rt *rapid.T, e *entity, w window) {
	ctx, cancel := m.ctx()
	slots, token, ok, err := m.leaseRecord(ctx, e.id)
	cancel()
	if err != nil {
		fatalf(rt, "lease record: %v", err)
	}
	if ok {
		m.granted(rt, e, slots, token, w)
		return
	}
	e.gone = true
	e.grantedBy = w.a
}

// sleep lets time pass, so that crashed holders and dead waiters expire.
func (m *machine) sleep(rt *rapid.T) {
	d := rapid.SampledFrom([]int{10, 40, 150}).Draw(rt, "sleep_ms")
	time.Sleep(time.Duration(d) * time.Millisecond)
}

func (m *machine) setLimit(rt *rapid.T) {
	m.setLimitTo(rt, m.norm, rapid.IntRange(1, 4).Draw(rt, "new_limit"))
}

// setLimitTo sets the limit to n through sem.
func (m *machine) setLimitTo(rt *rapid.T, sem redsem.Semaphore, n int) {
	ctx, cancel := m.ctx()
	defer cancel()
	w := window{b: callStart()}
	if err := sem.SetLimit(ctx, n); err != nil {
		fatalf(rt, "SetLimit(%d): %v", n, err)
	}
	w.a = callEnd()
	m.lastWrite = w.b
	m.limit = n
	for _, e := range m.ents {
		if !e.granted {
			e.limitAt = max(e.limitAt, n)
			if e.weight > n {
				// SetLimit ends a wait for more than the new limit (ErrWeight).
				e.weightOut = true
				if e.kind == kGo && e.pending {
					// Its place is lost: its Acquire ends with ErrWeight,
					// or (the limit raised again before its process learnt
					// of it) it queues again, at the back.
					e.arrival = -1
				}
				if e.kind == kRaw && !e.gone {
					m.dropRaw(rt, e, w)
				}
			}
		}
	}
	m.collect(rt) // such waiters return now or soon; check() collects them
}

// restart replaces the server by an empty one on the same port: every lease
// and queue entry is lost, tokens must still increase. Connections break
// (pub/sub included) and the clients dial the new server.
func (m *machine) restart(rt *rapid.T) {
	if rapid.IntRange(0, 2).Draw(rt, "restart_die") != 0 {
		rt.Skip("restart is expensive: a third of the draws")
	}
	// Every token of the old server is below the time after its end, every
	// token of the new one above it (tokens never fall below the server's
	// clock, and this machine's clock is the server's).
	m.srv.Kill(m.t)
	m.restartUs = time.Now().UnixMicro()
	m.srv.Restart(m.t)
	// The client's pool may have met refused dials while the server was
	// down; wait until it talks to the new server again.
	for deadline := time.Now().Add(waitBound); m.rdb.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			fatalf(rt, "no PING answer within %v after a restart", waitBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.awaitRequeue(rt, m.lost(), "restarted")
}

// flush loses every key at once (FLUSHALL: a restart without persistence
// whose connections survive, so that what is in flight on them still
// arrives afterwards). In the fair machine it may first put a grant in
// flight: it holds what the pub/sub connections receive for a while,
// releases a lease of the crash semaphore or raises the limit through it
// (so the head waiter of the other semaphore may be admitted: the reply,
// with the grants, goes to the crash semaphore's engine, and the grant
// reaches the waiter by its pub/sub message alone, which is held), then
// loses the data, takes the slots and
// starts one more waiter: its queue attempt finds the process's session
// gone, and the process renews the session and queues its waiters again at
// once (else at its next heartbeat), so that the held grant, from before
// the loss, arrives after that. A waiter seen queued again must not take it
// (settle).
func (m *machine) flush(rt *rapid.T) {
	if rapid.IntRange(0, 1).Draw(rt, "flush_die") != 0 {
		rt.Skip("half of the draws")
	}
	kick := false
	if m.fair && rapid.Bool().Draw(rt, "flush_in_flight") {
		hold := time.Duration(rapid.SampledFrom([]int{20, 50, 90}).Draw(rt, "flush_hold_ms")) * time.Millisecond
		pending := 0
		for _, e := range m.ents {
			if e.kind == kGo && e.pending {
				pending++
			}
		}
		var live []*entity
		for _, e := range m.held() {
			if e.ttl == crashTTL.Milliseconds() && !e.localLost && e.death.aliveThroughout(window{callStart(), callEnd()}) {
				live = append(live, e)
			}
		}
		if pending > 0 {
			m.delay.HoldPubSub(hold)
			if len(live) > 0 && rapid.Bool().Draw(rt, "flush_by_release") {
				e := live[rapid.IntRange(0, len(live)-1).Draw(rt, "flush_release")]
				m.releaseOne(rt, e)
				rt.Logf("released %s with the pub/sub connections held for %v", e, hold)
			} else {
				n := m.limit + rapid.IntRange(1, 3).Draw(rt, "flush_raise")
				m.setLimitTo(rt, m.crash, n)
				rt.Logf("raised the limit to %d with the pub/sub connections held for %v", n, hold)
			}
			trace("flush: a grant in flight, the pub/sub connections held for %v", hold)
			kick = pending < maxPending
		}
	}
	ctx, cancel := m.ctx()
	defer cancel()
	var tm *redis.TimeCmd
	if _, err := m.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		p.FlushAll(ctx)
		return nil
	}); err != nil {
		fatalf(rt, "FLUSHALL: %v", err)
	}
	// Tokens from before are at most the server's clock at the flush (but
	// for the few µs that grants sharing a µs run ahead), tokens after it
	// above it.
	m.restartUs = tm.Val().UnixMicro()
	live := m.lost()
	if kick {
		// The slots taken (if the rate lets one call take them all), then
		// a new waiter of the same process: its queue attempt finds the
		// session gone, and the process renews it and queues its waiters
		// again at once, while the held grant is still on its way.
		n := m.maxWeight()
		ctx, cancel := m.ctx()
		floor := m.maxToken
		w := window{b: callStart()}
		l, err := m.norm.TryAcquireN(ctx, n)
		w.a = callEnd()
		cancel()
		m.lastWrite, m.lastPrune = w.b, w.b
		switch {
		case err == nil:
			e := m.takeLease(rt, l, n, normalTTL, floor, w, m.arrive())
			m.noJump(rt, e, w)
		case !errors.Is(err, redsem.ErrNoSlot):
			fatalf(rt, "TryAcquireN(%d) after the flush: %v", n, err)
		}
		e := m.launch(1, -1)
		live = append(live, e)
		rt.Logf("%s launched to find the session gone", e.label)
	}
	m.awaitRequeue(rt, live, "flushed")
}

// lost updates the model after a loss of every key at m.restartUs and
// returns the live waiters, which queue again.
func (m *machine) lost() []*entity {
	m.limit = m.base
	m.grants = nil // the window is lost with everything else
	var live []*entity
	for _, e := range m.ents {
		switch {
		case e.kind == kGo && e.pending:
			// Evicted with everything else: it queues again, at the back
			// in an order the model learns below; a grant it had not yet
			// returned is lost and it waits for a new one.
			e.granted, e.token, e.arrival, e.floor = false, 0, -1, m.maxToken
			e.limitAt = max(e.limitAt, m.base)
			e.requeued = false
			if e.weight > m.base {
				e.weightOut = true // its acquire asks again: above the clients' limit
			}
			live = append(live, e)
		case e.kind == kRaw:
			e.gone = true // its session is gone; it will never heart-beat
		default:
			e.death = span{}
		}
	}
	return live
}

// awaitRequeue waits until each live waiter has queued again or returned,
// and marks those that Redis lists again (requeued: queued, or granted
// since).
func (m *machine) awaitRequeue(rt *rapid.T, live []*entity, what string) {
	deadline := time.Now().Add(waitBound)
	for {
		m.collect(rt)
		ctx, cancel := m.ctx()
		st, err := m.norm.Status(ctx)
		cancel()
		if err == nil {
			in := map[string]bool{}
			for _, w := range st.Waiters {
				in[w.ID] = true
			}
			for _, h := range st.Holders {
				in[h.ID] = true
			}
			for _, e := range live {
				if e.id != "" {
					continue
				}
				// A waiter launched after the loss: the one id Redis
				// lists that the model does not know.
				for _, w := range st.Waiters {
					if m.byID[w.ID] == nil {
						e.id = w.ID
						m.byID[e.id] = e
						break
					}
				}
			}
			done := true
			for _, e := range live {
				if e.pending && !in[e.id] {
					done = false
				}
			}
			if done {
				for _, e := range live {
					e.requeued = e.pending && in[e.id]
				}
				for _, w := range st.Waiters {
					if e := m.byID[w.ID]; e != nil && e.arrival < 0 {
						e.arrival = m.arrive()
					}
				}
				rt.Logf("%s; waiters queued again: %s", what, describeW(m, st.Waiters))
				return
			}
		}
		if time.Now().After(deadline) {
			fatalf(rt, "after the data loss (%s), live waiters did not queue again within %v (status err %v)", what, waitBound, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// enqueue starts a fair Acquire in a goroutine (a live waiter whose process
// heart-beats) and waits until Redis shows it queued or it returns.
func (m *machine) enqueue(rt *rapid.T) {
	n := 0
	for _, e := range m.ents {
		if e.kind == kGo && e.pending {
			n++
		}
	}
	if n >= maxPending {
		rt.Skip("enough waiters")
	}
	wn := rapid.IntRange(1, m.maxWeight()).Draw(rt, "weight")
	e := m.launch(wn, m.arrive())
	deadline := time.Now().Add(waitBound)
	for {
		select {
		case r := <-e.result:
			m.settle(rt, e, r)
			return
		default:
		}
		ctx, cancel := m.ctx()
		st, err := m.norm.Status(ctx)
		cancel()
		if err == nil {
			for _, w := range st.Waiters {
				if m.byID[w.ID] == nil {
					e.id = w.ID
					m.byID[e.id] = e
					rt.Logf("%s queued at position %d", e.label, w.Position)
					return
				}
			}
		}
		if time.Now().After(deadline) {
			fatalf(rt, "%s neither queued nor returned within %v (status err %v)", e.label, waitBound, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// launch starts a fair AcquireN(wn) of norm in a goroutine: a live waiter
// (its id unknown until Status lists it).
func (m *machine) launch(wn, arrival int) *entity {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e := &entity{kind: kGo, pending: true, cancel: cancel, result: make(chan goResult, 1), weight: wn,
		floor: m.maxToken, limitAt: m.limit, arrival: arrival, death: span{forever, forever},
		launched: callStart()}
	m.add(e, "W")
	sem := m.norm
	go func() {
		l, err := sem.AcquireN(ctx, wn)
		e.result <- goResult{l, err}
	}()
	return e
}

// enqueueDead queues a waiter by a raw script call, as a remote process that
// dies at once would: its session is never heart-beaten again.
func (m *machine) enqueueDead(rt *rapid.T) {
	ctx, cancel := m.ctx()
	defer cancel()
	wn := rapid.IntRange(1, m.maxWeight()).Draw(rt, "weight")
	e := &entity{kind: kRaw, id: uuid.NewString(), weight: wn, floor: m.maxToken, limitAt: m.limit, arrival: m.arrive(),
		ttl: rawLeaseMs}
	sid := "dead" + strings.ReplaceAll(uuid.NewString(), "-", "")
	// The session's first heartbeat, then one acquire in queue mode, back to
	// back in one transaction (so the session cannot die in between).
	var hb, acq *redis.Cmd
	w := window{b: callStart()}
	_, err := m.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hb = core.Script(lua.Heartbeat).Eval(ctx, p, m.keys.List, m.keys.Chan, "PUBLISH", m.limitArg(), sid, rawQueueMs, "new")
		acq = core.Script(lua.Acquire).Eval(ctx, p, m.keys.List, m.keys.Chan, "PUBLISH", m.limitArg(), e.id, wn, rawLeaseMs, "queue", sid, 0, "raw", 0)
		return nil
	})
	w.a = callEnd()
	if err != nil {
		fatalf(rt, "raw heartbeat and acquire: %v", err)
	}
	if alive, err := hb.Slice(); err != nil || alive[1] != int64(1) {
		fatalf(rt, "raw heartbeat: %v %v", alive, err)
	}
	v, err := acq.Slice()
	if err != nil {
		fatalf(rt, "raw acquire: %v", err)
	}
	m.lastWrite, m.lastPrune = w.b, w.b
	m.add(e, "R")
	switch code := v[0].(int64); code {
	case 1: // {1, now, token, deadline, slot, ...}: granted at once, not tied to the session
		e.death = after(w, rawLeaseMs)
		var slots []int
		for _, x := range v[4:] {
			slots = append(slots, int(x.(int64)))
		}
		m.granted(rt, e, slots, v[2].(int64), w)
		m.noJump(rt, e, w)
		rt.Logf("%s granted at once", e)
	case 0: // {0, now, hint, position}: queued; gone when the session dies,
		// and a grant lasts no longer than the session (rawQueueMs < rawLeaseMs)
		e.death = span{w.b + rawQueueMs, w.a + rawQueueMs}
		rt.Logf("%s queued at position %d until %v", e, v[3], e.death)
	default:
		fatalf(rt, "raw acquire reply %v", v)
	}
}

// cancelWaiter cancels a live waiter's Acquire.
func (m *machine) cancelWaiter(rt *rapid.T) {
	var ps []*entity
	for _, e := range m.ents {
		if e.kind == kGo && e.pending {
			ps = append(ps, e)
		}
	}
	if len(ps) == 0 {
		rt.Skip("no waiter")
	}
	e := ps[rapid.IntRange(0, len(ps)-1).Draw(rt, "waiter")]
	e.cancelled = true
	w := window{b: callStart()}
	e.cancel()
	m.await(rt, e)
	if e.gone { // it leaves the queue through release.lua
		m.awaitUndo(rt)
		m.lastWrite, m.lastPrune = w.b, w.b
	}
	rt.Logf("cancelled %s (gone %v)", e, e.gone)
}

// awaitUndo waits (bounded) until the acquires that ended with a context
// error have been undone. The engine undoes such an acquire on a goroutine
// of its own after the call returned (release.lua in "undo" mode), so its
// queue entry, or a grant it won in a race with its context, outlives the
// call for a moment. Undone means: Status lists no holder or waiter that
// the model does not know or knows to be released or cancelled. Should
// that never come, check reports what is left.
func (m *machine) awaitUndo(rt *rapid.T) {
	stray := func(id string) bool {
		e := m.byID[id]
		return e == nil || e.gone || e.cancelled
	}
	for deadline := time.Now().Add(waitBound); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		m.collect(rt)
		ctx, cancel := m.ctx()
		st, err := m.norm.Status(ctx)
		cancel()
		if err != nil {
			continue
		}
		left := false
		for _, h := range st.Holders {
			left = left || stray(h.ID)
		}
		for _, w := range st.Waiters {
			left = left || stray(w.ID)
		}
		if !left {
			return
		}
	}
}

// drainAndCheckLeak ends every lease and waiter, waits until every deadline
// the model knows has passed, lets one script run, and checks that nothing
// is left but keys that expire by themselves.
func (m *machine) drainAndCheckLeak(rt *rapid.T) {
	for _, e := range m.ents {
		if e.kind == kGo && e.pending {
			e.cancelled = true
			e.cancel()
			m.await(rt, e)
		}
	}
	m.awaitUndo(rt)
	m.checkFormers(rt)
	ctx, cancel := m.ctx()
	defer cancel()
	var until int64
	for _, e := range m.held() {
		if e.death.aliveThroughout(window{callStart(), callEnd()}) {
			if err := e.lease.Release(ctx); err != nil {
				fatalf(rt, "final Release %s: %v", e, err)
			}
			e.gone = true
		}
	}
	for _, e := range m.ents {
		if !e.gone && e.death.hi < forever {
			until = max(until, e.death.hi)
		}
	}
	if d := time.Until(time.UnixMilli(until + guard)); d > 0 {
		time.Sleep(d) // every remaining lease and dead session ends by then
	}
	// Any write script runs expire() and admit() (which evicts dead waiters
	// while slots are free); a forced release of an unknown id is one.
	eng, err := core.New(core.Config{Client: m.rdb, Name: m.name, Limit: m.base, Prefix: core.DefaultPrefix, Rate: m.rate})
	if err != nil {
		fatalf(rt, "engine: %v", err)
	}
	defer eng.Close()
	if _, _, err := eng.ForceRelease(ctx, "nobody"); err != nil {
		fatalf(rt, "release: %v", err)
	}
	raw, err := core.Inspect(ctx, m.rdb, m.keys)
	if err != nil {
		fatalf(rt, "inspect: %v", err)
	}
	if raw.Live() {
		var dumps []string
		for _, k := range m.keys.List {
			dumps = append(dumps, k+"="+dump(ctx, m.rdb, k))
		}
		fatalf(rt, "leak: entries left after every lease and waiter ended: %+v: %s", raw, strings.Join(dumps, " "))
	}
	for i, k := range m.keys.List {
		n, err := m.rdb.Exists(ctx, k).Result()
		if err != nil {
			fatalf(rt, "exists %s: %v", k, err)
		}
		if n == 0 {
			continue
		}
		switch i {
		case core.KeySessions:
			// The server's clock read with the sessions, in one
			// transaction: a hub that is not closed yet may beat between
			// a clock read before and the sessions' read (under load, more
			// than clockSlack after it), and its session then rightly
			// lives until QueueTTL after that beat.
			var tm *redis.TimeCmd
			var z *redis.ZSliceCmd
			if _, err := m.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				tm = p.Time(ctx)
				z = p.ZRangeWithScores(ctx, k, 0, -1)
				return nil
			}); err != nil {
				fatalf(rt, "sessions: %v", err)
			}
			at := tm.Val().UnixMilli()
			for _, s := range z.Val() {
				if s.Member != core.Sentinel && int64(s.Score) > at+queueTTL.Milliseconds()+clockSlack {
					fatalf(rt, "leak: session %v outlives any heartbeat (server time %d)", s, at)
				}
			}
		case core.KeyOverride:
			continue // SetLimit's setting never expires
		}
		// Keys expire at the Lua library's horizon: at most twice the longest entry
		// lifetime (release and cancellation records included) plus MARGIN_MS.
		pttl, err := m.rdb.PTTL(ctx, k).Result()
		if err != nil {
			fatalf(rt, "pttl %s: %v", k, err)
		}
		if pttl < 0 || pttl > 2*max(normalTTL, queueTTL, recordLife)+leakMargin*time.Millisecond {
			fatalf(rt, "leak: %s has TTL %v", k, pttl)
		}
	}
}

// stop cancels every waiter still running (after a failure) and closes the
// semaphores.
func (m *machine) stop() {
	for _, e := range m.ents {
		if e.kind == kGo && e.pending {
			e.cancel()
			select {
			case <-e.result:
			case <-time.After(waitBound):
			}
		}
	}
	m.close()
}

func dump(ctx context.Context, rdb *redis.Client, k string) string {
	switch rdb.Type(ctx, k).Val() {
	case "zset":
		return fmt.Sprint(rdb.ZRangeWithScores(ctx, k, 0, -1).Val())
	case "hash":
		return fmt.Sprint(rdb.HGetAll(ctx, k).Val())
	}
	return rdb.Type(ctx, k).Val()
}
