package core

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/redsem/redsem"
)

// DefaultIdleAfter is how long a family keeps a member that nobody uses.
const DefaultIdleAfter = time.Minute

// Family is a keyed family of semaphores: members made on demand per key,
// with the keys of MemberKeys, spread over shards (hash tags) by ShardOf.
// The members of one shard share one hub per process (one subscription,
// one fair session and its heartbeat), so a process has at most one per
// shard it uses; members are dropped from the family's map once idle.
// Dropping only forgets the Engine: one still referenced (by a caller or a
// live lease) keeps working, and Get makes a new one for the key.
type Family struct {
	root      *Engine // the family's validated settings; checks the eviction policy once
	idleAfter time.Duration
	shards    []*famShard // len: the shard count
	// defaulted: the options left Shards zero (DefaultShards), for the
	// mismatch error's text.
	defaulted bool
	// total: FamilyOptions.Total, the slots held across all members at
	// once (0: the family counts no total, and its members' calls are
	// those of a family without one). famKeys: its keys (FamilyKeys), nil
	// without a total; famEng runs the family-level scripts on them.
	total   int
	famKeys []string
	famEng  *Engine

	// shardsOK: the shard count recorded in Redis was found equal to ours
	// (checkShards, once per Family).
	shardsOK atomic.Bool

	mmu     sync.Mutex // guards members, sweep and the shards' tags
	members map[string]*Engine
	sweep   *time.Timer
}

// famShard is one shard of a family: its hash tag and the waiting
// machinery (hub) that its members share in this process.
type famShard struct {
	tag    string  // ShardTag; "" until its first member is made (under mmu)
	alerts *alerts // its members' (per slot on a cluster); set with tag

	mu  sync.Mutex // guards hub (the members' hubSlot)
	hub *hub
}

// NewFamily validates cfg (Name is the family's name) and returns a
// Family whose members have cfg's settings. idleAfter is how long a member
// with no call in flight and no live lease is kept; zero: DefaultIdleAfter.
// shards is how many hash tags the members are spread over, at most
// MaxShards; zero: DefaultShards (one, whatever the client, so that a
// default never changes what a key means; see DefaultShards). total is
// the bound on the slots held across all members at once (0: none, and
// nothing is counted); a family with a total has one shard.
func NewFamily(cfg Config, idleAfter time.Duration, shards, total int) (*Family, error) {
	root, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if idleAfter < 0 {
		return nil, cfgErr("IdleAfter", "negative duration %v", idleAfter)
	}
	if idleAfter == 0 {
		idleAfter = DefaultIdleAfter
	}
	if shards < 0 || shards > MaxShards {
		return nil, cfgErr("Shards", "%d is not in [0, %d] (0: the default, %d)", shards, MaxShards, DefaultShards)
	}
	if total < 0 || total > MaxLimit {
		return nil, cfgErr("FamilyOptions.Total", "%d is not in [0, %d] (0: no total)", total, MaxLimit)
	}
	if total > 0 && shards > 1 {
		// Members of several shards live in several slots, which no one
		// script can count together; a total kept per shard, or borrowed
		// from one node, is not built: refuse rather than promise it.
		return nil, cfgErr("FamilyOptions.Total", "a total needs one shard, but FamilyOptions.Shards is %d: "+
			"a family with a total keeps every member in one hash slot (leave Shards 0 or 1)", shards)
	}
	defaulted := shards == 0
	if defaulted {
		shards = DefaultShards
	}
	f := &Family{root: root, idleAfter: idleAfter, members: map[string]*Engine{}, shards: make([]*famShard, shards), defaulted: defaulted}
	for i := range f.shards {
		f.shards[i] = &famShard{}
	}
	if total > 0 {
		f.total = total
		f.famKeys = FamilyKeys(root.cfg.Prefix, root.cfg.Name)
		base := root.cfg.Prefix + ":{" + EscapeTag(root.cfg.Name) + "}:f:"
		script := append(append([]string{}, f.famKeys...), base+"sessions")
		keys := Keys{Chan: base + "ch", Free: base + "ch:free", Fam: f.famKeys, script: script}
		f.famEng = &Engine{cfg: root.cfg, keys: keys, pub: root.pub, fam: f, stopped: root.stopped, stop: root.stop,
			alerts: root.alerts, lib: root.lib, variant: root.variant, use: new(memberUse)}
		complete(f.famEng)
	}
	return f, nil
}

// Total is the total the family was built with (FamilyOptions.Total; 0:
// none).
func (f *Family) Total() int { return f.total }

// Shards is the family's shard count.
func (f *Family) Shards() int { return len(f.shards) }

// Name is the family's name.
func (f *Family) Name() string { return f.root.cfg.Name }

// Get returns the member for key, making it if the family has none (or
// dropped it as idle). key has the rules of a semaphore name (non-empty
// UTF-8, at most MaxNameLen bytes).
func (f *Family) Get(key string) (*Engine, error) {
	if f.root.isClosed() {
		return nil, redsem.ErrClosed
	}
	f.mmu.Lock()
	defer f.mmu.Unlock()
	if e := f.members[key]; e != nil {
		e.use.used.Store(time.Now().UnixNano())
		return e, nil
	}
	cfg := f.root.cfg
	cfg.Name = key
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	i := ShardOf(key, len(f.shards))
	sh := f.shards[i]
	if sh.tag == "" {
		sh.tag = ShardTag(f.root.cfg.Name, i, len(f.shards))
	}
	keys := memberKeys(cfg.Prefix, sh.tag, key)
	if f.famKeys != nil {
		keys = keys.withFamily(f.famKeys)
	} else if len(f.shards) == 1 {
		// In the family's slot: the total's keys can be checked.
		keys = keys.withTotalCheck(FamilyKeys(cfg.Prefix, f.root.cfg.Name))
	}
	if sh.alerts == nil {
		sh.alerts = alertsFor(cfg.Client, keys)
	}
	e := &Engine{
		cfg: cfg, keys: keys, pub: f.root.pub,
		fam: f, shard: sh, stopped: f.root.stopped, stop: f.root.stop, alerts: sh.alerts, lib: f.root.lib,
		variant: f.root.variant, use: new(memberUse),
	}
	complete(e)
	e.use.used.Store(time.Now().UnixNano())
	f.members[key] = e
	if f.sweep == nil {
		f.sweep = time.AfterFunc(f.idleAfter/2, f.dropIdle)
	}
	return e, nil
}

// Len is how many members the family keeps now.
func (f *Family) Len() int {
	f.mmu.Lock()
	defer f.mmu.Unlock()
	return len(f.members)
}

// dropIdle forgets the members idle for idleAfter, and runs again every
// idleAfter/2 while the family has members.
func (f *Family) dropIdle() {
	cutoff := time.Now().Add(-f.idleAfter).UnixNano()
	f.mmu.Lock()
	defer f.mmu.Unlock()
	if f.sweep == nil {
		return // closed
	}
	for k, e := range f.members {
		if e.use.active.Load() == 0 && e.use.used.Load() < cutoff {
			delete(f.members, k)
		}
	}
	if len(f.members) == 0 {
		f.sweep = nil
		return
	}
	f.sweep.Reset(f.idleAfter / 2)
}

// Close stops the shared waiting machinery: Acquire calls of every member
// blocked at the time leave their queue and return redsem.ErrClosed, as do
// later calls; Get returns redsem.ErrClosed. Leases already granted keep
// working.
func (f *Family) Close() error {
	f.root.stop() // the members' calls and undo retries, before the hubs' wait; no hub starts after it
	var hubs []*hub
	for _, sh := range f.shards {
		sh.mu.Lock()
		if sh.hub != nil {
			hubs = append(hubs, sh.hub)
			sh.hub = nil
		}
		sh.mu.Unlock()
	}
	// In parallel: each waits at most bounds.Shutdown.
	var wg sync.WaitGroup
	for _, h := range hubs {
		wg.Go(h.shutdown)
	}
	wg.Wait()
	f.mmu.Lock()
	if f.sweep != nil {
		f.sweep.Stop()
		f.sweep = nil
	}
	f.members = map[string]*Engine{}
	f.mmu.Unlock()
	return nil
}
