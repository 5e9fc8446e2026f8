package core

import (
	"context"
	"errors"
	"sync"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core/wire"
)

// Leases by id. A lease lives in Redis as a holder entry and a record
// (token, slots, owner) under its id, and belongs to no process and no
// session once granted (a fair grant's deadline is bounded by its
// grantee's session only until its first renewal). So any process can take
// a handle of it: Resume renews the lease with renew.lua in its "resume"
// mode, which also answers the lease's token and slots, and makes a Lease
// of this engine from them, renewed by this process's watchdog like any
// other. Every handle renews, releases and fences the same lease:
//
//   - a renewal never moves the deadline in Redis earlier (renew.lua), so
//     no handle's Deadline is later than Redis's whatever the handles'
//     lease TTLs;
//   - a handle whose renewal finds the lease released by a holder (its "R"
//     tombstone) ends as released, quietly (wire.RenewReply.released);
//   - a handle that gives the lease up at its local deadline (no renewal:
//     DisableAutoRenew, MaxHold) releases it in Redis only if no other
//     handle renewed it since (release.lua's "expire" mode, Lease.expire).
//
// An engine keeps one Lease per id (leaseSet): Resume of an id it holds
// already returns that Lease, renewed.

// Resume returns the live lease id, granted by any process, as a lease of
// this engine (see redsem.Semaphore.Resume).
func (e *Engine) Resume(ctx context.Context, id string) (redsem.Lease, error) {
	if err := checkLeaseID(id); err != nil {
		return nil, err
	}
	if e.isClosed() {
		return nil, redsem.ErrClosed
	}
	e.use.busy() // a family keeps the member while the call runs
	defer e.use.idle()
	if l := e.leases.live(id); l != nil {
		switch err := l.Renew(ctx); {
		case err == nil:
			return l, nil
		case errors.Is(err, redsem.ErrLeaseLost), errors.Is(err, redsem.ErrReleased):
			return nil, noLease(e.who(), id)
		default:
			return nil, err
		}
	}
	r, err := e.door.Renew(ctx, e.cfg.Client, id, true)
	if err != nil {
		return nil, err
	}
	if !r.OK {
		return nil, noLease(e.who(), id)
	}
	l, fresh := newLease(e, id, r.Slots, r.Token, r.Deadline)
	if fresh {
		e.rep.emit(redsem.Event{Kind: redsem.EventResumed, LeaseID: id, Slot: l.slots[0], Token: l.token})
	}
	return l, nil
}

// noLease is Resume's error for an id that has no live lease of the
// semaphore who (Engine.who).
func noLease(who, id string) error {
	return wire.Errorf(redsem.ErrLeaseLost, "redsem: %s: no live lease %s (lost, released, or never granted)", who, id)
}

// leaseSet is an engine's live leases by id: Resume of an id held here
// returns the same Lease, and the watchdogs' renewals are made together
// over it (renewals.go). A lease enters when made (newLease) and leaves
// when it ends (finishLocked), under mu, which is taken after a lease's
// mu, never before it.
type leaseSet struct {
	mu sync.Mutex
	m  map[string]*Lease
}

// add registers l, unless the set has a live lease of its id already:
// that one is returned then (and l is not added).
func (s *leaseSet) add(l *Lease) (old *Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.m[l.id]; old != nil {
		return old
	}
	if s.m == nil {
		s.m = make(map[string]*Lease)
	}
	s.m[l.id] = l
	return nil
}

// live returns the live lease of id, or nil.
func (s *leaseSet) live(id string) *Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// forget drops an ended lease.
func (s *leaseSet) forget(l *Lease) {
	s.mu.Lock()
	if s.m[l.id] == l {
		delete(s.m, l.id)
	}
	s.mu.Unlock()
}

// maxIDLen is the longest id the scripts accept (id_arg in lib_args.lua).
const maxIDLen = 128

// checkLeaseID returns a *redsem.ConfigError (field "id") unless id is
// what the scripts accept as a lease id: 1 to 128 ASCII letters, digits
// and '-' (every ID a lease reports is a UUID).
func checkLeaseID(id string) error {
	if id == "" {
		return cfgErr("id", "empty lease id")
	}
	if len(id) > maxIDLen {
		return cfgErr("id", "lease id of %d bytes, at most %d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return cfgErr("id", "%q is not a lease id: only ASCII letters, digits and '-' (a lease's ID() is a UUID)", id)
		}
	}
	return nil
}
