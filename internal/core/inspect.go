package core

import (
	"context"
	"strings"

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
