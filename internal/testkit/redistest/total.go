package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// TotalLayout is one consistent snapshot (one MULTI) of a keyed family's
// total (lua/lib_family.lua) and of the members given: the family's four
// keys (core.FamilyKeys) and each member's layout.
type TotalLayout struct {
	Now     int64             // server time, ms
	Tot     map[string]string // f:tot: counters ("_" fields) and weights
	Leases  []redis.Z         // f:leases: lease id -> deadline, sentinel left out
	Heads   []redis.Z         // f:heads: member base -> head's arrival number
	Total   string            // f:total (SetTotal's), if HasTotal
	HasTTL  bool              // f:tot has a TTL (every key but f:total must)
	HasTot  bool              // f:total exists
	Members map[string]*Layout
	Bases   map[string]string // member name -> its key base, its name in f:heads
	// Uncounted: ids of live leases the family does not count (granted,
	// before it counted a total, by a client without one), which the
	// caller sets before Check; every other live holder must be counted.
	Uncounted map[string]bool
}

// ReadTotal reads a family's total and its members' keys in one MULTI:
// fam is the family's four keys, members maps a member's name to its nine
// keys (core.Keys.List). Every key shares the family's tag, so one MULTI
// runs on a cluster too.
func ReadTotal(ctx context.Context, c redis.Cmdable, fam []string, members map[string][]string) (*TotalLayout, error) {
	if len(fam) != 4 {
		return nil, fmt.Errorf("redistest: ReadTotal wants 4 family keys, got %d", len(fam))
	}
	var tm *redis.TimeCmd
	var tot *redis.MapStringStringCmd
	var leases, heads *redis.ZSliceCmd
	var total *redis.StringCmd
	var ttl *redis.DurationCmd
	type mcmds struct {
		zs   map[int]*redis.ZSliceCmd
		free *redis.StringSliceCmd
		meta *redis.MapStringStringCmd
	}
	mc := map[string]*mcmds{}
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		tot = p.HGetAll(ctx, fam[0])
		leases = p.ZRangeWithScores(ctx, fam[1], 0, -1)
		heads = p.ZRangeWithScores(ctx, fam[2], 0, -1)
		total = p.Get(ctx, fam[3])
		ttl = p.PTTL(ctx, fam[0])
		for name, keys := range members {
			m := &mcmds{zs: map[int]*redis.ZSliceCmd{}}
			for _, i := range []int{lkHolders, lkQueue} {
				m.zs[i] = p.ZRangeWithScores(ctx, keys[i], 0, -1)
			}
			m.meta = p.HGetAll(ctx, keys[lkMeta])
			mc[name] = m
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	strip := stripSentinel
	t := &TotalLayout{Now: tm.Val().UnixMilli(), Tot: tot.Val(), Leases: strip(leases.Val()), Heads: strip(heads.Val()),
		Members: map[string]*Layout{}, Bases: map[string]string{}}
	for name, keys := range members {
		t.Bases[name] = strings.TrimSuffix(keys[lkHolders], "holders")
	}
	t.Total, t.HasTot = total.Val(), total.Err() == nil
	// PTTL: -1 no TTL, -2 no key; 0 for a key in its last millisecond
	// (it has one: a check polling an idle family hit it).
	t.HasTTL = ttl.Val() >= 0
	for name, m := range mc {
		t.Members[name] = &Layout{Now: t.Now, Meta: m.meta.Val(), Holders: strip(m.zs[lkHolders].Val()), Queue: strip(m.zs[lkQueue].Val())}
	}
	return t, nil
}

// Check checks the total's invariants against the members read (which
// must be every member that holds anything): _held is the slots of the
// leases in f:leases (weights: a field per lease of more than one slot);
// every live holder entry of a member is in f:leases with its deadline,
// and every live entry of f:leases is a member's live holder entry; the
// live leases hold at most bound slots (bound 0: not checked, e.g. after a
// SetTotal lowered it) and at most limit in one member (0: not checked);
// the family's keys expire; a member's keys outlive every live lease it
// holds (its _hz is past the lease's deadline, so nothing in f:leases
// outlives its member's record); and (fair) every member with queue
// entries has its head in f:heads with the head's arrival number, negated
// only while the head does not fit in its member (counting every holder
// entry listed, expired ones too, whose slots go back only when a call
// on the member runs), or while f:tot's _recheck says leases expired since.
func (t *TotalLayout) Check(bound, limit int) LayoutProblems {
	var p LayoutProblems
	weight := func(id string) int {
		if v, ok := t.Tot[id]; ok {
			n, _ := strconv.Atoi(v)
			return n
		}
		return 1
	}
	sum, live := 0, 0
	inLeases := map[string]float64{}
	for _, z := range t.Leases {
		id := z.Member.(string)
		inLeases[id] = z.Score
		sum += weight(id)
		if int64(z.Score) > t.Now {
			live += weight(id)
		}
	}
	if held, _ := strconv.Atoi(t.Tot["_held"]); len(t.Tot) > 0 && held != sum {
		p.add("_held is not the slots of f:leases", "_held %d, f:leases holds %d slots in %d leases", held, sum, len(t.Leases))
	}
	if bound > 0 && live > bound {
		p.add("more than the total held", "%d slots held by live leases, total %d", live, bound)
	}
	if len(t.Tot) > 0 && !t.HasTTL {
		p.add("f:tot without a TTL", "f:tot has no TTL")
	}
	held := map[string]bool{}
	for name, m := range t.Members {
		used := 0
		for _, z := range m.Holders {
			id := z.Member.(string)
			if int64(z.Score) <= t.Now {
				continue
			}
			held[id] = true
			rec, ok := ParseLeaseRecord(m.Meta[id])
			if !ok {
				continue // the member's own checker reports it
			}
			used += len(rec.Slots)
			d, in := inLeases[id]
			switch {
			case !in && t.Uncounted[id]:
			case !in:
				p.add("a live lease missing from f:leases", "member %s: lease %s (deadline %.0f) not in f:leases", name, id, z.Score)
			case d != z.Score:
				p.add("f:leases deadline differs from the holder's", "member %s: lease %s: holder %.0f, f:leases %.0f", name, id, z.Score, d)
			}
			if w := weight(id); in && w != len(rec.Slots) {
				p.add("f:tot weight differs from the lease's slots", "member %s: lease %s: %d slots, weight %d", name, id, len(rec.Slots), w)
			}
		}
		if limit > 0 && used > limit {
			p.add("more than the limit in a member", "member %s: %d slots held, limit %d", name, used, limit)
		}
		hz, _ := strconv.ParseInt(m.Meta["_hz"], 10, 64)
		for _, z := range m.Holders {
			if int64(z.Score) > t.Now && hz < int64(z.Score) {
				p.add("a lease outlives its member's keys", "member %s: lease %s (deadline %.0f), keys' horizon %d", name, z.Member, z.Score, hz)
			}
		}
		t.checkHead(&p, name, m, limit)
	}
	for _, z := range t.Leases {
		if id := z.Member.(string); int64(z.Score) > t.Now && !held[id] {
			p.add("an f:leases entry held by no member", "lease %s (deadline %.0f)", id, z.Score)
		}
	}
	return p
}

// checkHead checks member name's entry in f:heads (see Check).
func (t *TotalLayout) checkHead(p *LayoutProblems, name string, m *Layout, limit int) {
	if len(m.Queue) == 0 {
		return
	}
	head := m.Queue[0]
	var entry *redis.Z
	for i := range t.Heads {
		if t.Heads[i].Member == t.Bases[name] {
			entry = &t.Heads[i]
		}
	}
	if entry == nil {
		p.add("a member's queue head missing from f:heads", "member %s: head %s (arrival %.0f)", name, head.Member, head.Score)
		return
	}
	if entry.Score != head.Score && entry.Score != -head.Score {
		p.add("f:heads names another arrival than the member's head", "member %s: head %s arrival %.0f, f:heads %.0f", name, head.Member, head.Score, entry.Score)
		return
	}
	if entry.Score > 0 || limit <= 0 || t.Tot["_recheck"] != "" {
		return
	}
	_, weight, ok := parseWaiterRecord(m.Meta[head.Member.(string)])
	if !ok {
		return // the member's own checker reports it
	}
	listed := 0
	for _, z := range m.Holders {
		if rec, ok := ParseLeaseRecord(m.Meta[z.Member.(string)]); ok {
			listed += len(rec.Slots)
		}
	}
	if weight <= limit-listed {
		p.add("a head that fits passed over in f:heads", "member %s: head %s (weight %d) fits (%d of %d held) but its f:heads entry is negated", name, head.Member, weight, listed, limit)
	}
}
