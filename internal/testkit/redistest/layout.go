package redistest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The index of each key in the list ReadLayout takes: lua/lib_*.lua's KEYS
// order, the order of core.Keys.List (this package cannot import core,
// whose tests import it).
const (
	lkHolders = iota
	lkQueue
	lkSessions
	lkFree
	lkEnded
	lkMeta
	lkLimit
	lkWindow
	lkRate
	lkCount
)

// layoutSentinel is the member each sorted set keeps (core.Sentinel).
const layoutSentinel = "~"

// layoutMarginMs is the Lua library's MARGIN_MS: every key lives at least this long
// past the latest entry it holds.
const layoutMarginMs = 1000

// Layout is one consistent snapshot (one MULTI) of a semaphore's keys as
// lua/lib_*.lua lays them out, sentinels left out. Read it with ReadLayout,
// check it with Check.
type Layout struct {
	Now   int64 // server time, ms, read in the same MULTI
	NowUs int64 // the same, µs

	Meta     map[string]string // counters ("_" fields) and one record per id
	Holders  []redis.Z         // lease id -> deadline (ms)
	Queue    []redis.Z         // waiter id -> arrival number
	Sessions []redis.Z         // session id -> deadline (ms)
	Free     []string          // free slots below _hw
	Ended    []redis.Z         // tombstoned id -> until (ms)
	Window   []redis.Z         // grant record "token:n" -> token (µs)

	Limit, Rate       string // SetLimit's and SetRate's keys
	HasLimit, HasRate bool   // whether those keys exist
}

// ReadLayout reads the keys of one semaphore in one MULTI. keys are its
// nine keys in lua/lib_*.lua's KEYS order (core.Keys.List).
func ReadLayout(ctx context.Context, c redis.Cmdable, keys []string) (*Layout, error) {
	if len(keys) != lkCount {
		return nil, fmt.Errorf("redistest: ReadLayout wants %d keys, got %d", lkCount, len(keys))
	}
	var tm *redis.TimeCmd
	zs := map[int]*redis.ZSliceCmd{}
	var free *redis.StringSliceCmd
	var meta *redis.MapStringStringCmd
	var lim, rate *redis.StringCmd
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		for _, i := range []int{lkHolders, lkQueue, lkSessions, lkEnded, lkWindow} {
			zs[i] = p.ZRangeWithScores(ctx, keys[i], 0, -1)
		}
		free = p.ZRange(ctx, keys[lkFree], 0, -1)
		meta = p.HGetAll(ctx, keys[lkMeta])
		lim = p.Get(ctx, keys[lkLimit])
		rate = p.Get(ctx, keys[lkRate])
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	now := tm.Val()
	l := &Layout{Now: now.UnixMilli(), NowUs: now.UnixMicro(), Meta: meta.Val()}
	l.Limit, l.HasLimit = lim.Val(), lim.Err() == nil
	l.Rate, l.HasRate = rate.Val(), rate.Err() == nil
	strip := stripSentinel
	l.Holders = strip(zs[lkHolders].Val())
	l.Queue = strip(zs[lkQueue].Val())
	l.Sessions = strip(zs[lkSessions].Val())
	l.Ended = strip(zs[lkEnded].Val())
	l.Window = strip(zs[lkWindow].Val())
	for _, x := range free.Val() {
		if x != layoutSentinel {
			l.Free = append(l.Free, x)
		}
	}
	return l, nil
}

// stripSentinel returns the entries of a sorted set but its sentinel.
func stripSentinel(in []redis.Z) []redis.Z {
	var out []redis.Z
	for _, z := range in {
		if z.Member != layoutSentinel {
			out = append(out, z)
		}
	}
	return out
}

// LeaseRecord is a parsed meta record "L|token|s1,s2,...|owner", with
// "|r" after the owner once a process resumed the lease (Shared).
type LeaseRecord struct {
	Token  int64
	Slots  []int
	Owner  string
	Shared bool
}

// ParseLeaseRecord parses a lease record; ok is false for anything else.
func ParseLeaseRecord(rec string) (r LeaseRecord, ok bool) {
	f := strings.SplitN(rec, "|", 4)
	if len(f) != 4 || f[0] != "L" {
		return r, false
	}
	t, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return r, false
	}
	r.Token, r.Owner = t, f[3]
	if owner, ok := strings.CutSuffix(f[3], "|r"); ok {
		r.Owner, r.Shared = owner, true
	} else if strings.Contains(f[3], "|") {
		return r, false
	}
	for _, x := range strings.Split(f[2], ",") {
		s, err := strconv.Atoi(x)
		if err != nil {
			return r, false
		}
		r.Slots = append(r.Slots, s)
	}
	return r, true
}

// parseWaiterRecord parses "W|session|weight|lease_ms|owner" (the owner
// followed by "|n" for a waiter queued by a client without a total).
func parseWaiterRecord(rec string) (session string, weight int, ok bool) {
	f := strings.SplitN(rec, "|", 5)
	if len(f) != 5 || f[0] != "W" || f[1] == "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 1 {
		return "", 0, false
	}
	return f[1], n, true
}

// parseRate parses "limit/per_ms" (the Lua library's stored rate).
func parseRate(v string) (limit int, perMs int64, ok bool) {
	a, b, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.Atoi(a)
	p, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || l < 0 || p < 0 {
		return 0, 0, false
	}
	return l, p, true
}

// LayoutProblems is what Check found: for each kind of problem (a short
// text that does not change between runs), how often and up to two
// examples.
type LayoutProblems struct {
	count    map[string]int
	examples map[string][]string
}

func (p *LayoutProblems) add(kind, format string, args ...any) {
	if p.count == nil {
		p.count, p.examples = map[string]int{}, map[string][]string{}
	}
	p.count[kind]++
	if len(p.examples[kind]) < 2 {
		p.examples[kind] = append(p.examples[kind], fmt.Sprintf(format, args...))
	}
}

// OK reports whether no problem was found.
func (p LayoutProblems) OK() bool { return len(p.count) == 0 }

// Kinds returns the kinds of problem found, sorted.
func (p LayoutProblems) Kinds() []string {
	var kinds []string
	for k := range p.count {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// Summary names the kinds of problem found (stable between runs, for a
// rapid failure message).
func (p LayoutProblems) Summary() string { return strings.Join(p.Kinds(), "; ") }

// String gives each kind with its count and up to two examples.
func (p LayoutProblems) String() string {
	var s []string
	for _, k := range p.Kinds() {
		s = append(s, fmt.Sprintf("%s (%d times, e.g. %s)", k, p.count[k], strings.Join(p.examples[k], ", ")))
	}
	return strings.Join(s, "; ")
}

// Check checks the snapshot against every invariant of lua/lib_*.lua's
// layout that holds between script calls:
//
//   - no id both holds (holder entry) and waits (queue entry);
//   - every holder entry has a lease record ("L|token|slots|owner") and
//     every lease record a holder entry; every queue entry has a waiter
//     record ("W|session|weight|lease_ms|owner") and every waiter record a
//     queue entry; every waiter's session is listed in the sessions set;
//   - the slots of the lease records are distinct and below the
//     high-water mark _hw, the free set holds the others below _hw (each
//     slot below _hw is held or free, exactly once), and _used is the
//     number of slots held; _q is the number of queue entries;
//   - lease tokens are distinct and at most _token, and the keys (_token
//     with them) expire no sooner than the server clock passes _token (in
//     µs: _hz*1000 at least), so that a token granted after they expired,
//     the clock's, is above it; arrival numbers are distinct and at most
//     _seq;
//   - _next is at most every holder deadline (expiry work is skipped until
//     then) unless that work is due already; every holder deadline, session deadline and tombstone time
//     lies at least the Lua library's MARGIN_MS before the horizon _hz; every
//     tombstone ("R", "C", "S") has its entry in the ended set, so that
//     prune removes it;
//   - SetLimit's and SetRate's keys agree with their mirrors _fixed and
//     _frate;
//   - _rsum is at least what the window's grant records hold; under the
//     rate in force (_frate, else _rate), no window of its period
//     (t - per, t] over the records holds more than its limit (the records
//     are assumed made under that rate), and _rold is at most the oldest
//     record's time unless trimming is due;
//   - with limit > 0: the live holders (deadline after Now) hold at most
//     limit slots, each below limit. Pass 0 where the limit may have been
//     lowered below what live holders hold (SetLimit never takes slots
//     back).
func (l *Layout) Check(limit int) LayoutProblems {
	var p LayoutProblems
	if l.Meta["_hz"] == "" {
		if n := len(l.Holders) + len(l.Queue) + len(l.Free); n > 0 {
			p.add("keys partly expired", "meta is gone but %d holder, %d queue and %d free entries remain", len(l.Holders), len(l.Queue), len(l.Free))
		}
		return p
	}
	num := func(f string) (int64, bool) {
		v, ok := l.Meta[f]
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			p.add("counter not an integer", "%s is %q", f, v)
			return 0, false
		}
		return n, true
	}
	used, _ := num("_used")
	hw, _ := num("_hw")
	q, _ := num("_q")
	token, _ := num("_token")
	seq, _ := num("_seq")
	hz, _ := num("_hz")

	if token > hz*1000 {
		p.add("keys expire before the clock passes _token", "_token is %d µs, the horizon _hz %d ms", token, hz)
	}

	// Holders and their records.
	inH := map[string]bool{}
	owner := map[int]string{} // slot -> lease id
	tokens := map[int64]string{}
	var held, liveHeld int64
	minDeadline := math.Inf(1)
	for _, z := range l.Holders {
		id := z.Member.(string)
		inH[id] = true
		minDeadline = math.Min(minDeadline, z.Score)
		if int64(z.Score)+layoutMarginMs > hz {
			p.add("holder outlives the horizon _hz", "holder %s has deadline %d, _hz %d", id, int64(z.Score), hz)
		}
		rec, has := l.Meta[id]
		lr, ok := ParseLeaseRecord(rec)
		if !has || !ok {
			p.add("holder entry without a lease record", "holder entry %s has record %q", id, rec)
			continue
		}
		if o, dup := tokens[lr.Token]; dup {
			p.add("token shared by two leases", "%s and %s both have token %d", o, id, lr.Token)
		}
		tokens[lr.Token] = id
		if lr.Token > token {
			p.add("token above _token", "%s has token %d, _token is %d", id, lr.Token, token)
		}
		live := int64(z.Score) > l.Now
		held += int64(len(lr.Slots))
		if live {
			liveHeld += int64(len(lr.Slots))
		}
		for i, s := range lr.Slots {
			if i > 0 && lr.Slots[i-1] >= s {
				p.add("slots not ascending", "%s holds slots %v", id, lr.Slots)
			}
			if s < 0 || int64(s) >= hw {
				p.add("held slot outside [0, _hw)", "%s holds slot %d, _hw %d", id, s, hw)
			}
			if live && limit > 0 && s >= limit {
				p.add("live holder's slot not below the limit", "live %s holds slot %d, limit %d", id, s, limit)
			}
			if o, dup := owner[s]; dup {
				p.add("slot held twice", "slot %d is held by %s and by %s", s, o, id)
			}
			owner[s] = id
		}
	}
	if limit > 0 && liveHeld > int64(limit) {
		p.add("live holders hold more than the limit", "live holders hold %d slots, limit %d", liveHeld, limit)
	}
	if used != held {
		p.add("_used is not the slots held", "_used is %d, the lease records hold %d slots", used, held)
	}
	if len(l.Holders) > 0 {
		next := l.Meta["_next"]
		n, err := strconv.ParseFloat(next, 64)
		// Expiry work runs once _next has passed: _next may pass a holder's
		// deadline only when that work is due already (a full batch sets
		// _next to its time).
		if next == "inf" || err != nil || (n > minDeadline && n > float64(l.Now)) {
			p.add("_next above a holder deadline", "_next is %q, the earliest holder deadline %d, now %d", next, int64(minDeadline), l.Now)
		}
	}

	// The free set.
	freeSet := map[int]bool{}
	for _, x := range l.Free {
		s, err := strconv.Atoi(x)
		switch {
		case err != nil:
			p.add("bad free entry", "free entry %q is not a slot", x)
			continue
		case s < 0 || int64(s) >= hw:
			p.add("free slot outside [0, _hw)", "free slot %d, _hw %d", s, hw)
		case owner[s] != "":
			p.add("slot free and held", "slot %d is free and held by %s", s, owner[s])
		}
		freeSet[s] = true
	}
	if int64(len(owner)+len(freeSet)) != hw {
		var lost []int
		for s := 0; int64(s) < hw && len(lost) < 5; s++ {
			if owner[s] == "" && !freeSet[s] {
				lost = append(lost, s)
			}
		}
		p.add("slots neither held nor free", "%d slots held and %d free, _hw %d: %v are neither", len(owner), len(freeSet), hw, lost)
	}

	// The queue, its records and sessions.
	sessions := map[string]float64{}
	for _, z := range l.Sessions {
		sessions[z.Member.(string)] = z.Score
		if int64(z.Score)+layoutMarginMs > hz {
			p.add("session outlives the horizon _hz", "session %v has deadline %d, _hz %d", z.Member, int64(z.Score), hz)
		}
	}
	inQ := map[string]bool{}
	arrivals := map[int64]string{}
	for _, z := range l.Queue {
		id := z.Member.(string)
		inQ[id] = true
		if inH[id] {
			p.add("id both queued and holding", "%s is in the queue and the holders", id)
		}
		a := int64(z.Score)
		if o, dup := arrivals[a]; dup {
			p.add("arrival number shared", "%s and %s both have arrival %d", o, id, a)
		}
		arrivals[a] = id
		if a > seq {
			p.add("arrival above _seq", "%s has arrival %d, _seq is %d", id, a, seq)
		}
		rec := l.Meta[id]
		sid, _, ok := parseWaiterRecord(rec)
		if !ok {
			p.add("queue entry without a waiter record", "queue entry %s has record %q", id, rec)
			continue
		}
		if _, ok := sessions[sid]; !ok {
			p.add("waiter's session not listed", "waiter %s's session %s is not in the sessions set", id, sid)
		}
	}
	if q != int64(len(l.Queue)) {
		p.add("_q is not the queue's length", "_q is %d, the queue holds %d entries", q, len(l.Queue))
	}

	// Records without their entries, tombstones.
	ended := map[string]float64{}
	for _, z := range l.Ended {
		ended[z.Member.(string)] = z.Score
		if int64(z.Score)+layoutMarginMs > hz {
			p.add("tombstone outlives the horizon _hz", "ended %v until %d, _hz %d", z.Member, int64(z.Score), hz)
		}
	}
	for f, v := range l.Meta {
		switch {
		case strings.HasPrefix(f, "_"):
		case strings.HasPrefix(v, "L|") && !inH[f]:
			p.add("lease record without a holder entry", "lease record %s=%q", f, v)
		case strings.HasPrefix(v, "W|") && !inQ[f]:
			p.add("waiter record without a queue entry", "waiter record %s=%q", f, v)
		case v == "R" || v == "C" || v == "S":
			if _, ok := ended[f]; !ok {
				p.add("tombstone without an ended entry", "record %s=%q is never pruned", f, v)
			}
		}
	}

	// Mirrors of the settings.
	if fixed, ok := l.Meta["_fixed"]; ok != l.HasLimit || fixed != l.Limit {
		p.add("SetLimit's key and _fixed differ", "limit key %q (exists %v), _fixed %q (exists %v)", l.Limit, l.HasLimit, fixed, ok)
	}
	if frate, ok := l.Meta["_frate"]; ok != l.HasRate || frate != l.Rate {
		p.add("SetRate's key and _frate differ", "rate key %q (exists %v), _frate %q (exists %v)", l.Rate, l.HasRate, frate, ok)
	}

	// The rate's window.
	l.checkWindow(&p)
	return p
}

// checkWindow checks the grant records against the rate in force.
func (l *Layout) checkWindow(p *LayoutProblems) {
	type rec struct {
		t int64
		n int
		m string
	}
	var recs []rec
	sum := int64(0)
	for _, z := range l.Window {
		m := z.Member.(string)
		a, b, ok := strings.Cut(m, ":")
		t, err1 := strconv.ParseInt(a, 10, 64)
		n, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || float64(t) != z.Score {
			p.add("bad window record", "window record %q scored %v", m, z.Score)
			continue
		}
		recs = append(recs, rec{t, n, m})
		sum += int64(n)
	}
	if len(recs) == 0 {
		return
	}
	slices.SortFunc(recs, func(x, y rec) int {
		switch {
		case x.t < y.t:
			return -1
		case x.t > y.t:
			return 1
		}
		return 0
	})
	if rs, err := strconv.ParseInt(l.Meta["_rsum"], 10, 64); err != nil || rs < sum {
		p.add("_rsum below the window's records", "_rsum is %q, the records hold %d slots", l.Meta["_rsum"], sum)
	}
	v, ok := l.Meta["_frate"]
	if !ok {
		v, ok = l.Meta["_rate"]
	}
	if !ok {
		return
	}
	limit, perMs, valid := parseRate(v)
	if !valid || limit == 0 {
		return
	}
	per := perMs * 1000
	// Trimming runs once _rold is at most the window's start: _rold may
	// pass the oldest record only when that work is due already (a full
	// batch sets _rold to its cutoff).
	ro, err := strconv.ParseFloat(l.Meta["_rold"], 64)
	if err != nil || l.Meta["_rold"] == "inf" || (ro > float64(recs[0].t) && ro > float64(l.NowUs-per)) {
		p.add("_rold above the oldest window record", "_rold is %q, the oldest record %d, now %d µs", l.Meta["_rold"], recs[0].t, l.NowUs)
	}
	in := 0
	for i, j := 0, 0; j < len(recs); j++ {
		in += recs[j].n
		for recs[i].t <= recs[j].t-per {
			in -= recs[i].n
			i++
		}
		if in > limit {
			var s []string
			for _, r := range recs[i : j+1] {
				s = append(s, r.m)
			}
			p.add("rate window over its limit", "rate %s: the window (%d, %d] µs holds %d slots: %v", v, recs[j].t-per, recs[j].t, in, s)
		}
	}
}
