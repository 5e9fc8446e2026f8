package core

import (
	"context"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
)

// Releases: a process sends its holders' releases of a semaphore together
// when they come faster than Redis answers. A release that finds none of
// the engine's in flight runs at once, on its caller's context, exactly as
// it would alone (release.lua). The releases that arrive while one is in
// flight wait for it to end, then go together in one call
// (releasemany.lua), on a goroutine of their own; those that arrive
// meanwhile wait for that call in turn. A process under load so makes
// fewer, larger release calls (one script admits the waiters that all of
// them let in), and one that releases a lease at a time makes the calls it
// always made. A call that Redis does not answer (its connection gone
// dead) holds the releases behind it at most bounds.ReleaseJoin: they then
// go in a call of their own, on another connection.
//
// Each lease's state keeps one owner, its mu: a release waits here only
// for its answer (its kind, or the call's error), which its Lease applies
// as any other release's (releaseOnce). A caller whose context ends
// returns at once, as one whose request is abandoned in flight: a release
// not sent yet is left out of its call, one sent may still release the
// lease in Redis; either way its lease is let go and its release retried
// in the background, as after any release that failed (Lease.releaseOnce).

// releaseBatch is an engine's releases: the calls in flight, and the
// releases that wait for the next.
type releaseBatch struct {
	e       *Engine // whose releases (set by complete)
	mu      sync.Mutex
	running int              // calls in flight
	queued  []*queuedRelease // wait for the next call
	join    *time.Timer      // sends queued at the latest ReleaseJoin after the first queued
	// joinAfter is bounds.ReleaseJoin, or what a test set (SetReleaseJoin).
	joinAfter time.Duration
}

// queuedRelease is one release waiting for the next call: the lease id,
// its release's context (a Lease op's: bounded by the lease's deadline) and
// where its answer goes.
type queuedRelease struct {
	id   string
	ctx  context.Context
	done chan releaseAnswer // buffered: the call never waits for the caller
}

type releaseAnswer struct {
	kind int
	err  error
}

// release releases lease id (release.lua's "owner" mode) and returns
// release.lua's kind, or the request's error; the grants its call made go
// to this process's waiters. ctx bounds the wait, as it bounds one call.
func (b *releaseBatch) release(ctx context.Context, id string) (int, error) {
	e := b.e
	b.mu.Lock()
	if b.running == 0 {
		b.running++
		b.mu.Unlock()
		r, err := e.door.Release(ctx, id, "owner")
		e.activeHub().deliverGrants(r.Grants)
		b.send(true)
		return r.Kind, err
	}
	q := &queuedRelease{id: id, ctx: ctx, done: make(chan releaseAnswer, 1)}
	b.queued = append(b.queued, q)
	if len(b.queued) == 1 {
		join := b.joinAfter
		if join == 0 {
			join = bounds.ReleaseJoin
		}
		b.join = time.AfterFunc(join, func() { b.send(false) })
	}
	b.mu.Unlock()
	select {
	case a := <-q.done:
		return a.kind, a.err
	case <-ctx.Done():
		select {
		case a := <-q.done: // answered as ctx ended: the answer stands
			return a.kind, a.err
		default:
		}
		return 0, wire.CallErr(e.door.Who, ctx, nil)
	}
}

// send sends the queued releases in one call on a goroutine of its own
// (the caller returns now); ended: a call in flight ended (else the join
// timer fired while calls are in flight).
func (b *releaseBatch) send(ended bool) {
	e := b.e
	b.mu.Lock()
	if ended {
		b.running--
	}
	batch := b.queued
	if len(batch) == 0 {
		b.mu.Unlock()
		return
	}
	b.queued = nil
	b.join.Stop()
	b.join = nil
	b.running++
	b.mu.Unlock()
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		b.sendBatch(batch)
		b.send(true)
	}()
}

// sendBatch sends the releases of batch whose callers still wait, in one
// call, and hands each its answer. The call is bounded by the latest of
// their contexts' deadlines (each ends at its lease's deadline, at the
// latest), not by the semaphore's Close: a lease released after Close is
// released, as Close promises.
func (b *releaseBatch) sendBatch(batch []*queuedRelease) {
	e := b.e
	live := batch[:0]
	var until time.Time // the latest deadline, if each has one
	bounded := true
	for _, q := range batch {
		if q.ctx.Err() != nil {
			continue // its caller returned: left out, as a request never sent
		}
		live = append(live, q)
		d, ok := q.ctx.Deadline()
		bounded = bounded && ok
		if d.After(until) {
			until = d
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if bounded {
		ctx, cancel = context.WithDeadline(ctx, until)
	}
	defer cancel()
	if len(live) == 1 {
		r, err := e.door.Release(ctx, live[0].id, "owner")
		e.activeHub().deliverGrants(r.Grants)
		live[0].done <- releaseAnswer{r.Kind, err}
		return
	}
	// At most releaseBatchMax ids a call (the script takes 4096); more go
	// in several calls at once.
	var wg sync.WaitGroup
	for len(live) > 0 {
		part := live[:min(len(live), releaseBatchMax)]
		live = live[len(part):]
		wg.Go(func() {
			ids := make([]string, len(part))
			for i, q := range part {
				ids[i] = q.id
			}
			kinds, grants, err := e.door.ReleaseMany(ctx, ids)
			e.activeHub().deliverGrants(grants)
			for i, q := range part {
				a := releaseAnswer{err: err}
				if err == nil {
					a.kind = kinds[i]
				}
				q.done <- a
			}
		})
	}
	wg.Wait()
}

// releaseBatchMax is the most lease ids in one releasemany.lua call.
const releaseBatchMax = 1000

// ReleasesQueued is how many releases of e wait for its next call (for
// tests that stage a call of several).
func ReleasesQueued(e *Engine) int {
	e.releases.mu.Lock()
	defer e.releases.mu.Unlock()
	return len(e.releases.queued)
}

// SetReleaseJoin sets how long at most a release of e waits for the call
// in flight (0: bounds.ReleaseJoin), for tests that stage a call of
// several.
func SetReleaseJoin(e *Engine, d time.Duration) {
	e.releases.mu.Lock()
	defer e.releases.mu.Unlock()
	e.releases.joinAfter = d
}
