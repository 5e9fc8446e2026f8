package core

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// What an engine tells: its events to the Observer and the Logger (emit),
// and the conditions of its client (Redis unreachable, a maxmemory-policy
// that may evict its keys) to the alerts that every engine of the client
// shares, logged at Warn. Package wire tells nothing: what its requests
// learn comes here through the engine's watch (answered).

// reporter is an engine's voice: its name as events and records say it,
// where they go, and its client's alerts. It is fixed when the engine is
// made (reporterFor).
type reporter struct {
	name, family string // the semaphore's name, and its family's (Engine.familyName)
	observer     redsem.Observer
	logger       *slog.Logger // Config.Logger: events go there only if set
	client       redis.UniversalClient
	alerts       *alerts
}

// reporterFor makes the reporter of e, once its settings and family are
// set.
func reporterFor(e *Engine) *reporter {
	return &reporter{name: e.cfg.Name, family: e.familyName(), observer: e.cfg.Observer, logger: e.cfg.Logger,
		client: e.cfg.Client, alerts: e.alerts}
}

// warn is where conditions (and the Debug records of the engine) are
// logged: Options.Logger, else slog.Default() as it is now.
func (r *reporter) warn() *slog.Logger {
	if r.logger != nil {
		return r.logger
	}
	return slog.Default()
}

// emit reports ev to the Observer and the Logger, if set. Both nil costs a
// pair of nil checks.
func (r *reporter) emit(ev redsem.Event) {
	if r.observer == nil && r.logger == nil {
		return
	}
	ev.Name, ev.Family = r.name, r.family
	if r.observer != nil {
		r.observer(ev)
	}
	if r.logger != nil {
		r.log(ev)
	}
}

func (r *reporter) log(ev redsem.Event) {
	level := slog.LevelDebug
	switch ev.Kind {
	case redsem.EventLeaseLost, redsem.EventWaiterEvicted, redsem.EventLimitMismatch, redsem.EventAcquireFailed:
		level = slog.LevelWarn
		// EventUnavailable and EventEvictionPolicy stay at Debug: the
		// conditions behind them are logged at Warn once a minute (alerts).
	}
	attrs := []slog.Attr{slog.String("semaphore", ev.Name)}
	if ev.Family != "" {
		attrs = append(attrs, slog.String("family", ev.Family))
	}
	if ev.LeaseID != "" {
		attrs = append(attrs, slog.String("lease", ev.LeaseID), slog.Int("slot", ev.Slot), slog.Int64("token", ev.Token))
	}
	if ev.Wait != 0 {
		attrs = append(attrs, slog.Duration("wait", ev.Wait))
	}
	if ev.Hold != 0 {
		attrs = append(attrs, slog.Duration("hold", ev.Hold))
	}
	if ev.Policy != "" {
		attrs = append(attrs, slog.String("maxmemory_policy", ev.Policy))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	r.logger.LogAttrs(context.Background(), level, "redsem: "+ev.Kind.String(), attrs...)
}

// A condition is a failure that a user must see without configuring
// anything: each is logged at Warn through Options.Logger, or
// slog.Default() when none is set, once when it starts, at most once a
// minute while it lasts, and once when it clears (if its start was
// logged).
//
// Whether a condition holds changes in one place, alerts (raise and
// clear), by the order of the evidence, not of its arrival: a failure
// seen before the latest sign that the condition does not hold is stale
// and changes nothing. After a restart of Redis, calls that were in
// flight across it, and go-redis handing back the dial error it kept from
// before it (it stops dialing for each command after repeated failures,
// until its background probe succeeds), fail after other calls have
// succeeded; without this the state flapped between "unreachable" and
// "reachable again" several times in the second after a restart. And a
// condition that starts again less than a minute after its last Warn is
// logged once that minute has passed, if it still holds, so that even a
// condition that truly comes and goes logs at most two records a minute.
type condition int

const (
	condUnreachable   condition = iota // Redis could not be reached
	condEvicting                       // maxmemory-policy may evict the keys
	condPolicyUnknown                  // the policy could not be read
	nConditions
)

// alerts is the state of the conditions of one Redis client: every engine
// of a process that uses the client shares it, so that an outage is logged
// once a minute per process and client, not once per semaphore.
type alerts struct {
	any    atomic.Bool // some condition is on: the fast path of clear
	mu     sync.Mutex
	on     [nConditions]bool
	told   [nConditions]bool      // on, and its start was logged
	logged [nConditions]time.Time // the latest Warn that it holds
	seen   [nConditions]time.Time // the latest evidence that it holds
	gone   [nConditions]time.Time // the latest evidence that it does not
	dials  *dialWatch             // the client's (one hook per client)
}

// dialWatch is a go-redis hook, added once to each client an engine uses,
// that keeps the client's latest failed dial and its latest successful
// one: go-redis retries a failed dial on its own, so a call abandoned at
// its context's end may never see the error itself, and its
// classification (ErrUnavailable or a timeout) asks here. It also tells
// the calls that give up at the first failed dial (onFailure). It does
// nothing to commands.
type dialWatch struct {
	mu  sync.Mutex
	err error
	at  time.Time // of err
	ok  time.Time // the latest dial that succeeded
	// probe dials the client's address without go-redis (nil: a client of
	// another type than *redis.Client). See ready.
	probe *dialProbe
	// giveUp holds what to call at the next dial that fails (refused, or
	// timed out: not one abandoned by its caller), by onFailure's id.
	giveUp map[uint64]func(error)
	nextID uint64
}

func (d *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.ok = time.Now()
			d.mu.Unlock()
			return c, err
		}
		// go-redis dials on a context of its own, which ends early only
		// by DialTimeout (a deadline) or when nobody waits any more.
		d.failed(ctx, err)
		return c, err
	}
}

// failed records err, a dial made on ctx that failed, and calls the
// functions given to onFailure when it failed on its own (refused, or
// timed out: not abandoned by its caller).
func (d *dialWatch) failed(ctx context.Context, err error) {
	failed := ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded)
	d.mu.Lock()
	if ctx.Err() == nil {
		d.err, d.at = err, time.Now()
	}
	var giveUp map[uint64]func(error)
	if failed && len(d.giveUp) > 0 {
		giveUp, d.giveUp = d.giveUp, nil
	}
	d.mu.Unlock()
	for _, f := range giveUp {
		f(err) // before go-redis sees the error, so that it retries nothing for them
	}
}

// dialProbe dials a *redis.Client's address as its pool would (its
// options' Dialer, which TLS included), without the pool: go-redis logs
// every request whose dials all failed ("failed to dial after 5
// attempts"), and its logger is the user's.
type dialProbe struct {
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	network, addr string
	timeout       time.Duration
}

func probeOf(c redis.UniversalClient) *dialProbe {
	rc, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	o := rc.Options()
	if o.Dialer == nil {
		return nil
	}
	return &dialProbe{dial: o.Dialer, network: o.Network, addr: o.Addr, timeout: o.DialTimeout}
}

func (p *dialProbe) try(ctx context.Context) error {
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	c, err := p.dial(ctx, p.network, p.addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// ready says whether a request may go to go-redis now. While the client's
// dials fail (the latest one failed, none succeeded since), the request
// dials the address itself first: it goes to go-redis only once that dial
// got through, and otherwise fails at once with the dial's error (which
// matches Unreachable), as go-redis would have failed it after dialing and
// logging. So redsem's retries and background work during an outage (a
// lease renewing, a release given up to the background, waiters asking
// again) do not flood go-redis's log, and a request made once Redis is
// back is never refused by an older failure. A client of another type
// than *redis.Client is always ready (its dials go to several nodes).
func (d *dialWatch) ready(ctx context.Context) error {
	if d == nil || d.probe == nil {
		return nil
	}
	if at, okSince := d.lastFailure(); at.IsZero() || okSince {
		return nil // no dial failed, or one succeeded since
	}
	err := d.probe.try(ctx)
	if err == nil {
		d.mu.Lock()
		d.ok = time.Now()
		d.mu.Unlock()
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err() // the caller gave up: its dial proves nothing
	}
	d.failed(ctx, err)
	return err
}

// onFailure calls f (at once: it must not block) with the error of the
// first dial of the client that fails after onFailure was called, unless
// stop was called first. go-redis dials on contexts of its own, so the
// dial that fails may have been made for another call of the client.
func (d *dialWatch) onFailure(f func(error)) (stop func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.giveUp == nil {
		d.giveUp = map[uint64]func(error){}
	}
	d.nextID++
	id := d.nextID
	d.giveUp[id] = f
	return func() {
		d.mu.Lock()
		delete(d.giveUp, id)
		d.mu.Unlock()
	}
}

func (d *dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lastFailure returns when the client's latest dial failed, and whether a
// dial succeeded after it.
func (d *dialWatch) lastFailure() (at time.Time, okSince bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at, d.ok.After(d.at)
}

// failedSince returns the client's latest dial error if it came after t,
// or shortly before t with no successful dial since (bounds.DialStale).
func (d *dialWatch) failedSince(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil && d.at.After(d.ok) && d.at.After(t.Add(-bounds.DialStale)) {
		return d.err
	}
	return nil
}

// alertsByClient maps a client, and on a cluster client the slot of the
// semaphore's keys, to its alerts (alertsKey): a cluster's masters fail one
// by one, so whether Redis answers is a matter of the slot (a per-client
// state would flap between "unreachable" and "reachable again" while one
// master is down). dialsByClient maps a client to its dial hook. A client
// of go-redis's types is known by a weak pointer, as libsByClient knows
// it: the maps keep no client alive, their entries go with it, and a new
// client that the allocator puts where a collected one was is a new key
// (they were keyed by its address, "%p", before: such a client got no
// hook, so its failed dials went unseen).
var alertsByClient, dialsByClient sync.Map

// alertsKey is the key of alertsByClient: the client's key (clientKey),
// and the slot of the semaphore's keys on a cluster client (-1 on others).
type alertsKey struct {
	client any
	slot   int
}

func alertsFor(c redis.UniversalClient, keys Keys) *alerts {
	switch c := c.(type) {
	case *redis.Client:
		return alertsOf(c, c, -1)
	case *redis.ClusterClient:
		return alertsOf(c, c, Slot(keys.List[0]))
	}
	a, _ := alertsByKey(c, c, -1) // another type: the maps keep it alive
	return a
}

// alertsOf is alertsFor for a client p of a type of go-redis, known by a
// weak pointer; its entries are deleted once it is collected.
func alertsOf[T any](p *T, c redis.UniversalClient, slot int) *alerts {
	key := weak.Make(p)
	a, added := alertsByKey(key, c, slot)
	if added {
		runtime.AddCleanup(p, func(k weak.Pointer[T]) {
			dialsByClient.Delete(k)
			alertsByClient.Range(func(ak, _ any) bool {
				if ak.(alertsKey).client == k {
					alertsByClient.Delete(ak)
				}
				return true
			})
		}, key)
	}
	return a
}

// alertsByKey returns the alerts of client c (known as key) for slot, made
// (with the client's dial hook, added once) if it had none; added reports
// that the hook was added now.
func alertsByKey(key any, c redis.UniversalClient, slot int) (a *alerts, added bool) {
	d, ok := dialsByClient.Load(key)
	if !ok {
		var loaded bool
		if d, loaded = dialsByClient.LoadOrStore(key, &dialWatch{probe: probeOf(c)}); !loaded {
			c.AddHook(d.(*dialWatch))
			added = true
		}
	}
	ak := alertsKey{client: key, slot: slot}
	if v, ok := alertsByClient.Load(ak); ok {
		return v.(*alerts), added
	}
	v, _ := alertsByClient.LoadOrStore(ak, &alerts{dials: d.(*dialWatch)})
	return v.(*alerts), added
}

// raise records evidence, from time at (zero: now), that cond holds: it
// changes nothing if at is not after the latest evidence that it does not
// (clear). It logs msg at Warn if cond was last logged bounds.AlertEvery ago (or
// never): when it starts, and at most once a minute while it lasts.
func (r *reporter) raise(cond condition, at time.Time, msg string, attrs ...slog.Attr) {
	a := r.alerts
	now := time.Now()
	if at.IsZero() {
		at = now
	}
	a.mu.Lock()
	if !at.After(a.gone[cond]) {
		a.mu.Unlock()
		return // stale: it held before what said it no longer does
	}
	a.seen[cond] = later(a.seen[cond], at)
	if !a.on[cond] {
		a.on[cond], a.told[cond] = true, false
	}
	log := now.Sub(a.logged[cond]) >= bounds.AlertEvery
	if log {
		a.logged[cond], a.told[cond] = now, true
	}
	a.any.Store(true)
	a.mu.Unlock()
	if log {
		attrs = append([]slog.Attr{slog.String("semaphore", r.name)}, attrs...)
		r.warn().LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
	}
}

// clear records evidence, from time at, that cond does not hold: cond
// ends if it held and at is after the latest evidence that it did, and
// msg is logged at Warn if its start was (Warn, so that whoever saw it
// start sees it end). While no condition holds, it costs an atomic load.
func (r *reporter) clear(cond condition, at time.Time, msg string) {
	a := r.alerts
	if !a.any.Load() {
		return
	}
	a.mu.Lock()
	a.gone[cond] = later(a.gone[cond], at)
	if !a.on[cond] || !at.After(a.seen[cond]) {
		a.mu.Unlock()
		return
	}
	told := a.told[cond]
	a.on[cond], a.told[cond] = false, false
	any := false
	for _, on := range a.on {
		any = any || on
	}
	a.any.Store(any)
	a.mu.Unlock()
	if told {
		r.warn().LogAttrs(context.Background(), slog.LevelWarn, msg, slog.String("semaphore", r.name))
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// unreachable records that a call could not reach Redis: now, or for a
// failed dial when the client's latest dial failed (go-redis hands back
// the error of its latest failed dial, without dialing, once dials keep
// failing), which is stale once a dial succeeded since.
//
// On a cluster client it also asks go-redis to reload the cluster's
// topology: go-redis learns of a new master only from a MOVED reply or its
// reload interval (a minute by default), so after a master died and its
// replica took over, the calls for its slots would keep dialling the dead
// node. go-redis runs one reload at a time, at most every 200 ms.
func (r *reporter) unreachable(err error) {
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	var at time.Time
	if wire.DialFailed(err) {
		var okSince bool
		if at, okSince = r.alerts.dials.lastFailure(); okSince && !at.IsZero() {
			return
		}
	}
	r.raise(condUnreachable, at, "redsem: Redis unreachable", slog.String("error", err.Error()))
}

// reached records that a request sent at sent got an answer from Redis.
func (r *reporter) reached(sent time.Time) {
	r.clear(condUnreachable, sent, "redsem: Redis reachable again")
}

// answered records what a request sent at sent learnt of Redis: that it
// answered (err nil, or an error of the request), or that it could not be
// reached (an error that matches Unreachable). Called where requests leave
// (the door's requests, through watch; the shard record, the replicas' WAIT), so that
// classifying an error (wire.Wrap, acquireErr) has no side effect.
func (r *reporter) answered(sent time.Time, err error) {
	switch {
	case err == nil:
		r.reached(sent)
	case wire.Unreachable(err):
		r.unreachable(err)
	}
}

// EvictingPolicy reports whether a maxmemory-policy may evict keys that have
// a TTL (all of a semaphore's keys but the SetLimit override have one).
func EvictingPolicy(policy string) bool {
	return strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-")
}

// policyCheck is the maxmemory-policy check, once per engine or family
// (a family's members share the root's).
type policyCheck struct {
	mu     sync.Mutex
	done   chan struct{} // nil: not started (or to be tried again); closed when it ended
	policy string
}

// check reads maxmemory-policy once (once per family), at the start of the
// engine's first acquire, on a goroutine of its own (at most a second)
// that no call waits for: it runs beside the first request instead of
// before or after it. A policy that can evict the semaphore's keys, and a
// server that refuses to tell (CONFIG GET not allowed), are reported (rep:
// EventEvictionPolicy, and a Warn record). A check that could not reach
// Redis, or that Redis did not let in (no or wrong credentials), runs
// again at the next acquire.
func (p *policyCheck) check(client redis.UniversalClient, rep *reporter) {
	p.mu.Lock()
	if p.done != nil {
		p.mu.Unlock()
		return // running, or done
	}
	done := make(chan struct{})
	p.done = done
	p.mu.Unlock()
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), bounds.PolicyCheck)
		defer cancel()
		v, err := client.ConfigGet(ctx, "maxmemory-policy").Result()
		switch {
		case err != nil && (wire.Unreachable(err) || wire.AuthError(err) || ctx.Err() != nil):
			// Not reached, or not let in (the acquire reports either):
			// nothing is known of the policy. Ask again next time.
			p.mu.Lock()
			p.done = nil
			p.mu.Unlock()
			return
		case wire.NoCommand(err):
			// A server without CONFIG (miniredis, some proxies): nothing
			// can be told, so nothing is raised; the event still says so.
			rep.warn().LogAttrs(context.Background(), slog.LevelDebug, "redsem: the server has no CONFIG GET: maxmemory-policy not checked",
				slog.String("semaphore", rep.name), slog.String("error", err.Error()))
			rep.emit(redsem.Event{Kind: redsem.EventEvictionPolicy, Err: err})
			return
		case err != nil:
			rep.raise(condPolicyUnknown, time.Time{}, "redsem: cannot read maxmemory-policy; make sure it is noeviction, or the semaphore's keys may be evicted",
				slog.String("error", err.Error()))
			rep.emit(redsem.Event{Kind: redsem.EventEvictionPolicy, Err: err})
			return
		}
		policy := v["maxmemory-policy"]
		p.mu.Lock()
		p.policy = policy
		p.mu.Unlock()
		if EvictingPolicy(policy) {
			rep.raise(condEvicting, time.Time{}, "redsem: Redis maxmemory-policy may evict the semaphore's keys; use noeviction",
				slog.String("maxmemory_policy", policy))
			rep.emit(redsem.Event{Kind: redsem.EventEvictionPolicy, Policy: policy})
		}
	}()
}

// MaxMemoryPolicy returns the policy read at first use ("" before that, or
// when the server does not allow CONFIG GET); it waits for a check in
// progress (at most a second).
func (e *Engine) MaxMemoryPolicy() string {
	p := e.policy
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.policy
}

// ready is the client's dialWatch.ready (always ready without alerts).
func (a *alerts) ready(ctx context.Context) error {
	if a == nil {
		return nil
	}
	return a.dials.ready(ctx)
}
