package core

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Raw counts the entries of a semaphore's structures in Redis as they are,
// without the filtering by deadline that Status applies (sentinels not
// counted). Tests and tools read the layout through it rather than by key.
type Raw struct {
	Holders    int64 // holder entries (live or expired, not yet removed)
	Queue      int64 // queue entries (live or of dead sessions, not yet evicted)
	Sessions   int64 // fair sessions (live or dead, not yet pruned)
	Free       int64 // free slots below the high-water mark
	Leases     int64 // lease records
	Waiters    int64 // waiter records
	Tombstones int64 // released or cancelled records
}

// Live reports whether anything but tombstones and sessions is left.
func (r Raw) Live() bool { return r.Holders+r.Queue+r.Leases+r.Waiters > 0 }

// Inspect reads the raw counts of the semaphore with keys k.
func Inspect(ctx context.Context, c redis.Cmdable, k Keys) (Raw, error) {
	var r Raw
	pipe := c.Pipeline()
	h := pipe.ZCard(ctx, k.List[KeyHolders])
	q := pipe.ZCard(ctx, k.List[KeyQueue])
	s := pipe.ZCard(ctx, k.List[KeySessions])
	f := pipe.ZCard(ctx, k.List[KeyFree])
	m := pipe.HGetAll(ctx, k.List[KeyMeta])
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return r, err
	}
	// Each sorted set keeps one sentinel while it exists.
	less := func(n int64) int64 { return max(n-1, 0) }
	r.Holders, r.Queue, r.Sessions, r.Free = less(h.Val()), less(q.Val()), less(s.Val()), less(f.Val())
	for field, v := range m.Val() {
		if strings.HasPrefix(field, "_") {
			continue
		}
		switch {
		case strings.HasPrefix(v, "L|"):
			r.Leases++
		case strings.HasPrefix(v, "W|"):
			r.Waiters++
		default:
			r.Tombstones++
		}
	}
	return r, nil
}

// Member is one member of a keyed family, as its counters in Redis show
// it (ReadMembers; the redsem command's status lists them).
type Member struct {
	Key string `json:"key"`
	// Held is the member's _used counter: the slots of its holder entries,
	// expired ones included until a script removes them.
	Held   int  `json:"slots_held"`
	Limit  *int `json:"limit"` // set-limit's, else the established one; nil if unknown
	Queued int  `json:"queued"`
}

// MaxMembers bounds how many member keys ReadMembers reads.
const MaxMembers = 10000

// ReadMembers finds the members of the keyed family name (by SCAN of
// their meta keys, on every master of a cluster: a family of several
// shards spreads over slots) and returns the top busiest (most slots held,
// then most queued), and how many there are (up to MaxMembers). For
// tools: it reads the members' counters, not their entries.
func ReadMembers(ctx context.Context, client redis.UniversalClient, prefix, name string, top int) ([]Member, int, error) {
	shards, _, err := ReadShards(ctx, client, prefix, name)
	if err != nil {
		return nil, 0, err
	}
	// The shards' tags: a meta key counts only under one of them (the
	// pattern's '*' could match more than a shard's number).
	tags := map[string]bool{}
	for i := 0; i < shards; i++ {
		tags[memberPrefix(prefix, ShardTag(name, i, shards))] = true
	}
	pattern := familyMetaPattern(prefix, name, shards)
	var (
		mu    sync.Mutex
		metas []string
		seen  = map[string]bool{}
	)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				if i := memberAt(prefix, k); i >= 0 && tags[k[:i]] && !seen[k] && len(metas) < MaxMembers {
					seen[k] = true
					metas = append(metas, k)
				}
			}
			full := len(metas) >= MaxMembers
			mu.Unlock()
			cursor = next
			if cursor == 0 || full {
				return nil
			}
		}
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, client)
	}
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(metas) // the same members listed whatever the order of the masters
	if len(metas) == 0 {
		return nil, 0, nil
	}
	pipe := client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(metas))
	for i, k := range metas {
		cmds[i] = pipe.HMGet(ctx, k, "_used", "_q", "_fixed", "_limit")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, err
	}
	atoi := func(v any) (int, bool) {
		str, ok := v.(string)
		if !ok {
			return 0, false
		}
		n, err := strconv.Atoi(str)
		return n, err == nil
	}
	out := make([]Member, 0, len(metas))
	for i, k := range metas {
		m := Member{Key: memberKeyOf(prefix, k)}
		v := cmds[i].Val()
		if len(v) == 4 {
			m.Held, _ = atoi(v[0])
			m.Queued, _ = atoi(v[1])
			if n, ok := atoi(v[2]); ok {
				m.Limit = &n
			} else if n, ok := atoi(v[3]); ok {
				m.Limit = &n
			}
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { // busiest first
		return cmp.Or(cmp.Compare(b.Held, a.Held), cmp.Compare(b.Queued, a.Queued), strings.Compare(a.Key, b.Key))
	})
	return out[:min(top, len(out))], len(out), nil
}
