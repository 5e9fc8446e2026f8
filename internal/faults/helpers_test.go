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
	"github.com/redsem/redsem/unfair"
	"go.uber.org/goleak"
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
	NoAutoRenew                  bool
	Observer                     redsem.Observer
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
		s, err = fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, QueueTTL: o.QueueTTL,
			FallbackInterval: o.Fallback, DisableAutoRenew: o.NoAutoRenew, Observer: o.Observer})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL,
			FallbackInterval: o.Fallback, DisableAutoRenew: o.NoAutoRenew, Observer: o.Observer})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkLeaks makes the test fail if goroutines started during it are still
// running after its cleanups (call it first, so that its cleanup runs last).
func checkLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
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

// expectCleanState waits (up to within) until no key of the semaphore is left
// but the SetLimit override, which never expires, and checks that every key
// still there meanwhile has a TTL.
func expectCleanState(t *testing.T, c redis.UniversalClient, name string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within+5*time.Second)
	defer cancel()
	override := core.KeysFor(core.DefaultPrefix, name).List[core.KeyOverride]
	deadline := time.Now().Add(within)
	for {
		have, err := keysOf(ctx, c, name)
		if err != nil {
			t.Fatalf("clean state: %v", err)
		}
		var left []string
		for _, k := range have {
			if k == override {
				continue
			}
			if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl == -1 {
				t.Fatalf("clean state: key %s has no TTL", k)
			}
			left = append(left, k)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("clean state: keys left after %v: %v", within, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expectNoEntries checks, without waiting for the keys to expire, that the
// semaphore has no holder, lease, waiter or session entry left, and that
// every key but the override has a TTL of at most maxTTL.
func expectNoEntries(t *testing.T, c redis.UniversalClient, name string, maxTTL time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := core.KeysFor(core.DefaultPrefix, name).List
	for _, i := range []int{core.KeyHolders, core.KeyQueue, core.KeyBySession} {
		if n, err := c.ZCard(ctx, k[i]).Result(); err != nil || n != 0 {
			t.Fatalf("%s has %d entries (%v)", k[i], n, err)
		}
	}
	for _, i := range []int{core.KeyLeases, core.KeyWaiters} {
		if n, err := c.HLen(ctx, k[i]).Result(); err != nil || n != 0 {
			t.Fatalf("%s has %d entries (%v)", k[i], n, err)
		}
	}
	for _, key := range k[:core.KeyOverride] {
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -1 || ttl > maxTTL {
			t.Fatalf("key %s has TTL %v, want at most %v", key, ttl, maxTTL)
		}
	}
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
