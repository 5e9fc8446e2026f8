package core

import (
	"sync"
	"time"

	"github.com/redsem/redsem"
)

// DefaultIdleAfter is how long a family keeps a member that nobody uses.
const DefaultIdleAfter = time.Minute

// Family is a keyed family of semaphores: members made on demand per key,
// with the keys of KeysForMember, sharing one hub (one subscription, one
// fair session and its heartbeat) per process, and dropped from the
// family's map once idle. Dropping only forgets the Engine: one still
// referenced (by a caller or a live lease) keeps working, and Get makes a
// new one for the key.
type Family struct {
	root      *Engine // the family's validated settings; checks the eviction policy once
	idleAfter time.Duration

	mu     sync.Mutex // guards hub and closed (the members' hubSlot)
	hub    *hub
	closed bool

	mmu     sync.Mutex // guards members and sweep; never held with mu
	members map[string]*Engine
	sweep   *time.Timer
}

// NewFamily validates cfg (Name is the family's name) and returns a
// Family whose members have cfg's settings. idleAfter is how long a member
// with no call in flight and no live lease is kept; zero: DefaultIdleAfter.
func NewFamily(cfg Config, idleAfter time.Duration) (*Family, error) {
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
	return &Family{root: root, idleAfter: idleAfter, members: map[string]*Engine{}}, nil
}

// Name is the family's name.
func (f *Family) Name() string { return f.root.cfg.Name }

// Get returns the member for key, making it if the family has none (or
// dropped it as idle). key has the rules of a semaphore name (non-empty
// UTF-8, at most MaxNameLen bytes).
func (f *Family) Get(key string) (*Engine, error) {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return nil, redsem.ErrClosed
	}
	f.mmu.Lock()
	defer f.mmu.Unlock()
	if e := f.members[key]; e != nil {
		e.used.Store(time.Now().UnixNano())
		return e, nil
	}
	cfg := f.root.cfg
	cfg.Name = key
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, keys: KeysForMember(cfg.Prefix, f.root.cfg.Name, key), pub: f.root.pub,
		fam: f, stopped: f.root.stopped, stop: f.root.stop, alerts: f.root.alerts, lib: f.root.lib,
	}
	e.used.Store(time.Now().UnixNano())
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
		if e.active.Load() == 0 && e.used.Load() < cutoff {
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
	f.mu.Lock()
	h := f.hub
	f.hub = nil
	f.closed = true
	f.mu.Unlock()
	f.root.stop() // the members' calls and undo retries, before the hub's wait
	if h != nil {
		h.shutdown()
	}
	f.mmu.Lock()
	if f.sweep != nil {
		f.sweep.Stop()
		f.sweep = nil
	}
	f.members = map[string]*Engine{}
	f.mmu.Unlock()
	return nil
}
