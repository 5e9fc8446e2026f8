package property_test

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The sequential specification that the linearizability checker
// (linearizability_test.go) holds histories against: a semaphore is the
// limit in force, the set of held leases (id -> slot, token) and the
// highest token issued so far. Only TryAcquire, Release, Status and
// SetLimit are called and leases outlive the history, so nothing expires
// and (fair) nobody ever queues: fair TryAcquire is specified as unfair's.
//
// Calls whose outcome the client cannot know (a Redis error, a reply lost
// by the proxy) are operations that return at the end of the history, so
// porcupine may place their effect anywhere after their call, or nowhere
// (at the very end). Their effect is modelled as the most permissive one:
//   - an unknown TryAcquire adds an anonymous lease: it may have been
//     granted (with an id, slot and token the client never learnt) and may
//     have been undone since. Anonymous leases are never counted as
//     certainly held; they only make a refusal (ErrNoSlot) legal, and let
//     Status show an id no client ever received, which then becomes an
//     orphan: a lease with a known slot and token that may vanish at any
//     time (its grant being undone);
//   - an unknown Release removes the lease; an unknown SetLimit sets it.
// With no fault injected there are no anonymous leases nor orphans, and
// the model is exact.
//
// Leases that may expire within a history (linHistory.ttl > 0: the
// partition tests) are ended by Redis's clock, at no call of the history:
// a lease granted by a TryAcquire called at c and returned at r lives in
// Redis until the server's clock reaches its grant time plus the TTL, so it
// is certainly held by any operation that returns before c + ttl, and
// certainly gone for any operation called after r + ttl (each with
// expirySlop for the server's millisecond clock). In between it may vanish
// at any time: the model makes it an orphan, as above. No lease is renewed
// in these histories.

// linKind is an operation's kind.
type linKind int

const (
	opTry linKind = iota
	opRelease
	opStatus
	opSetLimit
)

// linResult is how a call ended.
type linResult int

const (
	resOK linResult = iota
	resNoSlot
	resLeaseLost
	resUnknown // an error other than the specified ones: outcome unknown
)

// linIn is an operation's input.
type linIn struct {
	kind  linKind
	id    string // opRelease: the lease released
	limit int    // opSetLimit: the new limit
	// The operation's call and return, as porcupine has them (the model's
	// step does not see those): a lease expires by time.
	call, ret int64
}

// linHolder is one held lease, in the model or in a Status reply.
type linHolder struct {
	id     string
	slot   int
	token  int64
	orphan bool // model only: granted by a call of unknown outcome, or maybe expired; may vanish
	// model only, with a TTL: the lease may vanish (expire) at a call that
	// returns at expLo or later, and is gone at a call made after expHi.
	expLo, expHi int64
}

// linOut is an operation's output.
type linOut struct {
	res     linResult
	id      string      // opTry granted: the lease
	slot    int         // opTry granted
	token   int64       // opTry granted
	limit   int         // opStatus
	holders []linHolder // opStatus, sorted by id
	waiters int         // opStatus: queued waiters (fair)
}

// linState is the model's state. It is never modified once made.
type linState struct {
	limit  int
	maxTok int64
	anon   int         // leases that unknown TryAcquires may have granted
	held   []linHolder // sorted by id
}

func (s linState) find(id string) int {
	i, ok := slices.BinarySearchFunc(s.held, id, func(h linHolder, id string) int { return cmp.Compare(h.id, id) })
	if !ok {
		return -1
	}
	return i
}

// certain counts the leases that are certainly held.
func (s linState) certain() int {
	n := 0
	for _, h := range s.held {
		if !h.orphan {
			n++
		}
	}
	return n
}

func (s linState) with(h linHolder) linState {
	held := make([]linHolder, 0, len(s.held)+1)
	held = append(held, s.held...)
	held = append(held, h)
	slices.SortFunc(held, func(a, b linHolder) int { return cmp.Compare(a.id, b.id) })
	s.held = held
	return s
}

func (s linState) without(i int) linState {
	s.held = slices.Delete(slices.Clone(s.held), i, i+1)
	return s
}

// expirySlop covers the server clock's milliseconds (scripts read TIME
// truncated to the millisecond) and the difference between its wall clock
// and the recorder's monotonic one over a history.
const expirySlop = int64(5 * time.Millisecond)

// linSpec is the specification of one history: known holds every lease id
// that some TryAcquire of the history returned (only other ids may show up
// as orphans); ttl (ns) is the leases' TTL when they may expire within the
// history, 0 when none does.
type linSpec struct {
	known map[string]bool
	ttl   int64
}

func specOf(h linHistory) linSpec { return linSpec{known: h.known, ttl: int64(h.ttl)} }

// linModel returns the specification of history h.
func linModel(h linHistory) porcupine.Model {
	sp := specOf(h)
	return porcupine.Model{
		Init: func() any { return linState{limit: h.limit} },
		Step: func(st, in, out any) (bool, any) {
			next, reason := sp.step(st.(linState), in.(linIn), out.(linOut))
			return reason == "", next
		},
		Equal: func(a, b any) bool {
			x, y := a.(linState), b.(linState)
			return x.limit == y.limit && x.maxTok == y.maxTok && x.anon == y.anon && slices.Equal(x.held, y.held)
		},
		Hash: func(st any) uint64 {
			s := st.(linState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%d/%d", s.limit, s.maxTok, s.anon)
			for _, x := range s.held {
				fmt.Fprintf(h, "/%s:%d:%d:%t:%d", x.id, x.slot, x.token, x.orphan, x.expLo)
			}
			return h.Sum64()
		},
		DescribeOperation: describeOp,
		DescribeState:     describeState,
	}
}

// expire applies time to s for an operation called at call and returned at
// ret: leases certainly gone by its call are dropped, leases that may have
// expired by its return become orphans. Porcupine orders operations so
// that each takes effect after those before it, so what expired before one
// stays expired for the next.
func (s linState) expire(call, ret int64) linState {
	changed := false
	held := make([]linHolder, 0, len(s.held))
	for _, h := range s.held {
		if h.expHi > 0 {
			if call > h.expHi {
				changed = true // gone
				continue
			}
			if ret >= h.expLo && !h.orphan {
				h.orphan, changed = true, true
			}
		}
		held = append(held, h)
	}
	if changed {
		s.held = held
	}
	return s
}

// step is the specification of one operation: the next state, or why the
// operation cannot take effect in state s ("" when it can).
func (sp linSpec) step(s linState, in linIn, out linOut) (linState, string) {
	known := sp.known
	if sp.ttl > 0 {
		s = s.expire(in.call, in.ret)
	}
	switch in.kind {
	case opTry:
		switch out.res {
		case resUnknown:
			s.anon++
			return s, ""
		case resNoSlot:
			if n := len(s.held) + s.anon; n < s.limit {
				return s, fmt.Sprintf("TryAcquire refused (ErrNoSlot) with at most %d of %d slots held", n, s.limit)
			}
			return s, ""
		case resOK:
			if n := s.certain(); n >= s.limit {
				return s, fmt.Sprintf("TryAcquire granted %s with %d of %d slots held", short(out.id), n, s.limit)
			}
			if out.slot < 0 || out.slot >= s.limit {
				return s, fmt.Sprintf("TryAcquire granted slot %d outside [0, %d)", out.slot, s.limit)
			}
			if out.token <= s.maxTok {
				return s, fmt.Sprintf("TryAcquire granted token %d, not above %d issued before it", out.token, s.maxTok)
			}
			if s.find(out.id) >= 0 {
				return s, fmt.Sprintf("TryAcquire granted id %s, which is held already", short(out.id))
			}
			for i := 0; i < len(s.held); i++ {
				if h := s.held[i]; h.slot == out.slot {
					if !h.orphan {
						return s, fmt.Sprintf("TryAcquire granted slot %d, held by %s", out.slot, short(h.id))
					}
					s = s.without(i) // the orphan's grant was undone meanwhile
					i--
				}
			}
			h := linHolder{id: out.id, slot: out.slot, token: out.token}
			if sp.ttl > 0 {
				h.expLo, h.expHi = in.call+sp.ttl-expirySlop, in.ret+sp.ttl+expirySlop
			}
			s = s.with(h)
			s.maxTok = out.token
			return s, ""
		}
	case opRelease:
		i := s.find(in.id)
		switch out.res {
		case resUnknown:
			if i >= 0 {
				s = s.without(i)
			}
			return s, ""
		case resOK:
			if i < 0 {
				return s, fmt.Sprintf("Release of %s succeeded, but it is not held", short(in.id))
			}
			return s.without(i), ""
		case resLeaseLost:
			switch {
			case i >= 0 && s.held[i].orphan:
				return s.without(i), "" // it expired
			case i >= 0:
				return s, fmt.Sprintf("Release of %s said ErrLeaseLost, but it is held (and has not expired)", short(in.id))
			}
			return s, ""
		}
	case opSetLimit:
		s.limit = in.limit
		return s, ""
	case opStatus:
		if out.limit != s.limit {
			return s, fmt.Sprintf("Status says limit %d, the model %d", out.limit, s.limit)
		}
		if out.waiters != 0 {
			return s, fmt.Sprintf("Status shows %d waiters, but only TryAcquire is called", out.waiters)
		}
		slots := map[int]string{}
		for _, h := range out.holders {
			if other, dup := slots[h.slot]; dup {
				return s, fmt.Sprintf("Status shows %s and %s on slot %d", short(other), short(h.id), h.slot)
			}
			slots[h.slot] = h.id
		}
		shown := map[string]linHolder{}
		for _, h := range out.holders {
			shown[h.id] = h
		}
		next := linState{limit: s.limit, maxTok: s.maxTok}
		for _, h := range s.held {
			g, ok := shown[h.id]
			switch {
			case !ok && h.orphan:
				continue // undone
			case !ok:
				return s, fmt.Sprintf("Status misses %s (slot %d, token %d)", short(h.id), h.slot, h.token)
			case g.slot != h.slot || g.token != h.token:
				return s, fmt.Sprintf("Status shows %s with slot %d token %d, granted slot %d token %d",
					short(h.id), g.slot, g.token, h.slot, h.token)
			}
			next.held = append(next.held, h)
			delete(shown, h.id)
		}
		if len(shown) > 0 {
			extra := make([]string, 0, len(shown))
			for id := range shown {
				extra = append(extra, id)
			}
			sort.Strings(extra)
			for _, id := range extra {
				if known[id] {
					return s, fmt.Sprintf("Status shows %s, which no longer holds (or not yet)", short(id))
				}
			}
			if len(extra) > s.anon {
				return s, fmt.Sprintf("Status shows %d unknown holder(s) (%s), but at most %d call(s) of unknown outcome may have granted them",
					len(extra), short(extra[0]), s.anon)
			}
			for _, id := range extra {
				h := shown[id]
				h.orphan = true
				next = next.with(h)
				next.maxTok = max(next.maxTok, h.token)
			}
		}
		// Status shows every live holder: anonymous leases not shown are gone.
		return next, ""
	}
	return s, fmt.Sprintf("unexpected operation %v -> %v", in, out)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func describeOp(input, output any) string {
	in, out := input.(linIn), output.(linOut)
	res := map[linResult]string{resOK: "ok", resNoSlot: "ErrNoSlot", resLeaseLost: "ErrLeaseLost", resUnknown: "unknown"}[out.res]
	switch in.kind {
	case opTry:
		if out.res == resOK {
			return fmt.Sprintf("TryAcquire() -> %s slot %d token %d", short(out.id), out.slot, out.token)
		}
		return "TryAcquire() -> " + res
	case opRelease:
		return fmt.Sprintf("Release(%s) -> %s", short(in.id), res)
	case opSetLimit:
		return fmt.Sprintf("SetLimit(%d) -> %s", in.limit, res)
	case opStatus:
		var b strings.Builder
		fmt.Fprintf(&b, "Status() -> limit %d [", out.limit)
		for i, h := range out.holders {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s:%d:%d", short(h.id), h.slot, h.token)
		}
		b.WriteString("]")
		return b.String()
	}
	return "?"
}

func describeState(st any) string {
	s := st.(linState)
	var b strings.Builder
	fmt.Fprintf(&b, "limit %d, max token %d", s.limit, s.maxTok)
	if s.anon > 0 {
		fmt.Fprintf(&b, ", %d anonymous", s.anon)
	}
	for _, h := range s.held {
		fmt.Fprintf(&b, "; %s slot %d token %d", short(h.id), h.slot, h.token)
		if h.orphan {
			b.WriteString(" (orphan)")
		}
	}
	return b.String()
}
