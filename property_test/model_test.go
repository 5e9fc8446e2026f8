package property_test

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"time"

	"github.com/redsem/redsem"
	"pgregory.net/rapid"
)

// The reference model. Redis runs on this machine, so its TIME and the
// test's time.Now read the same clock: a script that ran during a call ran
// at a server millisecond inside the call's window [b, a]. Every deadline
// the model knows is a span [lo, hi] of server milliseconds, so "expired"
// has three answers: certainly, certainly not, or maybe. The model asserts
// only what is certain.

// clockSlack widens every window by the millisecond truncation on both sides.
const clockSlack = 2

// forever is a deadline no test sequence reaches.
const forever = math.MaxInt64 / 4

// span is a server-time interval in ms: an event happened (or will) inside it.
type span struct{ lo, hi int64 }

// window is the span in which a call's script ran.
type window struct{ b, a int64 }

func callStart() int64 { return time.Now().UnixMilli() - clockSlack }
func callEnd() int64   { return time.Now().UnixMilli() + clockSlack }

// guard widens every "maybe" zone around a deadline. The windows above are
// exact, but a failure that happens only a millisecond past a deadline does
// not replay: shrinking drives a failing sequence towards the shortest one,
// which is the one closest to a deadline, and a replay a little slower or
// faster then passes ("flaky"). With the guard, a failure is asserted only
// when Redis had its deadline at least guard ms behind or ahead of it.
const guard = 25

// aliveThroughout: the end comes after every instant of w.
func (d span) aliveThroughout(w window) bool { return d.lo-guard > w.a }

// mayBeAliveAt: the end may come after the start of w.
func (d span) mayBeAliveAt(w window) bool { return d.hi+guard > w.b }

// endsWithin: the end may fall in (from, to].
func (d span) endsWithin(from, to int64) bool { return d.hi+guard > from && d.lo-guard <= to }

func after(w window, ms int64) span { return span{w.b + ms, w.a + ms} }

type kind int

const (
	kLease kind = iota // a lease from TryAcquire or Acquire, held by this process
	kGo                // a fair Acquire running in a goroutine: a live queued waiter
	kRaw               // a remote fair waiter queued by a raw script call that never heart-beats
)

// formerHandle is a handle of a lease that the resume action replaced:
// the process that held it keeps it, unused.
type formerHandle struct {
	l     redsem.Lease
	crash bool // a crash semaphore's (crashTTL, no renewal): it ends at its deadline, soon
}

type goResult struct {
	l   redsem.Lease
	err error
}

// entity is anything that holds, or may come to hold, slots: weight of
// them, all or nothing.
type entity struct {
	kind  kind
	label string // L3, W2, R1: how logs and failures name it
	id    string // "" until known (a kGo waiter's id is learnt from Status)

	lease redsem.Lease
	sem   redsem.Semaphore // the semaphore whose handle lease is
	// former are the handles of the lease that a resume replaced (another
	// process took it over): no longer used, each ends by itself.
	former  []formerHandle
	ttl     int64 // lease TTL in ms (of the handle in lease)
	death   span  // when its slot (or queue place) certainly ends; {0,0} once lost
	weight  int   // slots it asks for (AcquireN's n)
	granted bool  // its slots are known to have been granted
	slots   []int // ascending, len == weight
	token   int64
	floor   int64 // the highest token seen before it could be granted
	limitAt int   // the highest limit in force while it could have been granted
	// weightOut: the limit fell below its weight while it waited (SetLimit,
	// or a restart back to the clients' limit), so its AcquireN may end
	// with ErrWeight.
	weightOut bool
	arrival   int // fair queue order; -1 unknown (re-queued after a restart)

	gone bool // released or cancelled: Redis must never show it again
	// grantedBy: for an entity gone without being known granted, the
	// latest server ms at which Redis may have granted it unseen (a raw
	// waiter that SetLimit dropped, whose lease may have come and gone
	// before; an Acquire that was cancelled, whose grant the undo took
	// back): the grant still counts in the rate's window. 0: none.
	grantedBy int64
	localLost bool // the lease object knows it is lost: Renew/Release answer without Redis
	// handleDone: the handle was lost at its deadline and then released
	// (by redsem.Do, or a Release that answered ErrLeaseLost without asking
	// Redis): no action uses it again (a second Release returns nil), while
	// Redis may list the lease until its death (the give-up at the deadline
	// runs in the background, and undoes a late renewal only if it reaches
	// Redis).
	handleDone bool
	cancelled  bool

	// kGo only
	// requeued: Redis listed it (queued or holding) after the last loss of
	// every key, so its Acquire may no longer return a grant from before.
	requeued bool
	endErr   string // the error its Acquire returned
	pending  bool   // Acquire has not returned
	launched int64  // when Acquire was called (server ms)
	cancel   func()
	result   chan goResult
}

func (e *entity) String() string {
	s := e.label
	if e.granted {
		s += fmt.Sprintf("(slots %v token %d)", e.slots, e.token)
	} else if e.weight > 1 {
		s += fmt.Sprintf("(weight %d)", e.weight)
	}
	return s
}

// holds reports whether e certainly holds its slots throughout w, and
// whether it may hold them at the start of w.
func (e *entity) holds(w window) (certain, possible bool) {
	if e.gone {
		return false, false
	}
	switch e.kind {
	case kLease:
		return e.death.aliveThroughout(w), e.death.mayBeAliveAt(w)
	case kGo:
		if e.lease != nil || e.granted {
			return e.death.aliveThroughout(w), e.death.mayBeAliveAt(w)
		}
		return false, e.pending // may have been granted in the background
	case kRaw:
		return e.granted && e.death.aliveThroughout(w), e.death.mayBeAliveAt(w)
	}
	return false, false
}

// mayQueue reports whether e may stand in the fair queue at the start of w.
func (e *entity) mayQueue(w window) bool {
	if e.gone || e.granted {
		return false
	}
	switch e.kind {
	case kGo:
		return e.pending
	case kRaw:
		return e.death.mayBeAliveAt(w)
	}
	return false
}

// unstable matches what differs between two runs of one rapid test case:
// UUIDs, the random suffix of semaphore names, tokens and times.
var unstable = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|-[0-9a-f]{8}\b|\d{6,}`)

// fatalf logs the full message, then fails with a copy in which ids, tokens
// and times are blanked out: rapid accepts a smaller failing case only if it
// fails with the same message, so the message must not change between runs.
// The full message also goes to stderr at once: when rapid cannot replay a
// failure (a race), the log of the failing run is not shown, and the numbers
// are what tells the cause.
func fatalf(rt *rapid.T, format string, args ...any) {
	rt.Helper()
	msg := fmt.Sprintf(format, args...)
	rt.Log(msg)
	fmt.Fprintln(os.Stderr, "property failed:", msg)
	rt.Fatalf("%s", unstable.ReplaceAllString(msg, "#"))
}
