package core

import (
	"context"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"
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
// takes up to 4096); a batch of more is sent in several calls.
const renewBatchMax = 1000

// renewals is an engine's batching of its leases' renewals.
type renewals struct {
	mu    sync.Mutex
	busy  bool // a batch runs, on the goroutine of the fire that started it
	again bool // a renewal fell due while it ran: look again once it ended
}

// renewDue renews every lease of e that is due (or soon due), in one call
// per renewBatchMax leases. A fire that finds a batch running asks it to
// look again when it ends (its lease waits with due set), and returns.
func (e *Engine) renewDue() {
	r := &e.renewals
	r.mu.Lock()
	if r.busy {
		r.again = true
		r.mu.Unlock()
		return
	}
	r.busy = true
	r.mu.Unlock()
	for {
		if batch := e.dueLeases(); len(batch) > 0 {
			for len(batch) > 0 {
				k := min(len(batch), renewBatchMax)
				e.renewBatch(batch[:k])
				batch = batch[k:]
			}
		}
		r.mu.Lock()
		if !r.again {
			r.busy = false
			r.mu.Unlock()
			return
		}
		r.again = false
		r.mu.Unlock()
	}
}

// renewing is one lease's part of a batch: its operation's context and the
// deadline it had when the renewal started.
type renewing struct {
	l        *Lease
	ctx      context.Context
	deadline time.Time
}

// dueLeases starts the renewal of every lease of e whose watchdog asked for
// it (due) or whose renewal falls due within bounds.RenewWindow, when it may renew
// now: held, no operation in flight, auto-renewal on.
func (e *Engine) dueLeases() []renewing {
	e.leasesMu.Lock()
	all := make([]*Lease, 0, len(e.leases))
	for _, l := range e.leases {
		all = append(all, l)
	}
	e.leasesMu.Unlock()
	now := time.Now()
	soon := now.Add(bounds.RenewWindow(e.cfg.LeaseTTL))
	var batch []renewing
	for _, l := range all {
		l.mu.Lock()
		if l.state == held {
			l.capHold(now)
			if l.op == opNone && !l.noRenew && l.releasing == 0 && (l.due || !l.renewAt.After(soon)) {
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

// renewBatch sends the renewals of batch in one call, bounded by the
// earliest of their deadlines, and hands each lease its reply.
func (e *Engine) renewBatch(batch []renewing) {
	bound := batch[0].deadline
	ids := make([]string, len(batch))
	own := make([]func() bool, len(batch))
	for i, b := range batch {
		if b.deadline.Before(bound) {
			bound = b.deadline
		}
		ids[i] = b.l.id
		// A lease whose operation ends first (Release, its deadline) ends
		// its renewal at once: the reply is then not its to apply.
		own[i] = context.AfterFunc(b.ctx, func() { _ = b.l.endRenew(b.ctx, renewReply{}, b.ctx.Err(), true) })
	}
	ctx, cancel := context.WithDeadline(context.Background(), bound)
	defer cancel()
	replies, err := e.renewMany(ctx, ids)
	for i, b := range batch {
		if !own[i]() {
			continue // ended already, on its own
		}
		var r renewReply
		if err == nil {
			r = replies[i]
		}
		_ = b.l.endRenew(b.ctx, r, err, true)
	}
}
