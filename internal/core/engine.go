// Package core is the engine that the fair and unfair semaphores share. It
// is internal: the public surface is the root package redsem and the
// packages fair and unfair, built on it.
//
// Files, from the caller down to Redis:
//
//	engine.go       the Engine: construction, Close, SetLimit, SetRate, Status
//	acquire.go      one Acquire or TryAcquire call: its loop, its requests
//	                (attempt), retries, the undo of what a failed call left
//	session.go      the fair waiting room: fairWait, and the queue session
//	                (its id, its heartbeat, its replacement)
//	unfairwait.go   the unfair waiting room: unfairWait, the wake list and
//	                the rate's gate
//	hub.go          the per-process subscription of a semaphore (or family
//	                shard) and the registry of its local waiters
//	lease.go        a granted lease: one owner for its state, its watchdog
//	resume.go       Resume: a lease granted elsewhere, by its id
//	errors.go       how errors name the semaphore (who), and what an acquire
//	                call's error says (acquireErr) and may have left (needsUndo)
//	wire/           the script boundary (package wire, no engine, hub or
//	                logging in it): the Door, every script as one typed call
//	                (calls.go), the one way to Redis (door.go: FCALL, EVALSHA
//	                or EVAL, bounded by the caller's context), reply and
//	                message decoding, the server's clock, the FUNCTION
//	                library's state, and what every error means (errors.go)
//	(every time bound, and the retries' backoff: package internal/bounds)
//	functions.go    the FUNCTION library: when a client's calls use FCALL
//	family.go, shards.go, total.go, keys.go   keyed families and the key layout
//	config.go, observe.go, replicas.go, demand.go, inspect.go
package core

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
	"github.com/redsem/redsem/lua"
)

// Engine implements redsem.Semaphore for both variants.
type Engine struct {
	cfg  Config
	keys Keys
	pub  string // PUBLISH, or SPUBLISH on a cluster

	// door is the script boundary (package wire): every script call of
	// the engine goes through it.
	door *wire.Door

	rateHeld rateHold // until when the rate's window holds back the next grant (acquire.go)

	policy *policyCheck // the maxmemory-policy check (observe.go): a family's members share the root's
	rep    *reporter    // events and conditions: what the engine tells (observe.go)

	alerts *alerts       // conditions logged at Warn (shared by every engine of the client)
	lib    *wire.Library // whether the client's calls use FCALL (functions.go)

	variant variant // the variant's waiting strategy

	hubMu sync.Mutex
	hub   *hub

	leases   leaseSet     // the engine's live leases by id (resume.go), renewed together (renewals.go)
	releases releaseBatch // the holders' releases, sent together while one is in flight (releases.go)

	// stopped ends on Close (a family's, for its members): the one place
	// that says the semaphore is closed. Calls bind their context to it,
	// background work ends with it, and no hub is started once it ended.
	stopped context.Context
	stop    context.CancelFunc
	bg      sync.WaitGroup // background work (background): undos, give-ups, release retries, batched releases

	// A member of a keyed family shares the family's hub (hubMu and hub
	// above are unused) and is dropped from the family's map once idle
	// (use: nil for a semaphore of its own).
	fam   *Family
	shard *famShard // the member's shard: its hub
	use   *memberUse
}

// hubSlot returns where the engine's waiting machinery lives: the mutex
// and the hub pointer it guards; the engine's own, or its family shard's.
func (e *Engine) hubSlot() (*sync.Mutex, **hub) {
	if e.shard != nil {
		return &e.shard.mu, &e.shard.hub
	}
	return &e.hubMu, &e.hub
}

// variantFor is the variant's waiting strategy: the one place that the
// variant is chosen.
func variantFor(cfg Config) variant {
	if cfg.Fair {
		return fairWait{}
	}
	return unfairWait{}
}

// memberUse is how a family member is in use: it is dropped from the
// family's map once idle, with no call in flight and no live lease
// (active), for the family's idle period since used (unix ns).
type memberUse struct {
	active atomic.Int64
	used   atomic.Int64
}

// busy and idle bracket a call or a lease of a family member, so that the
// family keeps a member while it is in use (no-ops on a nil memberUse: a
// plain semaphore).
func (u *memberUse) busy() {
	if u != nil {
		u.active.Add(1)
	}
}

func (u *memberUse) idle() {
	if u != nil {
		u.used.Store(time.Now().UnixNano())
		u.active.Add(-1)
	}
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys := KeysFor(cfg.Prefix, cfg.Name)
	e := &Engine{cfg: cfg, keys: keys, pub: "PUBLISH", alerts: alertsFor(cfg.Client, keys), lib: wire.LibraryFor(cfg.Client)}
	e.stopped, e.stop = context.WithCancel(context.Background())
	e.variant = variantFor(cfg)
	if _, ok := cfg.Client.(*redis.ClusterClient); ok {
		e.pub = "SPUBLISH"
	}
	complete(e)
	return e, nil
}

// complete makes the parts of e that follow from its settings, keys and
// family, once those are set: its reporter, its policy check (a family's
// members share the root's) and its door.
func complete(e *Engine) {
	e.rep = reporterFor(e)
	e.policy = new(policyCheck)
	if e.fam != nil {
		e.policy = e.fam.root.policy
	}
	e.door = doorFor(e)
	e.releases.e = e
}

// doorFor makes the script boundary of e: what its calls send, how its
// errors name it, and where it reports what its requests learn (watch). A
// family's members (and its own engines) share the root's record of the
// scripts sent whole.
func doorFor(e *Engine) *wire.Door {
	d := &wire.Door{
		Client: e.cfg.Client, Keys: e.keys.Script(), Chan: e.keys.Chan, Pub: e.pub,
		Limit: e.cfg.Limit, Rate: e.cfg.Rate, LeaseTTL: e.cfg.LeaseTTL, QueueTTL: e.cfg.QueueTTL, Fallback: e.cfg.Fallback,
		Owner: e.cfg.Owner, MaxWaiters: e.cfg.MaxWaiters,
		Who: e.who(), Name: e.cfg.Name, Family: e.familyName(),
		Lib: e.lib, Sent: new(wire.Sent), Watch: watch{e},
	}
	if e.fam != nil {
		d.FamName, d.Total = e.fam.Name(), e.fam.total
		d.Sent = e.fam.root.door.Sent
	}
	if e.keys.Fam != nil {
		// A member of a family with a total: its client's total and variant.
		d.TotalArg = "+" + strconv.Itoa(e.fam.total) + ":" + e.variant.tag()
	}
	return d
}

// watch is the engine's side of its door (wire.Watch): the dial gate, the
// alerts that what a request learnt raises or clears, and the library load
// that a reply may start.
type watch struct{ e *Engine }

func (w watch) Ready(ctx context.Context) error    { return w.e.alerts.ready(ctx) }
func (w watch) Answered(sent time.Time, err error) { w.e.rep.answered(sent, err) }
func (w watch) Used()                              { w.e.loadLibrary() }

// Name is the semaphore's name.
func (e *Engine) Name() string { return e.cfg.Name }

// Keys returns the semaphore's keys (for tools and tests).
func (e *Engine) Keys() Keys { return e.keys }

// Close stops the background work of waiting (the wake-up subscription,
// the fair heartbeat, retries of undos and of failed releases). Leases
// already granted keep renewing until released.
//
// A family member's Close does nothing: its family's Close ends the shared
// machinery.
func (e *Engine) Close() error {
	if e.fam != nil {
		return nil
	}
	// The calls first (and no hub starts after this): shutdown waits for
	// a heartbeat in flight, which against a dead Redis may take its
	// whole bound.
	e.stop()
	e.hubMu.Lock()
	h := e.hub
	e.hub = nil
	e.hubMu.Unlock()
	if h != nil {
		h.shutdown()
	}
	return nil
}

// background runs fn on a goroutine of its own: the one way the engine does
// work that no caller waits for (an undo, a release retried, a library
// load). fn's context keeps ctx's values and ends at ctx's deadline (every
// piece of background work has one) or when the semaphore is closed;
// cancel (ctx's own) is called when fn returns. WaitBackground waits for it.
// What such work leaves unfinished must be harmless by design: Close never
// waits for a Redis that does not answer.
func (e *Engine) background(ctx context.Context, cancel context.CancelFunc, fn func(ctx context.Context)) {
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		defer cancel()
		stop := context.AfterFunc(e.stopped, cancel)
		defer stop()
		fn(ctx)
	}()
}

// WaitBackground waits until no background work runs (undos, give-ups,
// release retries: background), for tests that check what is left in Redis
// after an abandoned call.
func (e *Engine) WaitBackground() { e.bg.Wait() }

// isClosed reports whether Close (the family's, for a member) was called.
func (e *Engine) isClosed() bool { return e.stopped.Err() != nil }

// ForceRelease removes the lease or queue entry id, as an operator would:
// no tombstone is left, so the lease's holder learns at its next renewal
// that it was lost, and a removed waiter's process queues it again. It
// returns the kind of release (ReleasedLease, ReleasedWaiter or
// ReleasedNothing) and how many waiters it admitted into freed slots.
func (e *Engine) ForceRelease(ctx context.Context, id string) (kind, admitted int, err error) {
	r, err := e.door.Release(ctx, id, "force")
	e.activeHub().deliverGrants(r.Grants)
	return r.Kind, r.Admitted, err
}

// Status reads the live state. Like SetLimit and SetRate, it fails as soon
// as a dial of the client fails (failFast), as TryAcquire does.
func (e *Engine) Status(ctx context.Context) (st redsem.Status, err error) {
	err = e.failFast(ctx, func(ctx context.Context) error {
		st, err = e.door.Status(ctx)
		return err
	})
	return st, err
}

// failFast runs call within ctx, ended also by the first dial of the
// client that fails while it runs (refused, or timed out), whose error
// (matching redsem.ErrUnavailable) it then returns: a call that cannot
// reach Redis fails with its dial, as TryAcquire does, not at the end of
// its context (go-redis dials again and again meanwhile). Not on a cluster
// client, where one node may be down while the others answer.
func (e *Engine) failFast(ctx context.Context, call func(ctx context.Context) error) error {
	if _, cluster := e.cfg.Client.(*redis.ClusterClient); cluster || e.alerts == nil {
		return call(ctx)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := e.alerts.dials.onFailure(func(err error) { cancel(err) })
	defer stop()
	err := call(cctx)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		if cause := context.Cause(cctx); cause != nil && cause != cctx.Err() {
			e.rep.unreachable(cause)
			return wire.Wrap(e.who(), cause)
		}
	}
	return err
}

// SetLimit sets the limit for every client of this name.
func (e *Engine) SetLimit(ctx context.Context, limit int) error {
	if limit < 1 || limit > MaxLimit {
		return cfgErr("limit", "%d is outside [1, %d]", limit, MaxLimit)
	}
	return e.failFast(ctx, func(ctx context.Context) error {
		if err := e.fam.sameShards(ctx, e.who()); err != nil {
			return err
		}
		g, cancel, err := e.door.SetLimit(ctx, limit)
		return settled(ctx, e, g, cancel, err)
	})
}

// sameShards refuses to change a family member (who, as errors name it)
// whose family the Redis record says is spread over another number of
// shards (its keys here would be nobody's); a plain semaphore (a nil
// family) passes.
func (f *Family) sameShards(ctx context.Context, who string) error {
	if f == nil {
		return nil
	}
	if err := f.compareShards(ctx); err != nil {
		return wire.CallErr(who, ctx, err)
	}
	return nil
}

// SetRate sets the rate for every client of this name (the zero Rate
// removes the bound for all).
func (e *Engine) SetRate(ctx context.Context, rate redsem.Rate) error {
	rate, err := CheckRate("rate", rate)
	if err != nil {
		return err
	}
	return e.failFast(ctx, func(ctx context.Context) error {
		if err := e.fam.sameShards(ctx, e.who()); err != nil {
			return err
		}
		g, cancel, err := e.door.SetRate(ctx, rate)
		if err := settled(ctx, e, g, cancel, err); err != nil {
			return err
		}
		e.rateHeld.setRate(g.Now()) // what the former rate held back is no one's reason now
		return nil
	})
}

// settled ends a setting call (SetLimit, SetRate, a family's SetTotal): the
// grants it made go to local waiters, and a call whose caller gave up has
// its cancel run in the background, within bounds.CancelCall.
func settled(ctx context.Context, e *Engine, g wire.Grants, cancel wire.Cancel, err error) error {
	if cancel != nil {
		bctx, stop := context.WithTimeout(context.WithoutCancel(ctx), bounds.CancelCall)
		e.background(bctx, stop, cancel)
	}
	e.activeHub().deliverGrants(g)
	return err
}

// Script returns the runnable script for s (wire.Script): package fencing
// and the tests run the scripts that the engine does not with it.
func Script(s lua.Script) *redis.Script { return wire.Script(s) }

// Kinds of release that release.lua reports (ForceRelease), as package
// wire declares them.
const (
	ReleasedNothing = wire.ReleasedNothing // nothing live had the id (a lease: it was lost)
	ReleasedLease   = wire.ReleasedLease
	ReleasedWaiter  = wire.ReleasedWaiter
)
