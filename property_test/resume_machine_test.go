package property_test

import (
	"errors"
	"slices"
	"time"

	"github.com/redsem/redsem"
	"pgregory.net/rapid"
)

// resume: a held lease is handed on (Resume by its id): one drawn among
// those held, or (one draw in three) a crash semaphore's lease granted for
// it. One draw in three the semaphore that holds it resumes it, and must return the very lease,
// renewed; else the other process's semaphore (its own engine and client)
// does, and the lease is used through its handle from then on, renewed to
// its TTL. The replaced handle is kept, unused (its process still holds
// it): a crash semaphore's gives the lease up at its deadline, which must
// leave the lease to the new handle (checkFormers); a normal one's would at
// its deadline, after the check. Resume succeeds
// exactly when a Renew would: the lease's slots, token and id come back.
func (m *machine) resume(rt *rapid.T) {
	var e *entity
	if rapid.IntRange(0, 2).Draw(rt, "resume_fresh") == 0 {
		// The handoff as the process that acquired does it: a lease of
		// the crash semaphore (which stops renewing) taken over at once.
		if e = m.tryAcquire(rt, true); e == nil {
			return // no slot
		}
	} else {
		e = m.pickHeld(rt)
	}
	sem := m.other
	same := rapid.IntRange(0, 2).Draw(rt, "resume_same") == 0
	if same {
		sem = e.sem
	}
	open := true
	select {
	case <-e.lease.Done():
		open = false
	default:
	}
	ctx, cancel := m.ctx()
	defer cancel()
	w := window{b: callStart()}
	l, err := sem.Resume(ctx, e.id)
	w.a = callEnd()
	expectLive(rt, "Resume", e, w, err)
	if err != nil {
		// The lease is gone from Redis (renew.lua's lost path ran expire()).
		m.lastWrite = w.b
		e.death = span{}
		rt.Logf("resume %s (same semaphore: %v): lost", e, same)
		trace("resume %s (same semaphore %v): lost", e.label, same)
		return
	}
	if l.ID() != e.id || l.Token() != e.token || !slices.Equal(l.Slots(), e.slots) {
		fatalf(rt, "Resume(%s) returned lease %s slots %v token %d, granted slots %v token %d", e, l.ID(), l.Slots(), l.Token(), e.slots, e.token)
	}
	if same && open && l != e.lease {
		fatalf(rt, "Resume(%s) by the semaphore that holds it returned another lease", e)
	}
	ttl := e.ttl
	if l != e.lease {
		e.former = append(e.former, formerHandle{l: e.lease, crash: e.sem == m.crash})
		e.lease, e.sem, e.localLost = l, sem, false
		if sem == m.other {
			ttl = normalTTL.Milliseconds()
		}
	}
	e.ttl = ttl
	// Renewed during w: a renewal never moves a deadline earlier.
	e.death = span{max(e.death.lo, w.b+ttl), max(e.death.hi, w.a+ttl)}
	rt.Logf("resumed %s (same semaphore: %v) until %v", e, same, e.death)
	trace("resume %s (same semaphore %v): resumed", e.label, same)
}

// checkFormers (at the end of a check): every replaced handle of the crash
// semaphore has given its lease up by its deadline: Done closed, Context
// ended, Err nil (it found the lease renewed by its new handle, or
// released through it) or ErrLeaseLost (its give-up, bounded by 8 ms here,
// got no answer in time, or the lease was lost). That the give-up left the
// lease to its new handle is what the model checks after every action
// (checkStatus: the lease is listed until its death, which the resume
// moved on); that it ends quietly when its call is answered, the root
// package's TestResumeOutlivesFirstHandle.
func (m *machine) checkFormers(rt *rapid.T) {
	for _, e := range m.ents {
		for _, f := range e.former {
			if !f.crash {
				continue // a normalTTL handle ends after the check
			}
			// Done first: a check that runs later than waitBound after the
			// deadline (after a long action) finds both ready, and a select
			// picks among ready cases at random.
			select {
			case <-f.l.Done():
			default:
				select {
				case <-f.l.Done():
				case <-time.After(time.Until(f.l.Deadline()) + waitBound):
					fatalf(rt, "%s: a replaced handle (deadline %v) still open %v after its deadline", e, f.l.Deadline(), waitBound)
				}
			}
			// Done closes first, the Context right after it under the
			// same lock (so that code woken by the Context finds Done
			// closed): a few instructions apart, not a wait.
			select {
			case <-f.l.Context().Done():
			case <-time.After(100 * time.Millisecond):
				fatalf(rt, "%s: a replaced handle's Context not ended 100 ms after Done", e)
			}
			switch err := f.l.Err(); {
			case err == nil:
				trace("%s: its replaced handle ended quietly", e.label)
			case errors.Is(err, redsem.ErrLeaseLost):
				trace("%s: its replaced handle ended lost", e.label)
			default:
				fatalf(rt, "%s: a replaced handle ended with %v", e, err)
			}
		}
	}
}
