package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// snapshot is what status and watch show of one semaphore. Times are by the
// Redis server's clock.
type snapshot struct {
	Name string `json:"name"`
	// Kind is what Name is: kindSemaphore, kindMember (with --key) or
	// kindFamily (without --key, a keyed family with members or a total in
	// Redis and no semaphore of that name with state of its own).
	Kind   string `json:"kind"`
	Family string `json:"family,omitempty"` // with --key: Name is a member of this family
	// Total: the family's total (FamilyOptions.Total) and its use, when it
	// has one (NAME is a family whose clients were built with a total).
	Total      *familyTotal `json:"total,omitempty"`
	Prefix     string       `json:"prefix"`
	ServerTime time.Time    `json:"server_time"`
	// Live is false when none of the semaphore's keys but the set-limit
	// override exists: nobody holds, waits or has established a limit. For
	// a family (Kind kindFamily): false unless a member has keys in Redis
	// or the total counts slots held or queued.
	Live bool `json:"live"`
	// Limit is the limit in force, nil when unknown (no live state and no
	// set-limit override: the first client to acquire establishes it), and
	// for a family, whose members each have their own (Members[].Limit).
	Limit       *int   `json:"limit"`
	LimitSource string `json:"limit_source"` // "set-limit", "established" or "unknown"
	Established *int   `json:"established_limit,omitempty"`
	Override    *int   `json:"set_limit,omitempty"`
	// Rate is the rate in force ("60/1m"; empty: none), RateGranted the
	// slots granted in its window ending now.
	Rate        string `json:"rate,omitempty"`
	RateGranted int    `json:"rate_granted,omitempty"`
	// EstablishedRate is the rate live clients were built with ("none":
	// without one; empty: unknown), SetRate the one set-limit --rate set
	// for all (empty: none set).
	EstablishedRate string      `json:"established_rate,omitempty"`
	SetRate         string      `json:"set_rate,omitempty"`
	rate            redsem.Rate // the rate in force

	Holders []holderInfo `json:"holders"`
	Waiters []waiterInfo `json:"waiters"`

	// LeaseTTLMs is the LeaseTTL that holders were checked against, 0 if
	// unknown; LeaseTTLSource says where it came from.
	LeaseTTLMs     int64  `json:"lease_ttl_ms,omitempty"`
	LeaseTTLSource string `json:"lease_ttl_source,omitempty"`

	// Members (status without --key) are the busiest members of the
	// keyed family of the same name, if it has any; MemberCount is how many
	// members have keys in Redis.
	Members     []core.Member `json:"members,omitempty"`
	MemberCount int           `json:"member_count,omitempty"`
	// MembersSlotsHeld and MembersQueued are the sums of the counters of
	// every member found (not only those listed): slots held (expired
	// holders included until a script removes them) and fair queue entries.
	MembersSlotsHeld *int `json:"members_slots_held,omitempty"`
	MembersQueued    *int `json:"members_queued,omitempty"`

	// UnfairWaitersUntil is set while unfair waiters wait: the latest time
	// until which they asked for freed-slot notices (the semaphore's, or
	// any member's or the total's of a family). Redis stores no unfair
	// waiter, nor which variant its clients are: this is the only sign of
	// them, and it does not tell how many there are.
	UnfairWaitersUntil *time.Time `json:"unfair_waiters_until,omitempty"`

	MaxMemoryPolicy string   `json:"maxmemory_policy,omitempty"`
	Warnings        []string `json:"warnings"`
	Notes           []string `json:"notes,omitempty"`

	present []string // the semaphore's keys that exist (for purge)
}

// What a snapshot shows (snapshot.Kind).
const (
	kindSemaphore = "semaphore"
	kindMember    = "member" // a member of a keyed family (--key)
	kindFamily    = "family" // a keyed family, all of its members
)

// familyTotal is a keyed family's total and its use (redsem.FamilyStatus,
// with the JSON keys of the rest of the snapshot).
type familyTotal struct {
	Total     int `json:"total"`      // the bound in force; 0: none (SetTotal 0)
	SlotsHeld int `json:"slots_held"` // slots of the live leases of all members
	// Queued is the entries of all members' fair queues (those of dead
	// processes included until they are evicted): Redis stores no unfair
	// waiter.
	Queued int `json:"queued"`
}

type holderInfo struct {
	ID          string    `json:"id"`
	Slot        int       `json:"slot"`  // the first of Slots; -1: no lease record (keys edited by hand)
	Slots       []int     `json:"slots"` // every slot the lease holds
	Owner       string    `json:"owner"` // Options.Owner of the process that acquired it
	Token       int64     `json:"token"`
	Deadline    time.Time `json:"deadline"`
	ExpiresInMs int64     `json:"expires_in_ms"`
	// MinAgeMs is a lower bound of the time since the grant, derived from
	// the fencing token (never below the server clock in µs at the grant);
	// nil when the token is ahead of the clock, so no bound can be derived.
	MinAgeMs *int64 `json:"min_age_ms"`
}

type waiterInfo struct {
	ID       string `json:"id"`
	Position int    `json:"position"`
	Weight   int    `json:"weight"` // slots it waits for
	Owner    string `json:"owner"`  // Options.Owner of the process that queued it
	// EvictDeadline is when the waiter is evicted unless its process
	// heart-beats (its session's deadline).
	EvictDeadline time.Time `json:"evict_deadline"`
	EvictInMs     int64     `json:"evict_in_ms"`
	// SeenForMs (watch only) is how long this watch has seen the waiter
	// queued: a lower bound of its wait. The queue stores arrival order, not
	// arrival time, so status cannot tell a waiter's age.
	SeenForMs *int64 `json:"seen_for_ms,omitempty"`
}

// queuedLeaseTTL returns the LeaseTTL that the fair semaphore's waiting
// clients asked for: each queue record is "session lease_ms". It returns 0
// when there is no record or the clients disagree.
func queuedLeaseTTL(ctx context.Context, client redis.UniversalClient, metaKey string) (time.Duration, string) {
	vals, err := client.HVals(ctx, metaKey).Result()
	if err != nil || len(vals) == 0 {
		return 0, ""
	}
	var ttl int64 = -1
	for _, v := range vals {
		// A waiter record: "W|session|weight|lease_ms|owner" (lua/lib_*.lua).
		f := strings.SplitN(v, "|", 5)
		if len(f) != 5 || f[0] != "W" {
			continue
		}
		n, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || (ttl >= 0 && n != ttl) {
			return 0, ""
		}
		ttl = n
	}
	if ttl < 0 {
		return 0, ""
	}
	return time.Duration(ttl) * time.Millisecond, "the LeaseTTL that the queued fair clients asked for"
}

// read takes a snapshot of the session's semaphore, checking holders
// against leaseTTL (0: unknown).
func (ss *session) read(ctx context.Context, leaseTTL time.Duration) (*snapshot, error) {
	client, e := ss.client, ss.e
	keys := e.Keys()
	st, err := e.Status(ctx)
	if err != nil {
		return nil, err
	}
	// The rest is read right after, from the node that owns the keys.
	node := redis.Cmdable(client)
	if cc, ok := client.(*redis.ClusterClient); ok {
		if n, err := cc.MasterForKey(ctx, keys.List[core.KeyMeta]); err == nil {
			node = n
		}
	}
	now, err := node.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	now = now.UTC()
	exist := make([]*redis.IntCmd, len(keys.List))
	pipe := client.Pipeline()
	for i, k := range keys.List {
		exist[i] = pipe.Exists(ctx, k)
	}
	override := pipe.Get(ctx, keys.List[core.KeyOverride])
	established := pipe.HGet(ctx, keys.List[core.KeyMeta], "_limit")
	rateOverride := pipe.Get(ctx, keys.List[core.KeyRate])
	rateEstablished := pipe.HGet(ctx, keys.List[core.KeyMeta], "_rate")
	want := pipe.HGet(ctx, keys.List[core.KeyMeta], "_want")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	s := &snapshot{Name: e.Name(), Kind: kindSemaphore, Family: ss.family, Prefix: ss.prefix, ServerTime: now,
		Holders: []holderInfo{}, Waiters: []waiterInfo{}, Warnings: []string{}}
	if ss.family != "" {
		s.Kind = kindMember
	}
	s.sawWant(want.Val())
	for i, c := range exist {
		if c.Val() > 0 {
			s.present = append(s.present, keys.List[i])
			s.Live = s.Live || i != core.KeyOverride && i != core.KeyRate
		}
	}
	if n, err := strconv.Atoi(override.Val()); err == nil {
		s.Override = &n
	}
	if n, err := strconv.Atoi(established.Val()); err == nil {
		s.Established = &n
	}
	switch {
	case s.Override != nil:
		s.Limit, s.LimitSource = s.Override, "set-limit"
	case s.Established != nil:
		s.Limit, s.LimitSource = s.Established, "established"
	default:
		s.LimitSource = "unknown"
	}
	if !st.Rate.IsZero() {
		s.Rate, s.RateGranted, s.rate = st.Rate.String(), st.RateGranted, st.Rate
	}
	if r, ok := storedRate(rateOverride.Val()); ok {
		s.SetRate = r.String()
	}
	if r, ok := storedRate(rateEstablished.Val()); ok {
		s.EstablishedRate = r.String()
	} else if s.Established != nil {
		s.EstablishedRate = redsem.Rate{}.String() // a limit established without a rate
	}
	nowMs := now.UnixMilli()
	for _, h := range st.Holders {
		hi := holderInfo{ID: h.ID, Slot: h.Slot, Slots: h.Slots, Owner: h.Owner, Token: h.Token, Deadline: h.Deadline.UTC(), ExpiresInMs: h.Deadline.UnixMilli() - nowMs}
		if age := nowMs - h.Token/1000; h.Token > 0 && age >= 0 {
			hi.MinAgeMs = &age
		}
		s.Holders = append(s.Holders, hi)
	}
	// Status lists a holder only with its lease record: a holder whose
	// record is gone (keys edited by hand) is read here, shown with slot
	// -1, and warned of (check).
	extra, err := unrecordedHolders.Run(ctx, client, []string{keys.List[core.KeyHolders], keys.List[core.KeyMeta]}, core.Sentinel).Slice()
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(extra); i += 2 {
		id, _ := extra[i].(string)
		ms, _ := extra[i+1].(int64)
		s.Holders = append(s.Holders, holderInfo{ID: id, Slot: -1, Slots: []int{}, Deadline: time.UnixMilli(ms).UTC(), ExpiresInMs: ms - nowMs})
	}
	for _, w := range st.Waiters {
		s.Waiters = append(s.Waiters, waiterInfo{ID: w.ID, Position: w.Position, Weight: w.Weight, Owner: w.Owner, EvictDeadline: w.Deadline.UTC(), EvictInMs: w.Deadline.UnixMilli() - nowMs})
	}
	if v, err := node.ConfigGet(ctx, "maxmemory-policy").Result(); err == nil {
		s.MaxMemoryPolicy = v["maxmemory-policy"]
	}
	if leaseTTL <= 0 && len(s.Holders) > 0 {
		leaseTTL, s.LeaseTTLSource = queuedLeaseTTL(ctx, client, keys.List[core.KeyMeta])
	} else if leaseTTL > 0 {
		s.LeaseTTLSource = "--lease-ttl"
	}
	if leaseTTL > 0 {
		s.LeaseTTLMs = leaseTTL.Milliseconds()
	}
	s.check(leaseTTL)
	return s, nil
}

// unrecordedHolders returns the live holders (deadline after the server's
// clock) of a semaphore's holders set (KEYS[1]) that have no lease record
// in its meta hash (KEYS[2]), as id, deadline (server ms) pairs; ARGV[1] is
// the sets' sentinel member. Every grant writes a holder's entry and its
// record in one script, and every release or prune removes both, so only
// keys edited by hand leave an entry without a record; Status skips such
// an entry. One script, so that a lease granted or released while status
// reads is never taken for one.
var unrecordedHolders = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #hs, 2 do
  local id = hs[i]
  if id ~= ARGV[1] then
    local rec = redis.call('HGET', KEYS[2], id)
    if not rec or string.sub(rec, 1, 1) ~= 'L' then
      out[#out + 1] = id
      out[#out + 1] = tonumber(hs[i + 1])
    end
  end
end
return out`)

func (s *snapshot) warn(format string, args ...any) {
	s.Warnings = append(s.Warnings, fmt.Sprintf(format, args...))
}

func (s *snapshot) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// slotsHeld is the number of slots the holders hold (a weighted lease
// holds several).
func (s *snapshot) slotsHeld() int {
	n := 0
	for _, h := range s.Holders {
		n += max(len(h.Slots), 1)
	}
	return n
}

// check adds the warnings and notes that one snapshot supports.
func (s *snapshot) check(leaseTTL time.Duration) {
	if s.Limit != nil {
		limit := *s.Limit
		held := s.slotsHeld()
		switch {
		case held > limit:
			s.warn("over the limit: %d slots held, limit %d (the limit was lowered: leases are not revoked, new grants wait until fewer than %d are held)",
				held, limit, limit)
		case held == limit:
			s.warn("full: all %d slots held, %s (one reading; watch shows how long it stays full)",
				limit, s.waiting(len(s.Waiters), "the fair queue"))
		case len(s.Waiters) > 0 && s.Waiters[0].Weight <= limit-held && !s.rate.IsZero() && s.RateGranted+s.Waiters[0].Weight > s.rate.Limit:
			s.note("%d waiting while %d slots are free: the rate holds them (%d granted in the window of %s, the rate in force; the head wants %d): "+
				"the head is admitted once enough grants leave the window", len(s.Waiters), limit-held, s.RateGranted, s.Rate, s.Waiters[0].Weight)
		case len(s.Waiters) > 0 && s.Waiters[0].Weight <= limit-held:
			s.warn("%d waiting while %d slots are free: admission is pending (normal for a moment; waiters whose process died are evicted when their deadline passes)",
				len(s.Waiters), limit-held)
		case len(s.Waiters) > 0:
			s.note("%d waiting; the head waits for %d slots, %d are free", len(s.Waiters), s.Waiters[0].Weight, limit-held)
		}
		if s.Override != nil && s.Established != nil && *s.Override != *s.Established {
			s.note("clients were built with limit %d; set-limit's %d overrides it", *s.Established, *s.Override)
		}
		if s.SetRate != "" && s.EstablishedRate != "" && s.SetRate != s.EstablishedRate {
			s.note("clients were built with rate %s; set-limit --rate's %s overrides it", s.EstablishedRate, s.SetRate)
		}
		for _, h := range s.Holders {
			if len(h.Slots) > 0 && h.Slots[len(h.Slots)-1] >= limit {
				s.warn("holder %s holds slot %d, outside the limit %d (the limit was lowered)", h.ID, h.Slots[len(h.Slots)-1], limit)
			}
		}
	}
	for _, h := range s.Holders {
		if h.Slot < 0 {
			s.warn("holder %s has no lease record (keys edited by hand?); it cannot be fenced", h.ID)
		}
		if leaseTTL <= 0 {
			continue
		}
		ttl := leaseTTL.Milliseconds()
		if h.MinAgeMs != nil && *h.MinAgeMs*10 > ttl*8 {
			s.warn("holder %s (slot %d) has held for at least %s, past 0.8 x LeaseTTL (%s): fine if it renews on purpose, else a stuck or too slow holder",
				h.ID, h.Slot, fmtMs(*h.MinAgeMs), leaseTTL)
		}
		if h.ExpiresInMs*10 < ttl*2 {
			s.warn("holder %s (slot %d) expires in %s, under 0.2 x LeaseTTL (%s): its renewals are late (the watchdog renews every LeaseTTL/3) or it renews by hand",
				h.ID, h.Slot, fmtMs(h.ExpiresInMs), leaseTTL)
		}
	}
	switch {
	case len(s.Holders) > 0 && leaseTTL <= 0:
		s.note("LeaseTTL is not stored in Redis: pass --lease-ttl to check holders against 0.8 x LeaseTTL")
	case len(s.Holders) > 0 && s.LeaseTTLSource != "--lease-ttl":
		s.note("holders checked against LeaseTTL %s: %s (pass --lease-ttl if holders use another)", leaseTTL, s.LeaseTTLSource)
	}
	if core.EvictingPolicy(s.MaxMemoryPolicy) {
		s.warn("Redis maxmemory-policy is %s: it may evict the semaphore's keys (all but the set-limit override have a TTL); use noeviction", s.MaxMemoryPolicy)
	}
}

// sawWant records want, a "_want" counter (until when unfair waiters
// asked for freed-slot notices, server ms), if it is later than the
// snapshot's time and than what it recorded already.
func (s *snapshot) sawWant(want string) {
	ms, err := strconv.ParseInt(want, 10, 64)
	if err != nil || ms <= s.ServerTime.UnixMilli() {
		return
	}
	if t := time.UnixMilli(ms).UTC(); s.UnfairWaitersUntil == nil || t.After(*s.UnfairWaitersUntil) {
		s.UnfairWaitersUntil = &t
	}
}

// waiting says who waits: queued entries of the fair queue(s) (where),
// and unfair waiters if they left their sign (Redis does not count
// them). It never names the variant of the clients: Redis does not store
// it.
func (s *snapshot) waiting(queued int, where string) string {
	unfair := s.UnfairWaitersUntil != nil
	switch {
	case queued > 0 && unfair:
		return fmt.Sprintf("%d waiting in %s and unfair waiters retrying", queued, where)
	case queued > 0:
		return fmt.Sprintf("%d waiting in %s", queued, where)
	case unfair:
		return "unfair waiters retrying"
	}
	return "nobody waiting"
}

// full reports whether the semaphore's limit, or the family's total, is
// all held.
func (s *snapshot) full() bool {
	if s.Kind == kindFamily {
		return s.Total != nil && s.Total.Total > 0 && s.Total.SlotsHeld >= s.Total.Total
	}
	return s.Limit != nil && s.slotsHeld() >= *s.Limit
}

// readFamily adds to s, a snapshot of NAME read without --key, the keyed
// family of the same name if it has members or a total in Redis: the top
// busiest members, the sums of every member's counters and the total. s
// becomes the family's view (Kind kindFamily, with the sign of unfair
// waiters in any member and the warnings of a full total) unless NAME is
// also a semaphore with state of its own: then the family is listed below
// it.
func (ss *session) readFamily(ctx context.Context, s *snapshot, top int) error {
	name := s.Name
	members, n, err := core.ReadMembers(ctx, ss.client, ss.prefix, name, core.MaxMembers)
	if err != nil {
		return err
	}
	tot, hasTotal, err := core.ReadFamilyTotal(ctx, ss.client, ss.prefix, name)
	if err != nil {
		return err
	}
	if n == 0 && !hasTotal {
		return nil // no family of that name (or an idle one: nothing to tell)
	}
	held, queued := 0, 0
	for _, m := range members {
		held, queued = held+m.Held, queued+m.Queued
	}
	s.Members, s.MemberCount = members[:min(top, len(members))], n
	s.MembersSlotsHeld, s.MembersQueued = &held, &queued
	if hasTotal {
		s.Total = &familyTotal{Total: tot.Total, SlotsHeld: tot.Held, Queued: tot.Waiting}
	}
	if s.Live || s.Limit != nil {
		return nil // NAME is a semaphore too: its view, the family listed below
	}
	s.Kind = kindFamily
	s.Live = n > 0 || hasTotal && (tot.Held > 0 || tot.Waiting > 0)
	// Unfair waiters' sign: every member's "_want", and the total's.
	shards, _, err := core.ReadShards(ctx, ss.client, ss.prefix, name)
	if err != nil {
		return err
	}
	pipe := ss.client.Pipeline()
	wants := make([]*redis.StringCmd, 0, len(members)+1)
	for _, m := range members {
		wants = append(wants, pipe.HGet(ctx, core.MemberKeys(ss.prefix, name, shards, m.Key).List[core.KeyMeta], "_want"))
	}
	if hasTotal {
		wants = append(wants, pipe.HGet(ctx, core.FamilyKeys(ss.prefix, name)[core.FamTot], "_want"))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for _, w := range wants {
		s.sawWant(w.Val())
	}
	s.checkFamily()
	return nil
}

// checkFamily adds the warnings and notes that one reading of a family
// supports.
func (s *snapshot) checkFamily() {
	t := s.Total
	if t == nil {
		return
	}
	if t.Total > 0 {
		switch {
		case t.SlotsHeld > t.Total:
			s.warn("over the family's total: %d slots held in all members, total %d (the total was lowered: leases are not revoked, new grants wait until fewer than %d are held)",
				t.SlotsHeld, t.Total, t.Total)
		case t.SlotsHeld == t.Total:
			s.warn("full: the family's total of %d is all held, %s (one reading; watch shows how long it stays full)",
				t.Total, s.waiting(t.Queued, "fair queues"))
		}
	}
	if s.MembersSlotsHeld != nil && *s.MembersSlotsHeld > t.SlotsHeld {
		s.note("the members' counters hold %d slots, the total counts %d live: holders that expired and no script removed yet, "+
			"a change between the two readings, or a client built without the family's Total (it counts nothing in the total)",
			*s.MembersSlotsHeld, t.SlotsHeld)
	}
}

// storedRate reads a rate as the scripts store it, "limit/per_ms" ("0/0":
// none); ok is false for anything else (absent, or not a rate).
func storedRate(v string) (r redsem.Rate, ok bool) {
	l, p, found := strings.Cut(v, "/")
	n, err1 := strconv.Atoi(l)
	ms, err2 := strconv.ParseInt(p, 10, 64)
	if !found || err1 != nil || err2 != nil || n < 0 || ms < 0 {
		return redsem.Rate{}, false
	}
	return redsem.Rate{Limit: n, Per: time.Duration(ms) * time.Millisecond}, true
}

// fmtMs formats milliseconds as a short duration.
func fmtMs(n int64) string {
	d := time.Duration(n) * time.Millisecond
	switch {
	case d < 0:
		return "-" + fmtMs(-n)
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Truncate(time.Second).String()
}
