package property_test

// The time-and-scale machines (issue 19): rapid state machines whose actions
// make the states that time and size create, which the other machines, in
// compressed time with limits of 1-4, never reach: quiet stretches longer
// than QueueTTL and every LeaseTTL, a process taking and returning a slot at
// once for several QueueTTLs, bursts of contention from several processes
// after them, more leases expiring together than one expiry batch (64), one
// release or SetLimit admitting thousands of waiters, a dead process with
// thousands of queued waiters, Close while a call retries through a dead
// Redis, MaxHold and DisableAutoRenew leases reaching their end. Every
// process is a semaphore of its own with its own *redis.Client (its own hub
// and session); remote processes that die at once are raw script calls.
//
// After every action the raw keys are read in one MULTI and checked against
// lua/lib_*.lua's layout (redistest.Layout.Check), and Status against the
// model: the leases the test holds across actions, nothing else, no waiter,
// no eviction of a live process's waiter. See docs/testing.md.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
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
	tsQueueTTL    = 400 * time.Millisecond // the live processes' fair sessions
	tsLeaseTTL    = 3 * time.Second        // the live processes' leases (auto-renewed every second)
	tsFallback    = 100 * time.Millisecond // so a process heart-beats every 100 ms while it has waiters
	tsHubIdle     = 500 * time.Millisecond // a hub stops this long after its last waiter left (hub.go)
	tsStreamEvery = tsQueueTTL / 10
	tsStreamFor   = 2*tsQueueTTL + 100*time.Millisecond
	tsRawLeaseMs  = 200                    // mass holders that never renew (remote processes that died)
	tsShortTTL    = 150 * time.Millisecond // MaxHold and DisableAutoRenew leases
	tsMaxHold     = 40 * time.Millisecond  // below LeaseTTL/3: the MaxHold lease is never renewed
	tsCloseBound  = time.Second            // Close ends a retrying Acquire within this
	tsDoneSlack   = 200 * time.Millisecond // a DisableAutoRenew lease's Done closes by Deadline + this
	tsBatch       = 64                     // the Lua library's BATCH: entries one expiry or prune step handles
	tsMaxHeld     = 4                      // leases held across actions at most
	tsRawLong     = 30000                  // ms: leases and sessions of live raw waiters
)

// tsBudget: checks per run, and the number of actions per check (drawn in
// [minSteps, maxSteps]: a fixed range, so that a run's length is bounded).
type tsBudget struct{ checks, minSteps, maxSteps int }

func tsBudgetFor(isFair bool) tsBudget {
	switch {
	case soak() && isFair:
		return tsBudget{25, 10, 25}
	case soak():
		return tsBudget{20, 10, 25}
	case isFair:
		return tsBudget{4, 8, 12}
	}
	return tsBudget{3, 8, 12}
}

func TestFairTimeScaleMachine(t *testing.T)   { runTimeScale(t, true) }
func TestUnfairTimeScaleMachine(t *testing.T) { runTimeScale(t, false) }

// tsOnly returns the actions named in REDSEM_TIMESCALE_ONLY (comma
// separated), or nil: to run one kind of action alone, e.g. to see the bug
// it catches without another bug firing first.
func tsOnly() map[string]bool {
	v := os.Getenv("REDSEM_TIMESCALE_ONLY")
	if v == "" {
		return nil
	}
	out := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		out[strings.TrimSpace(s)] = true
	}
	return out
}

func runTimeScale(t *testing.T, isFair bool) {
	b := tsBudgetFor(isFair)
	if !userChecks {
		old := flag.Lookup("rapid.checks").Value.String()
		_ = flag.Set("rapid.checks", strconv.Itoa(b.checks))
		defer func() { _ = flag.Set("rapid.checks", old) }()
	}
	names := []string{"burst", "closeWhileRetrying", "hold", "idle", "massExpiry", "maxHold",
		"noRenewDeadline", "release", "uncontendedStream"}
	if isFair {
		names = append(names, "massAdmit", "massEvict")
	}
	if only := tsOnly(); only != nil {
		names = slices.DeleteFunc(names, func(n string) bool { return !only[n] })
		if len(names) == 0 {
			t.Skip("REDSEM_TIMESCALE_ONLY names no action of this machine")
		}
	}
	sort.Strings(names)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	checks, began := 0, time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		trace("%s: check %d at %.1fs", t.Name(), checks, time.Since(began).Seconds())
		m := newTSMachine(t, rt, srv, admin, isFair)
		defer m.stop()
		actions := map[string]func(*rapid.T){
			"idle":               m.idle,
			"uncontendedStream":  m.uncontendedStream,
			"burst":              m.burst,
			"massExpiry":         m.massExpiry,
			"closeWhileRetrying": m.closeWhileRetrying,
			"maxHold":            m.maxHold,
			"noRenewDeadline":    m.noRenewDeadline,
			"hold":               m.hold,
			"release":            m.release,
			"massAdmit":          m.massAdmit,
			"massEvict":          m.massEvict,
		}
		steps := rapid.IntRange(b.minSteps, b.maxSteps).Draw(rt, "steps")
		m.check(rt)
		for i := 0; i < steps; i++ {
			name := rapid.SampledFrom(names).Draw(rt, "action")
			trace("%s: check %d step %d: %s at %.1fs", t.Name(), checks, i, name, time.Since(began).Seconds())
			actions[name](rt)
			m.check(rt)
		}
		m.drain(rt)
	})
}

// tsProc is one process: a semaphore with its own client, hub and session.
type tsProc struct {
	label   string
	rdb     *redis.Client
	sem     redsem.Semaphore
	close   func() error
	evicted atomic.Int64 // EventWaiterEvicted seen
	failed  atomic.Int64 // dials and commands that failed (but for redis.Nil), counted by a hook and the client's Dialer
}

// tsHook counts the dials and commands of a client that fail (pub/sub
// connections included).
type tsHook struct{ p *tsProc }

func (h tsHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			h.p.failed.Add(1)
		}
		return c, err
	}
}
func (h tsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			h.p.failed.Add(1)
		}
		return err
	}
}
func (h tsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// tsLease is a lease the model holds across actions (auto-renewed).
type tsLease struct {
	label  string
	proc   *tsProc
	l      redsem.Lease
	weight int
}

func (l *tsLease) String() string {
	return fmt.Sprintf("%s(%s, slots %v)", l.label, l.proc.label, l.l.Slots())
}

type tsMachine struct {
	t     *testing.T
	fair  bool
	srv   *redistest.Server
	admin *redis.Client
	name  string
	keys  core.Keys
	base  int // the limit the clients are built with
	limit int // the limit in force

	procs  []*tsProc
	mh, nr *tsProc          // MaxHold leases; DisableAutoRenew leases
	obs    redsem.Semaphore // Status, on the admin client
	all    []*tsProc        // every proc made (closed by stop)

	held     []*tsLease
	maxToken int64
	counter  int
}

func newTSMachine(t *testing.T, rt *rapid.T, srv *redistest.Server, admin *redis.Client, isFair bool) *tsMachine {
	m := &tsMachine{t: t, fair: isFair, srv: srv, admin: admin, name: redistest.Name(t)}
	// Above twice the expiry batch, so that a mass expiry can leave holders
	// outside the first two batches.
	m.base = rapid.IntRange(150, 200).Draw(rt, "limit")
	m.limit = m.base
	m.keys = core.KeysFor(core.DefaultPrefix, m.name)
	n := rapid.IntRange(2, 3).Draw(rt, "processes")
	for i := 0; i < n; i++ {
		m.procs = append(m.procs, m.newProc(rt, fmt.Sprintf("p%d", i), tsLeaseTTL, 0, false))
	}
	m.mh = m.newProc(rt, "maxhold", tsShortTTL, tsMaxHold, false)
	m.nr = m.newProc(rt, "norenew", tsShortTTL, 0, true)
	var err error
	if isFair {
		m.obs, err = fair.New(admin, m.name, m.base, fair.Options{})
	} else {
		m.obs, err = unfair.New(admin, m.name, m.base, unfair.Options{})
	}
	if err != nil {
		tsFatalf(rt, "new: %v", err)
	}
	return m
}

func (m *tsMachine) newProc(rt *rapid.T, label string, ttl, maxHold time.Duration, noRenew bool) *tsProc {
	p := &tsProc{label: label}
	opt := m.srv.Options()
	// Dials counted where every dial of the client ends up, the engine's
	// own included: while dials fail, redsem dials the address itself
	// before it hands a request to go-redis, so its retries reach neither
	// go-redis's hooks nor the server.
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			p.failed.Add(1)
		}
		return c, err
	}
	p.rdb = redis.NewClient(opt)
	p.rdb.AddHook(tsHook{p})
	obs := func(ev redsem.Event) {
		if ev.Kind == redsem.EventWaiterEvicted {
			p.evicted.Add(1)
		}
	}
	var err error
	if m.fair {
		var s *fair.Semaphore
		s, err = fair.New(p.rdb, m.name, m.base, fair.Options{LeaseTTL: ttl, QueueTTL: tsQueueTTL,
			FallbackInterval: tsFallback, Observer: obs, Owner: label, MaxHold: maxHold, DisableAutoRenew: noRenew})
		if err == nil {
			p.sem, p.close = s, s.Close
		}
	} else {
		var s *unfair.Semaphore
		s, err = unfair.New(p.rdb, m.name, m.base, unfair.Options{LeaseTTL: ttl,
			FallbackInterval: tsFallback, Observer: obs, Owner: label, MaxHold: maxHold, DisableAutoRenew: noRenew})
		if err == nil {
			p.sem, p.close = s, s.Close
		}
	}
	if err != nil {
		_ = p.rdb.Close()
		tsFatalf(rt, "new %s: %v", label, err)
	}
	m.all = append(m.all, p)
	return p
}

func (m *tsMachine) stop() {
	for _, l := range m.held {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.l.Release(ctx)
		cancel()
	}
	m.held = nil
	for _, p := range m.all {
		_ = p.close()
	}
	if c, ok := m.obs.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	for _, p := range m.all {
		_ = p.rdb.Close()
	}
}

func (m *tsMachine) label(prefix string) string {
	m.counter++
	return fmt.Sprintf("%s%d", prefix, m.counter)
}

func (m *tsMachine) heldSum() int {
	n := 0
	for _, l := range m.held {
		n += l.weight
	}
	return n
}

func (m *tsMachine) pickProc(rt *rapid.T, what string) *tsProc {
	return m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, what)]
}

// otherProc returns a process other than p.
func (m *tsMachine) otherProc(p *tsProc) *tsProc {
	for _, q := range m.procs {
		if q != p {
			return q
		}
	}
	return p
}

var (
	tsHex     = regexp.MustCompile(`[0-9a-f]{32}`)
	tsNumbers = regexp.MustCompile(`\d+`)
)

// tsFatalf is fatalf with every number blanked out in the message rapid
// compares: times, counts of slots and positions vary between a run and
// its replay, and rapid accepts a smaller failing case only if it fails
// with the same message. The full message goes to the log and stderr.
func tsFatalf(rt *rapid.T, format string, args ...any) {
	rt.Helper()
	msg := fmt.Sprintf(format, args...)
	tsFail(rt, msg, msg)
}

// tsFail logs full and fails with summary, blanked.
func tsFail(rt *rapid.T, summary, full string) {
	rt.Helper()
	rt.Log(full)
	fmt.Fprintln(os.Stderr, "property failed:", full)
	msg := tsHex.ReplaceAllString(summary, "#")
	msg = unstable.ReplaceAllString(msg, "#")
	rt.Fatalf("%s", tsNumbers.ReplaceAllString(msg, "#"))
}

func ctxFor(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// newGrant checks a lease granted by the API: tokens only grow, as many
// slots as asked, ascending, below the limit in force.
func (m *tsMachine) newGrant(rt *rapid.T, what string, l redsem.Lease, n int) {
	m.grantOK(rt, what, l.Slots(), l.Token(), n)
}

func (m *tsMachine) grantOK(rt *rapid.T, what string, slots []int, token int64, n int) {
	if token <= m.maxToken {
		tsFatalf(rt, "%s: token %d is not above %d, issued before it", what, token, m.maxToken)
	}
	m.maxToken = token
	if len(slots) != n {
		tsFatalf(rt, "%s: %d slots %v for weight %d", what, len(slots), slots, n)
	}
	for i, s := range slots {
		if s < 0 || s >= m.limit || (i > 0 && slots[i-1] >= s) {
			tsFatalf(rt, "%s: slots %v not ascending in [0, %d)", what, shortSlots(slots), m.limit)
		}
	}
}

func shortSlots(s []int) string {
	if len(s) <= 8 {
		return fmt.Sprint(s)
	}
	return fmt.Sprintf("%v...(%d slots)", s[:8], len(s))
}

// ---- checks ----

// check runs after every action: the raw keys are consistent, and Status
// shows exactly the leases the model holds, no waiter, and no live
// process has seen one of its waiters evicted.
func (m *tsMachine) check(rt *rapid.T) {
	ctx, cancel := ctxFor(10 * time.Second)
	defer cancel()
	m.rawCheck(rt, "after the action")
	st, err := m.obs.Status(ctx)
	if err != nil {
		tsFatalf(rt, "status: %v", err)
	}
	if st.Limit != m.limit {
		tsFatalf(rt, "status limit %d, model %d", st.Limit, m.limit)
	}
	listed := map[string]redsem.Holder{}
	for _, h := range st.Holders {
		listed[h.ID] = h
	}
	for _, l := range m.held {
		h, ok := listed[l.l.ID()]
		if !ok {
			tsFatalf(rt, "%s is held (err %v) but Status does not list it", l, l.l.Err())
		}
		if !slices.Equal(h.Slots, l.l.Slots()) || h.Token != l.l.Token() {
			tsFatalf(rt, "%s: Status shows slots %v token %d, the lease %v %d", l, h.Slots, h.Token, l.l.Slots(), l.l.Token())
		}
		delete(listed, l.l.ID())
	}
	for _, h := range listed {
		tsFatalf(rt, "unknown holder %s (owner %s, slots %s) between actions", h.ID, h.Owner, shortSlots(h.Slots))
	}
	if len(st.Waiters) > 0 {
		tsFatalf(rt, "%d waiters listed between actions (first: owner %s)", len(st.Waiters), st.Waiters[0].Owner)
	}
	m.checkEvictions(rt)
}

func (m *tsMachine) checkEvictions(rt *rapid.T) {
	for _, p := range m.all {
		if n := p.evicted.Load(); n > 0 {
			tsFatalf(rt, "live process %s saw %d of its waiters evicted (EventWaiterEvicted) although it never stopped", p.label, n)
		}
	}
}

// rawState is a consistent snapshot (one MULTI) of a semaphore's keys
// (redistest.ReadLayout), with the parts the actions look at.
type rawState struct {
	layout   *redistest.Layout
	now      int64
	meta     map[string]string
	holders  []redis.Z // sentinel left out
	queue    []redis.Z
	sessions map[string]float64
}

func (m *tsMachine) readRaw(ctx context.Context) (rawState, error) {
	l, err := redistest.ReadLayout(ctx, m.admin, m.keys.List)
	if err != nil {
		return rawState{}, err
	}
	r := rawState{layout: l, now: l.Now, meta: l.Meta, holders: l.Holders, queue: l.Queue, sessions: map[string]float64{}}
	for _, z := range l.Sessions {
		r.sessions[z.Member.(string)] = z.Score
	}
	return r, nil
}

// problems checks the snapshot against lua/lib_*.lua's layout
// (redistest.Layout.Check, with the live holders within limit).
func (r rawState) problems(limit int) redistest.LayoutProblems {
	if r.layout == nil {
		return redistest.LayoutProblems{}
	}
	return r.layout.Check(limit)
}

// rawCheck fails the test if the keys break the Lua library's invariants.
func (m *tsMachine) rawCheck(rt *rapid.T, when string) rawState {
	ctx, cancel := ctxFor(10 * time.Second)
	defer cancel()
	r, err := m.readRaw(ctx)
	if err != nil {
		tsFatalf(rt, "read keys: %v", err)
	}
	if p := r.problems(m.limit); !p.OK() {
		tsFail(rt, when+": the keys are inconsistent: "+p.Summary(), when+": the keys are inconsistent: "+p.String())
	}
	return r
}

// ---- raw script calls (remote processes) ----

func (m *tsMachine) loadScripts(ctx context.Context) error {
	for _, s := range []lua.Script{lua.Acquire, lua.Release, lua.Heartbeat} {
		if err := core.Script(s).Load(ctx, m.admin).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (m *tsMachine) evalSha(ctx context.Context, p redis.Scripter, s lua.Script, args ...any) *redis.Cmd {
	argv := append([]any{m.keys.Chan, "PUBLISH", m.base}, args...)
	return core.Script(s).EvalSha(ctx, p, m.keys.List, argv...)
}

func (m *tsMachine) run(ctx context.Context, s lua.Script, args ...any) ([]any, error) {
	argv := append([]any{m.keys.Chan, "PUBLISH", m.base}, args...)
	return core.Script(s).Run(ctx, m.admin, m.keys.List, argv...).Slice()
}

// rawAcquire is the argument list of acquire.lua after the common prefix.
func rawAcquire(id string, n, leaseMs int, mode, sid string) []any {
	return []any{id, n, leaseMs, mode, sid, 0, "raw", 0}
}

// pipelined runs calls in pipelines of at most 1000 and returns every reply.
func (m *tsMachine) pipelined(ctx context.Context, n int, call func(p redis.Pipeliner, i int) *redis.Cmd) ([][]any, error) {
	out := make([][]any, 0, n)
	for from := 0; from < n; from += 1000 {
		cmds := make([]*redis.Cmd, 0, 1000)
		_, err := m.admin.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := from; i < min(from+1000, n); i++ {
				cmds = append(cmds, call(p, i))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, c := range cmds {
			v, err := c.Slice()
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
	}
	return out, nil
}

func i64(x any) int64 {
	switch v := x.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return -1 << 62
}

// ---- actions ----

// idle: a stretch with no call at all, longer than QueueTTL, every LeaseTTL
// of the test's short leases and the hubs' idle period (held leases keep
// renewing themselves).
func (m *tsMachine) idle(rt *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{tsQueueTTL + 200*time.Millisecond, 2 * tsQueueTTL}).Draw(rt, "idle")
	time.Sleep(d) // the passing time is the action
}

// stream: p takes a slot and returns it at once every QueueTTL/10, for more
// than twice QueueTTL: a process busy without contention.
func (m *tsMachine) stream(rt *rapid.T, p *tsProc) {
	free := m.limit - m.heldSum()
	end := time.Now().Add(tsStreamFor)
	n := 0
	for next := time.Now(); time.Now().Before(end); next = next.Add(tsStreamEvery) {
		time.Sleep(time.Until(next))
		ctx, cancel := ctxFor(waitBound)
		l, err := p.sem.Acquire(ctx)
		cancel()
		if err != nil {
			tsFatalf(rt, "stream of %s: Acquire %d with %d slots free and nobody waiting: %v", p.label, n, free, err)
		}
		m.newGrant(rt, "stream", l, 1)
		ctx, cancel = ctxFor(waitBound)
		err = l.Release(ctx)
		cancel()
		if err != nil {
			tsFatalf(rt, "stream of %s: Release: %v", p.label, err)
		}
		n++
	}
	rt.Logf("%s streamed %d grants over %v", p.label, n, tsStreamFor)
}

func (m *tsMachine) uncontendedStream(rt *rapid.T) {
	m.stream(rt, m.pickProc(rt, "stream_proc"))
}

// hold: a process takes a few slots and keeps them across actions.
func (m *tsMachine) hold(rt *rapid.T) {
	if len(m.held) >= tsMaxHeld {
		return
	}
	p := m.pickProc(rt, "hold_proc")
	n := rapid.IntRange(1, 3).Draw(rt, "hold_weight")
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	l, err := p.sem.TryAcquireN(ctx, n)
	if err != nil {
		tsFatalf(rt, "hold: TryAcquireN(%d) with %d of %d slots held and nobody waiting: %v", n, m.heldSum(), m.limit, err)
	}
	m.newGrant(rt, "hold", l, n)
	hl := &tsLease{label: m.label("L"), proc: p, l: l, weight: n}
	m.held = append(m.held, hl)
	rt.Logf("%s holds %s", p.label, hl)
}

func (m *tsMachine) release(rt *rapid.T) {
	if len(m.held) == 0 {
		return
	}
	i := rapid.IntRange(0, len(m.held)-1).Draw(rt, "release_lease")
	m.releaseHeld(rt, i)
}

func (m *tsMachine) releaseHeld(rt *rapid.T, i int) {
	l := m.held[i]
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	if err := l.l.Release(ctx); err != nil {
		tsFatalf(rt, "release %s: %v", l, err)
	}
	m.held = slices.Delete(m.held, i, i+1)
}

func (m *tsMachine) releaseAll(rt *rapid.T) {
	for len(m.held) > 0 {
		m.releaseHeld(rt, len(m.held)-1)
	}
}

// tsWaiter is one blocked AcquireN of a burst.
type tsWaiter struct {
	label  string
	proc   *tsProc
	weight int
	id     string // fair: learnt from the raw queue
	res    chan goResult
	got    redsem.Lease
	cancel func()
}

func (w *tsWaiter) String() string { return fmt.Sprintf("%s(%s)", w.label, w.proc.label) }

// burst: a holder takes every free slot, waiters of several processes queue
// one after another (each seen queued before the next comes), the holder
// releases. Fair: they are admitted strictly in arrival order, every queued
// waiter stands under a live session, none is evicted. Drawn before it: an
// uncontended stream by the process of the first waiter (the issue's
// A: stream, B holds, a1 b1 a2 queue).
func (m *tsMachine) burst(rt *rapid.T) {
	prelude := rapid.SampledFrom([]string{"none", "stream", "stream", "stream"}).Draw(rt, "prelude")
	k := rapid.IntRange(2, 5).Draw(rt, "waiters")
	ws := make([]*tsWaiter, k)
	for i := range ws {
		ws[i] = &tsWaiter{label: m.label("W"), proc: m.pickProc(rt, "waiter_proc"),
			weight: rapid.IntRange(1, 3).Draw(rt, "waiter_weight"), res: make(chan goResult, 1)}
	}
	holder := m.pickProc(rt, "holder_proc")
	if prelude == "stream" {
		m.stream(rt, ws[0].proc)
	}
	ctx, cancel := ctxFor(30 * time.Second)
	defer cancel()
	free := m.limit - m.heldSum()
	h, err := holder.sem.TryAcquireN(ctx, free)
	if err != nil {
		tsFatalf(rt, "burst: the holder's TryAcquireN(%d) with every other slot free: %v", free, err)
	}
	m.newGrant(rt, "burst holder", h, free)
	defer func() {
		for _, w := range ws {
			if w.cancel != nil {
				w.cancel()
			}
		}
	}()
	known := map[string]bool{}
	for _, w := range ws {
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		w.cancel = wcancel
		go func() {
			l, err := w.proc.sem.AcquireN(wctx, w.weight)
			w.res <- goResult{l, err}
		}()
		if m.fair {
			m.awaitQueued(rt, w, known, ws)
		}
	}
	if m.fair {
		m.checkQueue(rt, ws, "all queued")
	} else {
		m.awaitWant(rt, ws)
	}
	if err := h.Release(ctx); err != nil {
		tsFatalf(rt, "burst: the holder's Release: %v", err)
	}
	for _, w := range ws {
		select {
		case r := <-w.res:
			if r.err != nil {
				tsFatalf(rt, "burst: %s: AcquireN(%d) failed: %v", w, w.weight, r.err)
			}
			w.got = r.l
		case <-time.After(waitBound):
			tsFatalf(rt, "burst: %s still waiting %v after the holder released every slot", w, waitBound)
		}
	}
	// Admission order: tokens grow with every grant.
	for i, w := range ws {
		if m.fair && w.got.ID() != w.id {
			tsFatalf(rt, "burst: %s queued as %s but was granted lease %s", w, w.id, w.got.ID())
		}
		if m.fair && i > 0 && w.got.Token() < ws[i-1].got.Token() {
			var order []string
			sorted := slices.Clone(ws)
			slices.SortFunc(sorted, func(a, b *tsWaiter) int { return cmpInt(a.got.Token(), b.got.Token()) })
			for _, x := range sorted {
				order = append(order, x.String())
			}
			tsFatalf(rt, "burst (prelude %s): %s arrived before %s but was admitted after it: arrival order %v, admission order %v",
				prelude, ws[i-1], w, ws, order)
		}
	}
	tokens := slices.Clone(ws)
	slices.SortFunc(tokens, func(a, b *tsWaiter) int { return cmpInt(a.got.Token(), b.got.Token()) })
	for _, w := range tokens {
		m.newGrant(rt, "burst "+w.label, w.got, w.weight)
	}
	m.rawCheck(rt, "burst, every waiter granted")
	m.checkEvictions(rt)
	for _, w := range ws {
		if err := w.got.Release(ctx); err != nil {
			tsFatalf(rt, "burst: release %s: %v", w, err)
		}
	}
	rt.Logf("burst (prelude %s): %v admitted in order", prelude, ws)
}

// awaitQueued waits until the raw queue holds a new entry: w's (or until w
// returned, which it must not: the holder has every free slot).
func (m *tsMachine) awaitQueued(rt *rapid.T, w *tsWaiter, known map[string]bool, ws []*tsWaiter) {
	deadline := time.Now().Add(waitBound)
	for {
		select {
		case r := <-w.res:
			tsFatalf(rt, "burst: %s returned while every slot was held: %v", w, r.err)
		default:
		}
		ctx, cancel := ctxFor(waitBound)
		r, err := m.readRaw(ctx)
		cancel()
		if err != nil {
			tsFatalf(rt, "read keys: %v", err)
		}
		for _, z := range r.queue {
			id := z.Member.(string)
			if !known[id] {
				known[id] = true
				w.id = id
				m.checkQueue(rt, ws, w.label+" queued")
				return
			}
		}
		if time.Now().After(deadline) {
			tsFatalf(rt, "burst: %s did not queue within %v", w, waitBound)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkQueue checks the raw queue and Status against the waiters queued so
// far: the queue holds exactly them, in arrival order, each under a session
// that is live in Redis (its process is alive), and Status lists them all.
func (m *tsMachine) checkQueue(rt *rapid.T, ws []*tsWaiter, when string) {
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	r, err := m.readRaw(ctx)
	if err != nil {
		tsFatalf(rt, "read keys: %v", err)
	}
	var want []string
	byID := map[string]*tsWaiter{}
	for _, w := range ws {
		if w.id != "" {
			want = append(want, w.id)
			byID[w.id] = w
		}
	}
	var got []string
	for _, z := range r.queue {
		got = append(got, z.Member.(string))
	}
	name := func(ids []string) string {
		var s []string
		for _, id := range ids {
			if w := byID[id]; w != nil {
				s = append(s, w.String())
			} else {
				s = append(s, id)
			}
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	for _, id := range got {
		rec := r.meta[id]
		f := strings.Split(rec, "|")
		if len(f) < 2 || f[0] != "W" {
			tsFatalf(rt, "burst, %s: queue entry %s has record %q", when, name([]string{id}), rec)
		}
		if dl, ok := r.sessions[f[1]]; !ok || int64(dl) <= r.now {
			tsFatalf(rt, "burst, %s: %s is queued under session %s, which is dead in Redis (deadline %v, now %d) although its process is alive; queue %s",
				when, name([]string{id}), f[1], dl, r.now, name(got))
		}
	}
	if !slices.Equal(got, want) {
		tsFatalf(rt, "burst, %s: the queue is %s, arrival order %s", when, name(got), name(want))
	}
	st, err := m.obs.Status(ctx)
	if err != nil {
		tsFatalf(rt, "status: %v", err)
	}
	var listed []string
	for _, w := range st.Waiters {
		listed = append(listed, w.ID)
	}
	if !slices.Equal(listed, want) {
		tsFatalf(rt, "burst, %s: Status lists waiters %s, arrival order %s", when, name(listed), name(want))
	}
}

// awaitWant (unfair) waits until a waiter asked for freed-slot notices: at
// least one of the burst's waiters blocks.
func (m *tsMachine) awaitWant(rt *rapid.T, ws []*tsWaiter) {
	deadline := time.Now().Add(waitBound)
	for {
		ctx, cancel := ctxFor(waitBound)
		r, err := m.readRaw(ctx)
		cancel()
		if err != nil {
			tsFatalf(rt, "read keys: %v", err)
		}
		if want, _ := strconv.ParseInt(r.meta["_want"], 10, 64); want > r.now {
			return
		}
		for _, w := range ws {
			select {
			case res := <-w.res:
				tsFatalf(rt, "burst: %s returned while every slot was held: %v", w, res.err)
			default:
			}
		}
		if time.Now().After(deadline) {
			tsFatalf(rt, "burst: no waiter blocked within %v", waitBound)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// massExpiry: more holders than one expiry batch, of remote processes that
// die at once (raw grants never renewed), expire together; then a re-sent
// acquire of one of them and the release of another, each outside the
// expiry batches that ran before it. The re-sent acquire may be granted
// again; the release must report the lease lost. Then every slot comes back.
func (m *tsMachine) massExpiry(rt *rapid.T) {
	free := m.limit - m.heldSum()
	k := rapid.IntRange(tsBatch+1, free).Draw(rt, "expiring")
	acquireFirst := rapid.Bool().Draw(rt, "acquire_first")
	ctx, cancel := ctxFor(30 * time.Second)
	defer cancel()
	if err := m.loadScripts(ctx); err != nil {
		tsFatalf(rt, "load scripts: %v", err)
	}
	ids := make([]string, k)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	b := callStart()
	replies, err := m.pipelined(ctx, k, func(p redis.Pipeliner, i int) *redis.Cmd {
		return m.evalSha(ctx, p, lua.Acquire, rawAcquire(ids[i], 1, tsRawLeaseMs, "try", "-")...)
	})
	a := callEnd()
	if err != nil {
		tsFatalf(rt, "mass expiry: raw acquires: %v", err)
	}
	for i, v := range replies {
		if i64(v[0]) != 1 {
			tsFatalf(rt, "mass expiry: raw acquire %d of %d with %d slots free: reply %v", i, k, free, v)
		}
		m.grantOK(rt, "mass holder", []int{int(i64(v[4]))}, i64(v[2]), 1)
	}
	m.rawCheck(rt, "mass expiry, all granted")
	rt.Logf("mass expiry: %d raw holders granted in [%d,%d]", k, b, a)
	// Every one of them has certainly expired by then; nothing of the
	// test's runs a script meanwhile.
	time.Sleep(time.Until(time.UnixMilli(a + tsRawLeaseMs + guard)))
	r, err := m.readRaw(ctx)
	if err != nil {
		tsFatalf(rt, "read keys: %v", err)
	}
	var expired []string
	for _, z := range r.holders {
		if int64(z.Score) <= r.now {
			expired = append(expired, z.Member.(string))
		}
	}
	if len(expired) != k {
		rt.Logf("mass expiry: %d of %d still in holders (a script ran meanwhile)", len(expired), k)
	}
	if len(expired) == 0 {
		return
	}
	// The last in expiry order: outside the batches of the calls before it.
	target := func() string {
		id := expired[len(expired)-1]
		expired = expired[:len(expired)-1]
		return id
	}
	resend := func() {
		id := target()
		v, err := m.run(ctx, lua.Acquire, rawAcquire(id, 1, tsRawLeaseMs, "try", "-")...)
		if err != nil {
			tsFatalf(rt, "mass expiry: re-sent acquire: %v", err)
		}
		switch i64(v[0]) {
		case 1:
			m.grantOK(rt, "re-sent acquire of an expired lease", []int{int(i64(v[4]))}, i64(v[2]), 1)
			rt.Logf("mass expiry: re-sent acquire of an expired lease granted again: %v", v)
		case 0, -2:
		default:
			tsFatalf(rt, "mass expiry: re-sent acquire: reply %v", v)
		}
		m.rawCheck(rt, fmt.Sprintf("mass expiry of %d, after a re-sent acquire of an expired lease", k))
	}
	release := func() {
		id := target()
		v, err := m.run(ctx, lua.Release, id, "owner", tsRawLeaseMs)
		if err != nil {
			tsFatalf(rt, "mass expiry: release of an expired lease: %v", err)
		}
		if i64(v[0]) != core.ReleasedNothing {
			tsFatalf(rt, "mass expiry of %d: the release of a lease whose deadline had passed reported it released (kind %d), not lost", k, i64(v[0]))
		}
		m.rawCheck(rt, fmt.Sprintf("mass expiry of %d, after the release of an expired lease", k))
	}
	if acquireFirst {
		resend()
		if len(expired) > 0 {
			release()
		}
	} else {
		release()
		if len(expired) > 0 {
			resend()
		}
	}
	// Every slot comes back: once whatever the re-sent acquire got has
	// expired too, the free slots can all be taken at once, within as many
	// calls as expiry batches are needed (each call expires one batch).
	time.Sleep(time.Until(time.UnixMilli(callEnd() + tsRawLeaseMs + guard)))
	p := m.pickProc(rt, "proc")
	tries := (k+tsBatch-1)/tsBatch + 2
	var l redsem.Lease
	for i := 0; i < tries && l == nil; i++ {
		l, err = p.sem.TryAcquireN(ctx, free)
		if err != nil && !errors.Is(err, redsem.ErrNoSlot) {
			tsFatalf(rt, "mass expiry: TryAcquireN(%d): %v", free, err)
		}
	}
	if l == nil {
		r, _ := m.readRaw(ctx)
		tsFatalf(rt, "mass expiry of %d: every lease expired, yet %d tries of TryAcquireN(%d) found no room: slots leaked (_used %s, %d holder entries)",
			k, tries, free, r.meta["_used"], len(r.holders))
	}
	m.newGrant(rt, "every free slot after a mass expiry", l, free)
	if err := l.Release(ctx); err != nil {
		tsFatalf(rt, "mass expiry: release: %v", err)
	}
}

// rawSession makes a remote process's session that lives ms, and returns it.
func (m *tsMachine) rawSession(rt *rapid.T, ctx context.Context, ms int, age string, sid string) string {
	if sid == "" {
		sid = "raw" + strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	v, err := m.run(ctx, lua.Heartbeat, sid, ms, age)
	if err != nil || len(v) < 2 || i64(v[1]) != 1 {
		tsFatalf(rt, "raw heartbeat (%s): %v %v", age, v, err)
	}
	return sid
}

// rawQueue queues n single-slot waiters of session sid (a remote process),
// in one go; every reply must say queued, at its place.
func (m *tsMachine) rawQueue(rt *rapid.T, ctx context.Context, sid string, n, leaseMs int) []string {
	if err := m.loadScripts(ctx); err != nil {
		tsFatalf(rt, "load scripts: %v", err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	replies, err := m.pipelined(ctx, n, func(p redis.Pipeliner, i int) *redis.Cmd {
		return m.evalSha(ctx, p, lua.Acquire, rawAcquire(ids[i], 1, leaseMs, "queue", sid)...)
	})
	if err != nil {
		tsFatalf(rt, "raw queue: %v", err)
	}
	for i, v := range replies {
		if i64(v[0]) != 0 || i64(v[3]) != int64(i) {
			tsFatalf(rt, "raw waiter %d of %d: reply %v, want queued at position %d", i, n, v, i)
		}
	}
	return ids
}

// massAdmit (fair): one holder has every free slot, thousands of single-slot
// waiters of a live remote process queue, then one call admits them all:
// the holder's Release (limit raised first so that they fit), or a SetLimit
// that raises the limit. Then the call is sent again (go-redis re-sends a
// command whose reply was lost; a user retries). Every waiter gets its
// grant, no slot is held twice, no more than the limit is held, and the
// slots left over can be taken, and no more.
func (m *tsMachine) massAdmit(rt *rapid.T) {
	mode := rapid.SampledFrom([]string{"release", "setLimit"}).Draw(rt, "admit_by")
	n := rapid.SampledFrom([]int{4000, 2000, 4500}).Draw(rt, "admitted")
	const spare = 1000
	ctx, cancel := ctxFor(60 * time.Second)
	defer cancel()
	p := m.pickProc(rt, "proc")
	if mode == "release" {
		// The case: limit 5000, a holder of every slot, 4000 waiters.
		if err := p.sem.SetLimit(ctx, n+spare); err != nil {
			tsFatalf(rt, "SetLimit(%d): %v", n+spare, err)
		}
		m.limit = n + spare
	}
	free := m.limit - m.heldSum()
	h, err := p.sem.TryAcquireN(ctx, free)
	if err != nil {
		tsFatalf(rt, "mass admit: TryAcquireN(%d) of every free slot: %v", free, err)
	}
	m.newGrant(rt, "mass admit holder", h, free)
	sid := m.rawSession(rt, ctx, tsRawLong, "new", "")
	ps := m.admin.Subscribe(ctx, m.keys.Chan+":s:"+sid)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		tsFatalf(rt, "subscribe: %v", err)
	}
	msgs := ps.Channel(redis.WithChannelSize(n + 100))
	ids := m.rawQueue(rt, ctx, sid, n, tsRawLong)
	m.rawCheck(rt, fmt.Sprintf("mass admit, %d queued", n))

	var what string
	var callErr, retryErr error
	if mode == "release" {
		what = fmt.Sprintf("the Release of the holder of all %d slots, admitting %d waiters", m.limit, n)
		callErr = h.Release(ctx)
		if callErr != nil {
			retryErr = h.Release(ctx) // as a user would
		}
	} else {
		to := m.limit + n + spare
		what = fmt.Sprintf("SetLimit(%d) with %d waiters queued", to, n)
		callErr = p.sem.SetLimit(ctx, to)
		if callErr != nil {
			retryErr = p.sem.SetLimit(ctx, to)
		}
		m.limit = to
	}
	if callErr != nil {
		r, _ := m.readRaw(ctx)
		pr := r.problems(m.limit)
		msg := fmt.Sprintf("mass admit: %s: %v; retried: %v; then the keys: ", what, callErr, retryErr)
		tsFail(rt, msg+pr.Summary(), msg+pr.String())
	}
	m.rawCheck(rt, "mass admit, after "+what)
	// The call sent again.
	if mode == "release" {
		v, err := m.run(ctx, lua.Release, h.ID(), "owner", tsLeaseTTL.Milliseconds())
		if err != nil || i64(v[0]) != core.ReleasedLease || len(v) != 2 {
			tsFatalf(rt, "mass admit: the holder's release sent again: %.200v %v, want {1, now}: released, no grant", v, err)
		}
	} else if err := p.sem.SetLimit(ctx, m.limit); err != nil {
		tsFatalf(rt, "mass admit: SetLimit sent again: %v", err)
	}
	m.rawCheck(rt, "mass admit, after the call was sent again")
	// Every waiter is granted one slot, and told. The scripts may bound
	// their work per call: then the remote process's heartbeats admit the
	// rest, one batch per beat at least.
	tries := n/tsBatch + 2
	for try := 0; ; try++ {
		r := m.rawCheck(rt, "mass admit, admitting")
		if len(r.queue) == 0 {
			inH := map[string]bool{}
			for _, z := range r.holders {
				inH[z.Member.(string)] = true
			}
			for i, id := range ids {
				if !inH[id] {
					tsFatalf(rt, "mass admit: waiter %d of %d is neither queued nor a holder after %s", i, n, what)
				}
			}
			break
		}
		if try == tries {
			tsFatalf(rt, "mass admit: %d of %d waiters still queued after %s and %d heartbeats, with every slot they need free", len(r.queue), n, what, tries)
		}
		m.rawSession(rt, ctx, tsRawLong, "old", sid)
	}
	told := map[string]bool{}
	deadline := time.After(waitBound)
	for len(told) < n {
		select {
		case msg := <-msgs:
			if f := strings.Fields(msg.Payload); len(f) == 5 && f[0] == "g" {
				told[f[1]] = true
			}
		case <-deadline:
			tsFatalf(rt, "mass admit: %d of %d grants published within %v", len(told), n, waitBound)
		}
	}
	for _, id := range ids {
		if !told[id] {
			tsFatalf(rt, "mass admit: a grant was published for an id that did not wait")
		}
	}
	// The slots left over, and no more.
	left := m.limit - m.heldSum() - n
	if mode == "setLimit" {
		left -= free // the holder still holds its slots
	}
	q := m.otherProc(p)
	l, err := q.sem.TryAcquireN(ctx, left)
	if err != nil {
		tsFatalf(rt, "mass admit: TryAcquireN(%d) of the slots left free: %v", left, err)
	}
	m.newGrant(rt, "the slots left after a mass admit", l, left)
	m.rawCheck(rt, "mass admit, the rest taken")
	if x, err := q.sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		if x != nil {
			tsFatalf(rt, "mass admit: TryAcquire granted slot %d with every one of the %d slots held", x.Slot(), m.limit)
		}
		tsFatalf(rt, "mass admit: TryAcquire with every slot held: %v, want ErrNoSlot", err)
	}
	// Clean up: the remote process gives everything back and dies.
	if err := l.Release(ctx); err != nil {
		tsFatalf(rt, "release: %v", err)
	}
	if mode == "setLimit" {
		if err := h.Release(ctx); err != nil {
			tsFatalf(rt, "release the holder: %v", err)
		}
	}
	replies, err := m.pipelined(ctx, n, func(p redis.Pipeliner, i int) *redis.Cmd {
		return m.evalSha(ctx, p, lua.Release, ids[i], "force")
	})
	if err != nil {
		tsFatalf(rt, "raw releases: %v", err)
	}
	for _, v := range replies {
		if i64(v[0]) != core.ReleasedLease {
			tsFatalf(rt, "mass admit: the release of a granted raw waiter: %v", v)
		}
	}
	m.rawSession(rt, ctx, 1, "old", sid)
	if err := p.sem.SetLimit(ctx, m.base); err != nil {
		tsFatalf(rt, "SetLimit(%d): %v", m.base, err)
	}
	m.limit = m.base
	rt.Logf("mass admit by %s: %d waiters admitted", mode, n)
}

// massEvict (fair): a remote process queues thousands of waiters behind a
// holder of every free slot and dies; the holder's release then evicts them
// all (prune, or admit at the head). The release must succeed, the queue
// empty, and the keys stay consistent.
func (m *tsMachine) massEvict(rt *rapid.T) {
	n := rapid.SampledFrom([]int{8200, 1000}).Draw(rt, "evicted")
	ctx, cancel := ctxFor(60 * time.Second)
	defer cancel()
	p := m.pickProc(rt, "proc")
	free := m.limit - m.heldSum()
	h, err := p.sem.TryAcquireN(ctx, free)
	if err != nil {
		tsFatalf(rt, "mass evict: TryAcquireN(%d) of every free slot: %v", free, err)
	}
	m.newGrant(rt, "mass evict holder", h, free)
	sid := m.rawSession(rt, ctx, tsRawLong, "new", "")
	m.rawQueue(rt, ctx, sid, n, tsRawLong)
	m.rawCheck(rt, fmt.Sprintf("mass evict, %d queued", n))
	// The process dies: its last heartbeat gives it 1 ms.
	m.rawSession(rt, ctx, 1, "old", sid)
	time.Sleep(150 * time.Millisecond) // past the session's end and prune's 100 ms step
	if err := h.Release(ctx); err != nil {
		r, _ := m.readRaw(ctx)
		pr := r.problems(m.limit)
		msg := fmt.Sprintf("mass evict: the holder's Release, evicting %d waiters of a dead process: %v; then the keys: ", n, err)
		tsFail(rt, msg+pr.Summary(), msg+pr.String())
	}
	// Every dead waiter leaves the queue: in this release, or (should the
	// scripts bound their work per call) within one call per batch.
	tries := n/tsBatch + 2
	for try := 0; ; try++ {
		r := m.rawCheck(rt, fmt.Sprintf("mass evict of %d, after %d calls", n, try+1))
		if len(r.queue) == 0 {
			break
		}
		if try == tries {
			tsFatalf(rt, "mass evict: %d of %d dead waiters still queued after %d calls", len(r.queue), n, tries+1)
		}
		if _, err := m.run(ctx, lua.Release, uuid.NewString(), "force"); err != nil {
			tsFatalf(rt, "mass evict: a release: %v", err)
		}
	}
	rt.Logf("mass evict: %d dead waiters evicted", n)
}

// closeWhileRetrying: Redis dies; an Acquire with a context that never
// ends retries; Close must end it with ErrClosed within a second. For the
// fair variant the process's hub may be up first (a grant just before).
// Redis then comes back empty, and the closed process is replaced by a new
// one.
func (m *tsMachine) closeWhileRetrying(rt *rapid.T) {
	i := rapid.IntRange(0, len(m.procs)-1).Draw(rt, "closed_proc")
	warm := rapid.IntRange(0, 3).Draw(rt, "hub_up") != 3
	p := m.procs[i]
	m.releaseAll(rt) // everything is lost with the server anyway
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	if warm {
		l, err := p.sem.Acquire(ctx)
		if err != nil {
			tsFatalf(rt, "close: Acquire: %v", err)
		}
		m.newGrant(rt, "close warm-up", l, 1)
		if err := l.Release(ctx); err != nil {
			tsFatalf(rt, "close: Release: %v", err)
		}
	}
	m.srv.Kill(m.t)
	restarted := false
	defer func() {
		if !restarted {
			m.srv.Restart(m.t)
		}
	}()
	base := p.failed.Load()
	res := make(chan goResult, 1)
	go func() {
		l, err := p.sem.Acquire(context.Background())
		res <- goResult{l, err}
	}()
	// It retries: its client sees failed commands, or failed dials.
	for deadline := time.Now().Add(waitBound); p.failed.Load() < base+2; time.Sleep(2 * time.Millisecond) {
		select {
		case r := <-res:
			tsFatalf(rt, "close: Acquire with a context without end returned while Redis was down, before Close: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			tsFatalf(rt, "close: no failed call within %v of killing Redis (%d failed since)", waitBound, p.failed.Load()-base)
		}
	}
	closed := time.Now()
	closeDone := make(chan struct{})
	go func() {
		defer close(closeDone)
		_ = p.close()
	}()
	select {
	case r := <-res:
		if !errors.Is(r.err, redsem.ErrClosed) {
			tsFatalf(rt, "close (hub up %v): the retrying Acquire returned %v, want ErrClosed", warm, r.err)
		}
		rt.Logf("close: Acquire returned %v after %v", r.err, time.Since(closed))
	case <-time.After(tsCloseBound):
		m.srv.Restart(m.t)
		restarted = true
		var got goResult
		select {
		case got = <-res:
			if got.l != nil {
				_ = got.l.Release(ctx)
			}
		case <-time.After(waitBound):
			got.err = errors.New("still running")
		}
		<-closeDone
		tsFatalf(rt, "close (hub up %v): an Acquire retrying through a dead Redis was still running %v after Close (once Redis was back it returned lease %v, err %v)",
			warm, tsCloseBound, got.l != nil, got.err)
	}
	select {
	case <-closeDone:
	case <-time.After(waitBound):
		m.srv.Restart(m.t)
		restarted = true
		<-closeDone
		tsFatalf(rt, "close (hub up %v): Close itself still blocked %v after it was called, Redis down", warm, waitBound)
	}
	m.srv.Restart(m.t)
	restarted = true
	m.limit = m.base
	for deadline := time.Now().Add(waitBound); m.admin.Ping(ctx).Err() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			tsFatalf(rt, "no PING answer within %v after a restart", waitBound)
		}
	}
	m.procs[i] = m.newProc(rt, p.label+"'", tsLeaseTTL, 0, false)
	// The other processes' sessions were lost with the data: wait until
	// every hub has stopped or beaten since (a restart is not the quiet
	// stretch under test: waiters present at a restart may re-queue).
	time.Sleep(tsHubIdle + 100*time.Millisecond)
}

// fill takes, by process p, every free slot but n and returns the lease
// (nil when there is none to take).
func (m *tsMachine) fill(rt *rapid.T, ctx context.Context, p *tsProc, n int) redsem.Lease {
	k := m.limit - m.heldSum() - n
	if k == 0 {
		return nil
	}
	l, err := p.sem.TryAcquireN(ctx, k)
	if err != nil {
		tsFatalf(rt, "fill: TryAcquireN(%d) of every free slot but %d: %v", k, n, err)
	}
	m.newGrant(rt, "filler", l, k)
	return l
}

// afterGiveUp takes, for process q, the n slots of a lease that was lost at
// its deadline (its Done fired): they are given back in Redis right after
// (in the background, within min(100 ms, LeaseTTL/10)), not left to expire
// at Redis's deadline. So q's TryAcquireN(n) is granted soon; and when
// Redis's deadline (redisDl, server ms; 0: not checked) was well after the
// lease's Deadline() (localDl: 20 ms or more; the server runs on this
// machine's clock), before it: the grant's token is the server clock in µs.
func (m *tsMachine) afterGiveUp(rt *rapid.T, ctx context.Context, q *tsProc, n int, what string, redisDl int64, localDl time.Time) redsem.Lease {
	until := time.Now().Add(tsShortTTL + time.Second)
	if redisDl-localDl.UnixMilli() < 20 {
		redisDl = 0 // too close to tell a give-back from the expiry
	}
	for {
		l2, err := q.sem.TryAcquireN(ctx, n)
		if err == nil {
			if redisDl > 0 && l2.Token()/1000 >= redisDl {
				tsFatalf(rt, "%s: the lost lease's slots were granted again only at Redis's deadline (token %d, deadline %d): not given back", what, l2.Token(), redisDl)
			}
			return l2
		}
		if !errors.Is(err, redsem.ErrNoSlot) || time.Now().After(until) {
			tsFatalf(rt, "%s: TryAcquireN(%d) after the lost lease's Done() fired: %v (its slots are still held in Redis)", what, n, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// maxHold: every slot but n is held; a lease of n slots with MaxHold stops
// renewing and ends; once its Done fires, another process's TryAcquireN(n)
// must be granted soon: the slots are given back in Redis, not left to
// expire (afterGiveUp). Three rounds. In a paused round Redis is paused
// (CLIENT PAUSE) for 40 ms as the grant is sent, so that Redis's deadline
// is 40 ms after the one the lease computes from its send time (a request
// held up in a busy Redis): the slots must then be granted again before
// Redis's deadline.
func (m *tsMachine) maxHold(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "weight")
	paused := rapid.Bool().Draw(rt, "paused")
	p := m.pickProc(rt, "proc")
	q := m.otherProc(p)
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	filler := m.fill(rt, ctx, p, n)
	for round := 0; round < 3; round++ {
		if paused && round == 0 {
			if err := m.admin.Do(ctx, "CLIENT", "PAUSE", 40, "ALL").Err(); err != nil {
				tsFatalf(rt, "client pause: %v", err)
			}
		}
		l, err := m.mh.sem.TryAcquireN(ctx, n)
		if err != nil {
			tsFatalf(rt, "max hold: TryAcquireN(%d) with %d slots free: %v", n, n, err)
		}
		m.newGrant(rt, "max hold", l, n)
		var redisDl int64
		if paused && round == 0 {
			dl, err := m.admin.ZScore(ctx, m.keys.List[core.KeyHolders], l.ID()).Result()
			if err != nil {
				tsFatalf(rt, "max hold: the lease's holder entry: %v", err)
			}
			redisDl = int64(dl)
		}
		select {
		case <-l.Done():
		case <-time.After(tsMaxHold + 3*tsShortTTL + time.Second):
			tsFatalf(rt, "max hold: a lease with MaxHold %v and LeaseTTL %v not ended after %v", tsMaxHold, tsShortTTL, tsMaxHold+3*tsShortTTL+time.Second)
		}
		l2 := m.afterGiveUp(rt, ctx, q, n, fmt.Sprintf("max hold (paused %v)", paused && round == 0), redisDl, l.Deadline())
		m.newGrant(rt, "after max hold", l2, n)
		if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
			tsFatalf(rt, "max hold: Err() %v after Done, want ErrLeaseLost", l.Err())
		}
		m.releaseLeases(rt, ctx, l2)
	}
	m.releaseLeases(rt, ctx, filler)
}

// noRenewDeadline: like maxHold, with a DisableAutoRenew lease that nobody
// renews: its Done must close at its Deadline (within tsDoneSlack), and its
// slots be given back right after (afterGiveUp).
func (m *tsMachine) noRenewDeadline(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "weight")
	p := m.pickProc(rt, "proc")
	q := m.otherProc(p)
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	filler := m.fill(rt, ctx, p, n)
	l, err := m.nr.sem.TryAcquireN(ctx, n)
	if err != nil {
		tsFatalf(rt, "no renew: TryAcquireN(%d) with %d slots free: %v", n, n, err)
	}
	m.newGrant(rt, "no renew", l, n)
	select {
	case <-l.Done():
	case <-time.After(time.Until(l.Deadline().Add(tsDoneSlack))):
		tsFatalf(rt, "no renew: a DisableAutoRenew lease's Done() still open %v after its Deadline (err %v)", tsDoneSlack, l.Err())
	}
	l2 := m.afterGiveUp(rt, ctx, q, n, "no renew", 0, l.Deadline())
	m.newGrant(rt, "after no renew", l2, n)
	if !errors.Is(l.Err(), redsem.ErrLeaseLost) {
		tsFatalf(rt, "no renew: Err() %v after Done, want ErrLeaseLost", l.Err())
	}
	m.releaseLeases(rt, ctx, l2, filler)
}

func (m *tsMachine) releaseLeases(rt *rapid.T, ctx context.Context, ls ...redsem.Lease) {
	for _, l := range ls {
		if l == nil {
			continue
		}
		if err := l.Release(ctx); err != nil {
			tsFatalf(rt, "release: %v", err)
		}
	}
}

// drain ends a check: every held lease released, then nothing may be left
// in Redis but records that expire by themselves.
func (m *tsMachine) drain(rt *rapid.T) {
	m.releaseAll(rt)
	ctx, cancel := ctxFor(waitBound)
	defer cancel()
	raw, err := core.Inspect(ctx, m.admin, m.keys)
	if err != nil {
		tsFatalf(rt, "inspect: %v", err)
	}
	if raw.Live() {
		tsFatalf(rt, "leak: entries left after every lease was released: %+v", raw)
	}
	m.checkEvictions(rt)
}
