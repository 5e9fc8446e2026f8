package fair_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// newFamily returns a family on client c, closed when the test ends.
func newFamily(t *testing.T, c redis.UniversalClient, name string, limit int, opts fair.FamilyOptions) *fair.Family {
	t.Helper()
	f, err := fair.NewFamily(c, name, limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func member(t *testing.T, f *fair.Family, key string) *fair.Semaphore {
	t.Helper()
	s, err := f.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitAcquire starts an Acquire on s and returns the channel of its result.
func waitAcquire(ctx context.Context, s redsem.Semaphore) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := s.Acquire(ctx)
		ch <- acquired{l, err}
	}()
	return ch
}

type acquired struct {
	l   redsem.Lease
	err error
}

func TestFamilyKeys(t *testing.T) {
	k := core.KeysForMember("p", "fam{1}", "a:b")
	for _, key := range append(append([]string{}, k.List...), k.Chan, k.Free) {
		if !strings.HasPrefix(key, "p:{fam%7B1%7D}:") {
			t.Errorf("%q lacks the family's hash tag", key)
		}
	}
	if k.List[core.KeyHolders] != "p:{fam%7B1%7D}:m:a:b:holders" || k.List[core.KeySessions] != "p:{fam%7B1%7D}:f:sessions" ||
		k.Chan != "p:{fam%7B1%7D}:f:ch" {
		t.Errorf("layout: %v %q", k.List, k.Chan)
	}
	other := core.KeysForMember("p", "fam{1}", "c")
	if other.List[core.KeySessions] != k.List[core.KeySessions] || other.Chan != k.Chan {
		t.Error("members do not share the sessions key and channel base")
	}
	plain := core.KeysFor("p", "fam{1}")
	seen := map[string]bool{k.List[core.KeySessions]: true}
	other.List[core.KeySessions], k.List[core.KeySessions] = "", ""
	for _, key := range append(append(append([]string{}, k.List...), other.List...), plain.List...) {
		if key != "" && seen[key] {
			t.Errorf("key %q used twice", key)
		}
		seen[key] = true
	}
}

func TestFamilyMembersIndependent(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	f := newFamily(t, c, t.Name(), 1, fair.FamilyOptions{})
	a, b := member(t, f, "a"), member(t, f, "b")
	la, err := a.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := member(t, f, "a").TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("second holder of a full key: %v", err)
	}
	lb, err := b.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("a full key blocked another: %v", err)
	}
	if a.Name() != "a" || f.Name() != t.Name() {
		t.Errorf("names %q %q", a.Name(), f.Name())
	}
	_ = la.Release(ctx)
	_ = lb.Release(ctx)
	if _, err := f.Get(""); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Errorf("empty key: %v", err)
	}
}

func TestFamilyFIFOPerMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redistest.Client(t)
	f := newFamily(t, c, t.Name(), 1, fair.FamilyOptions{})
	s, other := member(t, f, "k"), member(t, f, "other")
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := other.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lo.Release(ctx) }()
	const n = 4
	res := make([]<-chan acquired, n)
	for i := range res {
		res[i] = waitAcquire(ctx, s)
		waitWaiters(t, ctx, s, i+1)
	}
	for i := range res {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-res[i]
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		for j := i + 1; j < n; j++ {
			select {
			case r := <-res[j]:
				t.Fatalf("waiter %d overtook waiter %d (%v)", j, i, r.err)
			default:
			}
		}
		l = r.l
	}
	_ = l.Release(ctx)
}

// pubsubClients counts the server's pub/sub connections.
func pubsubClients(t *testing.T, ctx context.Context, c *redis.Client) int {
	t.Helper()
	v, err := c.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(v, "\n")
}

// TestFamilySharedHub queues one waiter on each of many members and checks
// that the process uses one subscription and one heartbeat per beat for all.
func TestFamilySharedHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := redistest.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	const queueTTL = 300 * time.Millisecond // a beat every 100 ms
	opts := fair.FamilyOptions{Options: fair.Options{QueueTTL: queueTTL, LeaseTTL: time.Minute}}
	f := newFamily(t, c, "fam", 1, opts)
	const members = 40
	var leases []redsem.Lease
	var waits []<-chan acquired
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for i := range members {
		s := member(t, f, fmt.Sprint("k", i))
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		waits = append(waits, waitAcquire(wctx, s))
		waitWaiters(t, ctx, s, 1)
	}
	if n := pubsubClients(t, ctx, admin); n != 1 {
		t.Errorf("%d pub/sub connections for %d waiting members, want 1", n, members)
	}
	// A second process (another client) adds one.
	g := newFamily(t, srv.Client(t), "fam", 1, opts)
	gctx, gstop := context.WithCancel(ctx)
	gw := waitAcquire(gctx, member(t, g, "k0"))
	waitWaiters(t, ctx, member(t, f, "k0"), 2)
	if n := pubsubClients(t, ctx, admin); n != 2 {
		t.Errorf("%d pub/sub connections for two processes, want 2", n)
	}
	gstop()
	if r := <-gw; r.err == nil {
		t.Fatal("second process's waiter granted")
	}
	waitWaiters(t, ctx, member(t, f, "k0"), 1) // its detached undo ran
	// Its hub beats until it stops for want of waiters: close it.
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	// The first process's waiters stayed queued; their holders live a
	// minute, so the only scripts now are heartbeats.
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 20*time.Second, "5 heartbeats", func() (bool, error) {
		return scriptCalls(commandStats(t, ctx, admin)) >= 5, nil
	})
	stats := commandStats(t, ctx, admin)
	calls, elapsed := scriptCalls(stats), time.Since(start)
	every := queueTTL / 3
	if max := int(elapsed/every) + 2; calls > max {
		t.Errorf("%d scripts in %v for %d waiting members, want at most %d (one heartbeat per %v)", calls, elapsed, members, max, every)
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	for i, w := range waits {
		r := <-w
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		_ = r.l.Release(ctx)
	}
}

func TestFamilyIdleMembersDropped(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	f := newFamily(t, c, t.Name(), 2, fair.FamilyOptions{IdleAfter: 50 * time.Millisecond})
	// A member is idle from Get until its first call starts: a loaded
	// machine can drop a or b in that gap (IdleAfter is 50 ms), and the
	// lease then belongs to an Engine the family no longer keeps. Both
	// kept while both leases are live means both stay kept; try again
	// otherwise (the state this test is about starts there).
	var l, lb redsem.Lease
	var b *fair.Semaphore
	for try := 0; ; try++ {
		var a *fair.Semaphore
		a, b = member(t, f, "a"), member(t, f, "b")
		var err error
		if l, err = a.TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
		if lb, err = b.TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
		if f.Len() == 2 {
			break
		}
		if try == 20 {
			t.Fatalf("%d members with two live leases, want 2 (20 tries)", f.Len())
		}
		_ = l.Release(ctx)
		_ = lb.Release(ctx)
	}
	_ = lb.Release(ctx)
	waitFor(t, 10*time.Second, "b dropped", func() (bool, error) { return f.Len() == 1, nil })
	member(t, f, "a") // kept: Get finds it, Len stays 1
	if f.Len() != 1 {
		t.Fatalf("the member of a live lease was dropped")
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a dropped", func() (bool, error) { return f.Len() == 0, nil })
	// A dropped member still works for whoever holds it.
	l, err := b.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := status(t, ctx, member(t, f, "b")); len(st.Holders) != 1 || st.Holders[0].ID != l.ID() {
		t.Fatalf("status of b: %+v", st)
	}
	_ = l.Release(ctx)
}

// TestFamilyOtherProcess has a second family (another client, as another
// process would) grant the waiters of the first: by release, and by the
// early heartbeat on the member whose holder expired.
func TestFamilyOtherProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The periodic beat comes every 10 s: a grant sooner than that after a
	// holder expired comes from the early beat on that holder's member.
	opts := fair.FamilyOptions{Options: fair.Options{QueueTTL: 30 * time.Second, FallbackInterval: 10 * time.Second}}
	f := newFamily(t, redistest.Client(t), t.Name(), 1, opts)
	short := opts
	short.LeaseTTL, short.DisableAutoRenew = 300*time.Millisecond, true
	g := newFamily(t, redistest.Client(t), t.Name(), 1, short)
	long := newFamily(t, redistest.Client(t), t.Name(), 1, opts)

	lx, err := member(t, long, "x").TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lx.Release(ctx) }()
	ly, err := member(t, g, "y").TryAcquire(ctx) // expires first
	if err != nil {
		t.Fatal(err)
	}
	wx, wy := waitAcquire(ctx, member(t, f, "x")), waitAcquire(ctx, member(t, f, "y"))
	waitWaiters(t, ctx, member(t, f, "x"), 1)
	waitWaiters(t, ctx, member(t, f, "y"), 1)
	start := time.Now()
	r := <-wy
	if r.err != nil {
		t.Fatal(r.err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("granted %v after the holder's expiry was due: no early beat on its member", d)
	}
	if !errors.Is(ly.Renew(ctx), redsem.ErrLeaseLost) {
		t.Error("the expired holder's lease still renews")
	}
	_ = r.l.Release(ctx)
	select {
	case r := <-wx:
		t.Fatalf("x granted while held (%v)", r.err)
	default:
	}
	if err := lx.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-wx
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.l.Release(ctx)
}

func TestFamilyClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redistest.Client(t)
	f, err := fair.NewFamily(c, t.Name(), 1, fair.FamilyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := member(t, f, "k")
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := waitAcquire(ctx, s)
	waitWaiters(t, ctx, s, 1)
	if err := s.Close(); err != nil { // a member's Close does nothing
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-w; !errors.Is(r.err, redsem.ErrClosed) {
		t.Fatalf("blocked Acquire after Close: %v", r.err)
	}
	if _, err := f.Get("k"); !errors.Is(err, redsem.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, err := s.Acquire(ctx); !errors.Is(err, redsem.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("a lease after Close: %v", err)
	}
	waitWaiters(t, ctx, s, 0)
}

// The members of a family share the sessions key but not their horizons: a
// member whose keys expire soon must not shorten the sessions key's TTL
// below what another member set, and every key of the family has a TTL
// (but its shard record).
func TestFamilySessionsTTLNeverShortened(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	name := redistest.Name(t)
	long := newFamily(t, c, name, 1, fair.FamilyOptions{Options: fair.Options{LeaseTTL: time.Minute}})
	short := newFamily(t, c, name, 1, fair.FamilyOptions{Options: fair.Options{LeaseTTL: time.Second}})
	la, err := member(t, long, "a").TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = la.Release(ctx) }()
	sessions := core.KeysForMember(core.DefaultPrefix, name, "a").List[core.KeySessions]
	before, err := c.PTTL(ctx, sessions).Result()
	if err != nil || before < time.Minute {
		t.Fatalf("sessions key TTL %v (%v), want at least the long lease", before, err)
	}
	lb, err := member(t, short, "b").TryAcquire(ctx) // a fresh member: a horizon of seconds
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lb.Release(ctx) }()
	after, err := c.PTTL(ctx, sessions).Result()
	if err != nil || after < time.Minute {
		t.Fatalf("sessions key TTL %v after a short-lived member (%v), was %v", after, err, before)
	}
	keys, err := c.Keys(ctx, core.DefaultPrefix+":{"+name+"}:*").Result()
	if err != nil || len(keys) != 12 {
		t.Fatalf("family keys %v (%v)", keys, err)
	}
	for _, k := range keys {
		if k == core.ShardsKey(core.DefaultPrefix, name) {
			// The family's shard count: a record that outlives every member,
			// so that a client built with another count is refused.
			if v, err := c.Get(ctx, k).Result(); err != nil || v != "1" {
				t.Errorf("shard record %q (%v), want 1", v, err)
			}
			continue
		}
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl < 0 {
			t.Errorf("key %s: TTL %v (%v)", k, ttl, err)
		}
	}
}

// keysInShards returns one key per shard of a family of shards shards.
func keysInShards(shards int) []string {
	keys := make([]string, shards)
	for i, found := 0, 0; found < shards; i++ {
		k := fmt.Sprint("tenant-", i)
		if s := core.ShardOf(k, shards); keys[s] == "" {
			keys[s] = k
			found++
		}
	}
	return keys
}

// A family of several shards keeps each member's keys under its shard's
// tag, and a process keeps one session and one subscription per shard it
// uses (not per member, not one for all): waiters on the members of four
// shards make four pub/sub connections and four sessions, one in each
// shard's sessions key; Close ends the waiters of every shard.
func TestFamilyShards(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := redistest.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	const shards = 4
	f := newFamily(t, c, "fam", 1, fair.FamilyOptions{Shards: shards, Options: fair.Options{LeaseTTL: time.Minute}})
	keys := keysInShards(shards)
	keys = append(keys, keys[0]+"x", keys[1]+"y") // more members, some in the same shards
	var waits []<-chan acquired
	var leases []redsem.Lease
	for _, key := range keys {
		s := member(t, f, key)
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		k := core.MemberKeys(core.DefaultPrefix, "fam", shards, key)
		if n, err := admin.Exists(ctx, k.List[core.KeyHolders]).Result(); err != nil || n != 1 {
			t.Fatalf("member %q: holders key %s exists %d (%v)", key, k.List[core.KeyHolders], n, err)
		}
		waits = append(waits, waitAcquire(ctx, s))
		waitWaiters(t, ctx, s, 1)
	}
	if n := pubsubClients(t, ctx, admin); n != shards {
		t.Errorf("%d pub/sub connections for waiters in %d shards, want one per shard", n, shards)
	}
	for i, key := range keysInShards(shards) {
		sessions := core.MemberKeys(core.DefaultPrefix, "fam", shards, key).List[core.KeySessions]
		if n, err := admin.ZCard(ctx, sessions).Result(); err != nil || n != 2 { // the session and the sentinel
			t.Errorf("shard %d: %s holds %d members (%v), want one session", i, sessions, n, err)
		}
	}
	if v, err := admin.Get(ctx, core.ShardsKey(core.DefaultPrefix, "fam")).Result(); err != nil || v != "4" {
		t.Errorf("shard record %q (%v), want 4", v, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for i, w := range waits {
		if r := <-w; !errors.Is(r.err, redsem.ErrClosed) {
			t.Errorf("waiter %d (%q) after Close: %v", i, keys[i], r.err)
		}
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Errorf("a lease after Close: %v", err)
		}
	}
}

// Every client of a family must spread it over the same shards, or one key
// would be two semaphores with the whole limit each: the first user records
// its shard count, and a client built with another gets a ConfigError from
// Acquire and TryAcquire, at once and writing nothing. A family left at
// the default on a plain client records one shard.
func TestFamilyShardsMismatch(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, n := range []int{-1, core.MaxShards + 1} {
		if _, err := fair.NewFamily(c, "x", 1, fair.FamilyOptions{Shards: n}); !errors.Is(err, redsem.ErrInvalidConfig) {
			t.Errorf("Shards %d: %v, want ErrInvalidConfig", n, err)
		}
	}
	def := newFamily(t, c, "fam", 1, fair.FamilyOptions{})
	l, err := member(t, def, "a").TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	one := newFamily(t, srv.Client(t), "fam", 1, fair.FamilyOptions{Shards: 1})
	if _, err := member(t, one, "a").TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatalf("an explicit Shards: 1 next to the default: %v, want ErrNoSlot (the same semaphore)", err)
	}
	before, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	four := newFamily(t, srv.Client(t), "fam", 1, fair.FamilyOptions{Shards: 4})
	var ce *redsem.ConfigError
	if _, err := member(t, four, "a").TryAcquire(ctx); !errors.As(err, &ce) || ce.Field != "FamilyOptions.Shards" ||
		!strings.Contains(err.Error(), "over 1 shards") || !strings.Contains(err.Error(), "built with 4") {
		t.Fatalf("TryAcquire with 4 shards where 1 is recorded: %v", err)
	}
	start := time.Now()
	if _, err := member(t, four, "b").Acquire(ctx); !errors.Is(err, redsem.ErrInvalidConfig) || time.Since(start) > 2*time.Second {
		t.Fatalf("Acquire with 4 shards where 1 is recorded: %v after %v", err, time.Since(start))
	}
	// Nor may it change a member's limit or rate (the keys it would write
	// are no member's).
	if err := member(t, four, "a").SetLimit(ctx, 3); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Fatalf("SetLimit with 4 shards where 1 is recorded: %v", err)
	}
	if err := member(t, four, "a").SetRate(ctx, redsem.Rate{Limit: 1, Per: time.Second}); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Fatalf("SetRate with 4 shards where 1 is recorded: %v", err)
	}
	if after, err := c.DBSize(ctx).Result(); err != nil || after != before {
		keys, _ := c.Keys(ctx, "*").Result()
		t.Fatalf("%d keys after the refused calls, %d before (%v): %v", after, before, err, keys)
	}
}
