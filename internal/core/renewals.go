package core

import (
	"context"
	"time"

	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// Renewals: a process renews all its leases of a semaphore together. Each
// lease's watchdog (Lease.fire) says when its renewal is due; the engine
// then renews, in one script call (renewmany.lua), every lease of its own
// that falls due within half a renewal interval (bounds.RenewWindow), the one
// that called included. Leases renewed together stay together (each next
// falls due a renewal interval after the call), so a process that holds a
// thousand leases of a semaphore makes one call per interval instead of a
// thousand. A lease renewed a little early loses nothing: its deadline
// only moves later.
//
// Each lease's state still has one owner, its mu: the batch starts each
// lease's renewal as its operation in flight (startOp), exactly as a
// renewal of its own would, and hands each lease its own reply (endRenew).
// A lease whose operation ends before the reply (a Release ends it, or its
// deadline passes) ends its part at once, on its own, and the reply, when
// it comes, is not applied to it: no lease waits on the others.

// renewBatchMax is the most lease ids in one renewmany.lua call (the script
// takes up to 4096); a batch of more is sent in several calls at once.
const renewBatchMax = 1000

// renewDue renews every lease of the set that is due (or soon due) and has
// no operation in flight, through d with lease TTL ttl, in one call per
// renewBatchMax leases, sent at once.
// Batches do not wait for each other: a lease that falls due while a call
// runs (one Redis has not answered, on a connection gone dead) goes in a
// call of its own, on another connection, and the leases in that call are
// not held up by it beyond bounds.RenewBy.
func (s *leaseSet) renewDue(d *wire.Door, ttl time.Duration) {
	batch := s.due(ttl)
	for len(batch) > renewBatchMax {
		go renewBatch(d, ttl, batch[:renewBatchMax])
		batch = batch[renewBatchMax:]
	}
	if len(batch) > 0 {
		renewBatch(d, ttl, batch)
	}
}

// renewing is one lease's part of a batch: its operation's context and the
// deadline it had when the renewal started.
type renewing struct {
	l        *Lease
	ctx      context.Context
	deadline time.Time
}

// due starts the renewal of every lease of the set whose watchdog asked for
// it (due) or whose renewal falls due within bounds.RenewWindow, when it may renew
// now: held, no operation in flight, auto-renewal on.
func (s *leaseSet) due(ttl time.Duration) []renewing {
	s.mu.Lock()
	all := make([]*Lease, 0, len(s.m))
	for _, l := range s.m {
		all = append(all, l)
	}
	s.mu.Unlock()
	now := time.Now()
	soon := now.Add(bounds.RenewWindow(ttl))
	var batch []renewing
	for _, l := range all {
		l.mu.Lock()
		if l.state == held {
			l.capHold(now)
			// A lease whose deadline passed is its timer's to end (lose):
			// in a call, it would bound the call by a time already past.
			if l.op == opNone && !l.noRenew && l.releasing == 0 && l.deadline.After(now) && (l.due || !l.renewAt.After(soon)) {
				batch = append(batch, renewing{l: l, deadline: l.deadline})
				l.due = false
				batch[len(batch)-1].ctx = l.startOp(context.Background(), opRenew)
			} else if l.due {
				l.due = false
				l.arm()
			}
		}
		l.mu.Unlock()
	}
	return batch
}

// renewBatch sends the renewals of batch through d in one call, bounded by the
// earliest of their bounds (bounds.RenewBy: a renewal window before
// the deadline, while two are left), and hands each lease
// its reply.
func renewBatch(d *wire.Door, ttl time.Duration, batch []renewing) {
	now := time.Now()
	var bound time.Time
	ids := make([]string, len(batch))
	own := make([]func() bool, len(batch))
	for i, b := range batch {
		if by := bounds.RenewBy(now, b.deadline, ttl); i == 0 || by.Before(bound) {
			bound = by
		}
		ids[i] = b.l.id
		// A lease whose operation ends first (Release, its deadline) ends
		// its renewal at once: the reply is then not its to apply.
		own[i] = context.AfterFunc(b.ctx, func() { _ = b.l.endRenew(b.ctx, wire.RenewReply{}, b.ctx.Err(), true) })
	}
	ctx, cancel := context.WithDeadline(context.Background(), bound)
	defer cancel()
	replies, err := d.RenewMany(ctx, ids)
	for i, b := range batch {
		if !own[i]() {
			continue // ended already, on its own
		}
		var r wire.RenewReply
		if err == nil {
			r = replies[i]
		}
		_ = b.l.endRenew(b.ctx, r, err, true)
	}
}
