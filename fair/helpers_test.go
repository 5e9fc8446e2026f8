package fair_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// newSem returns a fair semaphore on client c, closed when the test ends.
func newSem(t *testing.T, c redis.UniversalClient, name string, limit int, opts fair.Options) *fair.Semaphore {
	t.Helper()
	s, err := fair.New(c, name, limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitFor polls cond until it holds, failing the test after d: how tests
// wait for a condition instead of sleeping (redistest.WaitFor).
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	redistest.WaitFor(t, d, what, cond)
}

// status reads s's status, failing the test on error.
func status(t *testing.T, ctx context.Context, s redsem.Semaphore) redsem.Status {
	t.Helper()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitWaiters waits until s shows n live waiters and returns the status.
func waitWaiters(t *testing.T, ctx context.Context, s redsem.Semaphore, n int) redsem.Status {
	t.Helper()
	var st redsem.Status
	waitFor(t, 10*time.Second, fmt.Sprintf("%d waiters", n), func() (bool, error) {
		var err error
		st, err = s.Status(ctx)
		return err == nil && len(st.Waiters) == n, err
	})
	return st
}

// waiterIDs lists the waiter ids of st in position order, checking that
// positions are 0..n-1.
func waiterIDs(t *testing.T, st redsem.Status) []string {
	t.Helper()
	ids := make([]string, len(st.Waiters))
	for i, w := range st.Waiters {
		if w.Position != i {
			t.Fatalf("waiter %d has position %d: %+v", i, w.Position, st.Waiters)
		}
		ids[i] = w.ID
	}
	return ids
}

func holderIDs(st redsem.Status) []string {
	ids := make([]string, len(st.Holders))
	for i, h := range st.Holders {
		ids[i] = h.ID
	}
	sort.Strings(ids)
	return ids
}

// keysOf returns the Redis keys of the semaphore name (default prefix).
func keysOf(name string) core.Keys { return core.KeysFor(core.DefaultPrefix, name) }

// rawCounts reads how many entries each fair structure holds in Redis,
// without the filtering that Status applies (see core.Inspect).
type rawCounts struct{ holders, leases, queue, waiters int64 }

func raw(t *testing.T, ctx context.Context, c redis.UniversalClient, name string) rawCounts {
	t.Helper()
	r, err := core.Inspect(ctx, c, keysOf(name))
	if err != nil {
		t.Fatal(err)
	}
	return rawCounts{holders: r.Holders, leases: r.Leases, queue: r.Queue, waiters: r.Waiters}
}

// checkClean asserts that nothing of the semaphore name is left behind: no
// holder, lease, queue entry or waiter record, and that
// every key but the SetLimit override has a TTL, so abandoned state vanishes.
func checkClean(t *testing.T, ctx context.Context, c redis.UniversalClient, name string) {
	t.Helper()
	if r := raw(t, ctx, c, name); r != (rawCounts{}) {
		t.Errorf("state left behind for %q: %+v", name, r)
	}
	checkTTLs(t, ctx, c, name)
}

// checkTTLs asserts that every key of name but the override has a TTL.
func checkTTLs(t *testing.T, ctx context.Context, c redis.UniversalClient, name string) {
	t.Helper()
	k := keysOf(name)
	for i, key := range k.List {
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if i == core.KeyOverride {
			if ttl != -2 && ttl != -1 {
				t.Errorf("override %s has TTL %v, want none", key, ttl)
			}
			continue
		}
		if ttl == -1 {
			t.Errorf("key %s has no TTL", key)
		}
	}
	// No other key of this name exists.
	tag := k.List[0][:strings.LastIndex(k.List[0], ":")+1]
	all, err := c.Keys(ctx, escapeGlob(tag)+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, key := range k.List {
		known[key] = true
	}
	for _, key := range all {
		if !known[key] {
			t.Errorf("unexpected key %s", key)
		}
	}
}

func escapeGlob(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}

// interval is one lease's hold, as seen by its holder on the local
// monotonic clock: called when Acquire was called, start when it returned,
// end when Release was called, done when Release returned. The grant in
// Redis happened in [called, start] and the release in [end, done].
type interval struct {
	id                       string
	slot                     int
	token                    int64
	called, start, end, done time.Time
}

// checkIntervals asserts the safety of a history of holds: at no instant
// more than limit holds [start, end) overlap, overlapping holds have distinct
// slots in [0, limit), tokens are unique, and a lease released (done) before
// another was asked for (called) has the smaller token.
func checkIntervals(t *testing.T, limit int, hs []interval) {
	t.Helper()
	type ev struct {
		at    time.Time
		start bool
		i     int
	}
	evs := make([]ev, 0, 2*len(hs))
	tokens := map[int64]string{}
	for i, h := range hs {
		if h.slot < 0 || h.slot >= limit {
			t.Fatalf("lease %s has slot %d outside [0,%d)", h.id, h.slot, limit)
		}
		if prev, dup := tokens[h.token]; dup {
			t.Fatalf("token %d issued twice (%s, %s)", h.token, prev, h.id)
		}
		tokens[h.token] = h.id
		evs = append(evs, ev{h.start, true, i}, ev{h.end, false, i})
	}
	// At equal instants process ends first: [start, end) intervals.
	sort.Slice(evs, func(a, b int) bool {
		if !evs[a].at.Equal(evs[b].at) {
			return evs[a].at.Before(evs[b].at)
		}
		return !evs[a].start && evs[b].start
	})
	open := map[int]int{} // slot -> index of the open hold
	most := 0
	for _, e := range evs {
		h := hs[e.i]
		if !e.start {
			delete(open, h.slot)
			continue
		}
		if j, busy := open[h.slot]; busy {
			t.Fatalf("slot %d held by %s and %s at once", h.slot, hs[j].id, h.id)
		}
		open[h.slot] = e.i
		if len(open) > limit {
			t.Fatalf("%d holders at once, limit %d", len(open), limit)
		}
		most = max(most, len(open))
	}
	// Tokens follow real time: every lease asked for after some release
	// returned has a larger token than the released one.
	byDone := append([]interval(nil), hs...)
	sort.Slice(byDone, func(a, b int) bool { return byDone[a].done.Before(byDone[b].done) })
	byCall := append([]interval(nil), hs...)
	sort.Slice(byCall, func(a, b int) bool { return byCall[a].called.Before(byCall[b].called) })
	var maxDone int64
	k := 0
	for _, h := range byCall {
		for k < len(byDone) && byDone[k].done.Before(h.called) {
			maxDone = max(maxDone, byDone[k].token)
			k++
		}
		if h.token <= maxDone {
			t.Fatalf("lease %s got token %d although a lease with token %d was released before it was asked for",
				h.id, h.token, maxDone)
		}
	}
	t.Logf("%d holds, at most %d at once (limit %d)", len(hs), most, limit)
}

// script runs one of the lua scripts for name directly, with the common
// ARGV prefix (channel base, client limit) before args.
func script(ctx context.Context, c redis.UniversalClient, s lua.Script, name string, limit int, args ...any) ([]any, error) {
	k := keysOf(name)
	argv := append([]any{k.Chan, "PUBLISH", limit}, args...)
	return core.Script(s).Run(ctx, c, k.List, argv...).Slice()
}

// queueRaw queues waiter id for session sid straight through the scripts,
// as a process whose heartbeat never runs again would: the session is made
// to live for queueTTL. It returns acquire.lua's reply.
func queueRaw(t *testing.T, ctx context.Context, c redis.UniversalClient, name string, limit int, id, sid string, queueTTL time.Duration) []any {
	t.Helper()
	if _, err := script(ctx, c, lua.Heartbeat, name, limit, sid, queueTTL.Milliseconds(), "new"); err != nil {
		t.Fatal(err)
	}
	v, err := script(ctx, c, lua.Acquire, name, limit, id, 1, 30000, "queue", sid, 1000, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// arrivals returns the queue's raw entries: waiter id -> arrival number. A
// waiter that was evicted and queued again has a new, larger number.
func arrivals(t *testing.T, ctx context.Context, c redis.UniversalClient, name string) map[string]float64 {
	t.Helper()
	zs, err := c.ZRangeWithScores(ctx, keysOf(name).List[core.KeyQueue], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member.(string)] = z.Score
	}
	return out
}

// noEvictions returns an Observer that fails the test if a waiter of its
// semaphore finds itself evicted.
func noEvictions(t *testing.T) redsem.Observer {
	return func(ev redsem.Event) {
		if ev.Kind == redsem.EventWaiterEvicted {
			t.Errorf("live waiter %s was evicted", ev.LeaseID)
		}
	}
}
