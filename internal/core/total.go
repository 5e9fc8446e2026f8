package core

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core/wire"
)

// A family's total (FamilyOptions.Total): the slots held across all of its
// members at once. Its members' scripts get the family's four keys
// (FamilyKeys) after their own and count every lease there, in the same
// call that grants, renews, releases or expires it, so that a grant finds
// room in its member and in the total in one atomic admission; see
// lua/lib_family.lua and lua/lib_total.lua. The family-level calls
// (settotal.lua, famstatus.lua) run through the door of the family's own
// engine (famEng), as wire.Door.SetTotal and FamilyStatus.

// SetTotal sets the family's total for every client (0 removes the bound;
// the family keeps counting, so a later total holds at once). It needs a
// family built with a total: one built without counts nothing.
func (f *Family) SetTotal(ctx context.Context, total int) error {
	if f.root.isClosed() {
		return redsem.ErrClosed
	}
	if f.total == 0 {
		return cfgErr("FamilyOptions.Total", "family %q was built without a total (0), so its members count none: "+
			"build every client of the family with a Total, then SetTotal changes it", f.Name())
	}
	if total < 0 || total > MaxLimit {
		return cfgErr("total", "%d is not in [0, %d] (0: no bound)", total, MaxLimit)
	}
	return f.famEng.failFast(ctx, func(ctx context.Context) error {
		if err := f.compareShards(ctx); err != nil {
			return wire.CallErr(f.famEng.who(), ctx, err)
		}
		g, cancel, err := f.famEng.door.SetTotal(ctx, total)
		return settled(ctx, f.famEng, g, cancel, err)
	})
}

// Status reads the family's total in force and its use: the slots held
// in all members and the waiters queued in all of them (fair; an unfair
// family's waiters are not recorded in Redis: the count is this process's).
func (f *Family) Status(ctx context.Context) (st redsem.FamilyStatus, err error) {
	err = f.root.failFast(ctx, func(ctx context.Context) error {
		if f.total == 0 {
			st, err = f.scanStatus(ctx)
			return err
		}
		st, err = f.famEng.door.FamilyStatus(ctx)
		if err == nil && f.root.variant.localQueue() {
			st.Waiting = f.localWaiters()
		}
		return err
	})
	return st, err
}

// localWaiters counts this process's unfair waiters in all members.
func (f *Family) localWaiters() int {
	n := 0
	for _, sh := range f.shards {
		sh.mu.Lock()
		h := sh.hub
		sh.mu.Unlock()
		if u, ok := h.listener().(*unfairWake); ok {
			n += u.count()
		}
	}
	return n
}

// scanStatus is Status for a family without a total, which keeps no count:
// it finds the members' keys (SCAN, on every master of a cluster) and sums
// their live holders' slots and their queue entries, one member at a time
// (not one snapshot: a tool's view, for the CLI).
func (f *Family) scanStatus(ctx context.Context) (redsem.FamilyStatus, error) {
	var st redsem.FamilyStatus
	client := f.root.cfg.Client
	for i := range f.shards {
		tag := ShardTag(f.root.cfg.Name, i, len(f.shards))
		pattern := memberMetaPattern(f.root.cfg.Prefix, tag)
		// Bounded by ctx, as every call is (a client without
		// ContextTimeoutEnabled reads on until its own timeout); the
		// masters of a cluster are scanned at once (ForEachMaster).
		sent := time.Now()
		found, err := wire.Bounded(ctx, func() ([]any, error) {
			var mu sync.Mutex
			var found []any
			err := forEachNode(ctx, client, func(ctx context.Context, c redis.UniversalClient) error {
				iter := c.Scan(ctx, 0, pattern, 512).Iterator()
				for iter.Next(ctx) {
					mu.Lock()
					found = append(found, iter.Val())
					mu.Unlock()
				}
				return iter.Err()
			})
			mu.Lock()
			defer mu.Unlock()
			return found, err
		})
		f.root.rep.answered(sent, err)
		if err != nil {
			return st, wire.CallErr(f.root.who(), ctx, err)
		}
		for _, v := range found {
			meta := v.(string)
			keys := memberKeys(f.root.cfg.Prefix, tag, memberKeyOf(f.root.cfg.Prefix, meta))
			e := &Engine{cfg: f.root.cfg, keys: keys, pub: f.root.pub, lib: f.root.lib, alerts: f.root.alerts, stopped: f.root.stopped, variant: f.root.variant}
			complete(e)
			ms, err := e.door.Status(ctx)
			if err != nil {
				return st, err
			}
			for _, h := range ms.Holders {
				st.Held += len(h.Slots)
			}
			st.Waiting += len(ms.Waiters)
		}
	}
	if f.root.variant.localQueue() {
		st.Waiting = f.localWaiters()
	}
	return st, nil
}

// forEachNode runs fn on every master of a cluster client, else on the
// client itself.
func forEachNode(ctx context.Context, client redis.UniversalClient, fn func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, client)
}

// isTotal reports whether key is the f:tot key of the total of the family
// that k's semaphore is a member of.
func (k Keys) isTotal(key string) bool {
	return k.Fam != nil && k.Fam[FamTot] == key
}

// ReadFamilyTotal returns the total of the family called name and its use
// (famstatus.lua, read-only), and false when the family has no total's
// keys in Redis (none was ever used, or they expired and SetTotal set
// none). For tools: it does not know the clients' own total, so a family
// whose counters expired reports only SetTotal's.
func ReadFamilyTotal(ctx context.Context, client redis.UniversalClient, prefix, name string) (redsem.FamilyStatus, bool, error) {
	keys := FamilyKeys(prefix, name)
	n, err := client.Exists(ctx, keys[FamTot], keys[FamTotal]).Result()
	if err != nil || n == 0 {
		return redsem.FamilyStatus{}, false, err
	}
	f, err := NewFamily(Config{Client: client, Name: name, Limit: 1, Prefix: prefix}, 0, 1, 1)
	if err != nil {
		return redsem.FamilyStatus{}, false, err
	}
	defer f.Close()
	st, err := f.famEng.door.FamilyStatus(ctx)
	return st, err == nil, err
}
