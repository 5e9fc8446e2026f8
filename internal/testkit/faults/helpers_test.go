package faults_test

import (
	"context"
	"errors"
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
	"github.com/redsem/redsem/unfair"
)

// variant builds one of the two semaphores with common options, so that a
// fault test runs against both.
type variant struct {
	name string
	fair bool
}

var variants = []variant{{"unfair", false}, {"fair", true}}

// opts are the options a fault test may set; fields not used by a variant
// are ignored.
type opts struct {
	LeaseTTL, QueueTTL, Fallback time.Duration
	MaxHold                      time.Duration
	NoAutoRenew                  bool
	Observer                     redsem.Observer
	MinReplicas                  int
	ReplicaTimeout               time.Duration
}

// closer is what both variants have besides redsem.Semaphore.
type closer interface {
	redsem.Semaphore
	Close() error
}

func (v variant) new(t testing.TB, c redis.UniversalClient, name string, limit int, o opts) closer {
	t.Helper()
	var s closer
	var err error
	if v.fair {
		s, err = fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, QueueTTL: o.QueueTTL, MaxHold: o.MaxHold,
			FallbackInterval: o.Fallback, DisableAutoRenew: o.NoAutoRenew, Observer: o.Observer,
			MinReplicas: o.MinReplicas, ReplicaTimeout: o.ReplicaTimeout})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, MaxHold: o.MaxHold,
			FallbackInterval: o.Fallback, DisableAutoRenew: o.NoAutoRenew, Observer: o.Observer,
			MinReplicas: o.MinReplicas, ReplicaTimeout: o.ReplicaTimeout})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// keysOf lists the Redis keys of semaphore name that exist now.
func keysOf(ctx context.Context, c redis.UniversalClient, name string) ([]string, error) {
	var have []string
	for _, k := range core.KeysFor(core.DefaultPrefix, name).List {
		n, err := c.Exists(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if n == 1 {
			have = append(have, k)
		}
	}
	sort.Strings(have)
	return have, nil
}

// The horizon of lua/lib_*.lua: every key of a semaphore but the SetLimit
// override expires at the horizon, which a script moves, when an entry it
// writes outlives it, to until + keyMargin + max(until - now, keyMargin).
// Release tombstones and cancellation records live recordLife.
const (
	keyMargin  = time.Second
	recordLife = 15 * time.Second
)

// horizonBound is the longest TTL that a semaphore's keys may have when no
// entry written lives longer than longest (tombstones included).
func horizonBound(longest time.Duration) time.Duration {
	return 2*max(longest, recordLife, keyMargin) + keyMargin
}

// statusOf reads the live state of semaphore name through c, as the redsem
// command does (Status runs read-only, so c may be a replica's client).
func statusOf(ctx context.Context, c redis.UniversalClient, name string) (redsem.Status, error) {
	e, err := core.New(core.Config{Client: c, Name: name, Limit: 1, Prefix: core.DefaultPrefix})
	if err != nil {
		return redsem.Status{}, err
	}
	defer e.Close()
	return e.Status(ctx)
}

// forceRelease releases id (a lease or a fair waiter) behind its holder's
// back, as "redsem release NAME ID" does; it returns the kind of release
// (core.ReleasedLease, core.ReleasedWaiter, core.ReleasedNothing).
func forceRelease(ctx context.Context, c redis.UniversalClient, name, id string) (int, error) {
	e, err := core.New(core.Config{Client: c, Name: name, Limit: 1, Prefix: core.DefaultPrefix})
	if err != nil {
		return 0, err
	}
	defer e.Close()
	kind, _, err := e.ForceRelease(ctx, id)
	return kind, err
}

// expectKeysExpire checks that every key of the semaphore but the SetLimit
// override, which never expires, has a TTL of at most horizonBound(longest):
// whatever is left vanishes by itself.
func expectKeysExpire(t *testing.T, ctx context.Context, c redis.UniversalClient, name string, longest time.Duration) {
	t.Helper()
	have, err := keysOf(ctx, c, name)
	if err != nil {
		t.Fatalf("keys: %v", err)
	}
	override := core.KeysFor(core.DefaultPrefix, name).List[core.KeyOverride]
	bound := horizonBound(longest)
	for _, k := range have {
		if k == override {
			continue
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -2 {
			continue // expired meanwhile
		}
		if ttl < 0 || ttl > bound {
			t.Fatalf("key %s has TTL %v, want at most %v", k, ttl, bound)
		}
	}
}

// expectCleanState waits (up to within) until the semaphore has no live
// holder or waiter left, and checks that every key but the SetLimit override
// expires by itself within the horizon of entries that live within at most.
// (The keys themselves outlive their entries by design: release tombstones
// live 15s, and the horizon is extended by doubling; expired holder entries
// are removed by the next script that runs after their deadline.)
func expectCleanState(t *testing.T, c redis.UniversalClient, name string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within+5*time.Second)
	defer cancel()
	eventually(t, within, "clean state", func() error {
		st, err := statusOf(ctx, c, name)
		if err != nil {
			return err
		}
		if len(st.Holders)+len(st.Waiters) > 0 {
			return errorf("holders %+v, waiters %+v left", st.Holders, st.Waiters)
		}
		return nil
	})
	expectKeysExpire(t, ctx, c, name, within)
}

// expectNoEntries checks, without waiting for anything to expire, that the
// semaphore has no holder, lease, queue or waiter entry left (core.Inspect),
// and that every key but the override has a TTL within the horizon of
// entries that live longest at most.
func expectNoEntries(t *testing.T, c redis.UniversalClient, name string, longest time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := core.Inspect(ctx, c, core.KeysFor(core.DefaultPrefix, name))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Live() {
		t.Fatalf("entries left: %+v", raw)
	}
	expectKeysExpire(t, ctx, c, name, longest)
}

// eventually polls cond every 20ms until it returns nil or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// poll calls cond every 20ms until it returns nil or within passes, and
// returns its last error.
func poll(within time.Duration, cond func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waiters returns how many live waiters (fair) the semaphore reports.
func waitersOf(ctx context.Context, s redsem.Semaphore) (int, error) {
	st, err := s.Status(ctx)
	if err != nil {
		return 0, err
	}
	return len(st.Waiters), nil
}

// expectHolders fails unless exactly the given lease ids hold slots.
func expectHolders(t *testing.T, ctx context.Context, s redsem.Semaphore, ids ...string) {
	t.Helper()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var got []string
	for _, h := range st.Holders {
		got = append(got, h.ID)
	}
	sort.Strings(got)
	want := append([]string(nil), ids...)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("holders %v, want %v", got, want)
	}
}

// acquireAsync runs Acquire in a goroutine; the result arrives on the channel.
type result struct {
	l   redsem.Lease
	err error
}

func acquireAsync(ctx context.Context, s redsem.Semaphore) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx)
		ch <- result{l, err}
	}()
	return ch
}

// await waits for an async Acquire, failing the test after within.
func await(t *testing.T, ch <-chan result, within time.Duration, what string) redsem.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(within):
		t.Fatalf("%s: Acquire did not return within %v", what, within)
	}
	return nil
}

var errNotYet = errors.New("not yet")

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// proxied starts a redis-server with a fault-injecting proxy in front of it,
// and returns the proxy, a client that goes through it and one that does not.
func proxied(t *testing.T) (p *redistest.Proxy, viaProxy, direct *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	p = redistest.StartProxy(t, srv.Addr)
	opt := srv.Options()
	opt.Addr = p.Addr
	viaProxy = redis.NewClient(opt)
	t.Cleanup(func() { _ = viaProxy.Close() })
	return p, viaProxy, srv.Client(t)
}

// droppedReplies returns how many replies p has lost so far.
func droppedReplies(p *redistest.Proxy) int {
	dropped, _ := p.Faults()
	return dropped
}
