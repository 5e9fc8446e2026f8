package unfair_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

func newFamily(t *testing.T, name string, limit int, opts unfair.FamilyOptions) *unfair.Family {
	t.Helper()
	f, err := unfair.NewFamily(redistest.Client(t), name, limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func member(t *testing.T, f *unfair.Family, key string) *unfair.Semaphore {
	t.Helper()
	s, err := f.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Each member has its own limit and keys under the family's hash tag; a
// full member never blocks another.
func TestFamilyLimitsPerKey(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	name := redistest.Name(t)
	f := newFamily(t, name, 2, unfair.FamilyOptions{})
	var leases []redsem.Lease
	for _, key := range []string{"a", "b"} {
		s := member(t, f, key)
		for i := 0; i < 2; i++ {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("member %s, lease %d: %v", key, i, err)
			}
			leases = append(leases, l)
		}
		if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatalf("member %s over its limit: %v, want ErrNoSlot", key, err)
		}
		st, err := s.Status(ctx)
		if err != nil || st.Limit != 2 || len(st.Holders) != 2 {
			t.Fatalf("member %s: %+v, %v", key, st, err)
		}
	}
	k := core.KeysForMember(core.DefaultPrefix, name, "a")
	if n, err := redistest.Client(t).Exists(ctx, k.List[core.KeyHolders]).Result(); err != nil || n != 1 {
		t.Fatalf("member a's holders key %s: %d, %v", k.List[core.KeyHolders], n, err)
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The members of a family share one freed-slot channel; a release wakes
// the waiters of its own member only. Here the oldest waiter of the
// process waits on member b and a younger one on a; a's slot is freed by
// another process: a's waiter must be granted at once (the fallback is a
// minute away), b's must go on waiting. Before the notice named its
// member, the one wake-up went to b's older waiter, whose attempt failed,
// and a's waiter slept until its fallback.
// With four shards, a and b are in different shards: each shard has its
// own freed-slot channel and subscription.
func TestFamilyWakesOwnMember(t *testing.T) {
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprint("shards=", shards), func(t *testing.T) { testWakesOwnMember(t, shards) })
	}
}

func testWakesOwnMember(t *testing.T, shards int) {
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	o := unfair.FamilyOptions{Shards: shards, Options: unfair.Options{FallbackInterval: time.Minute, LeaseTTL: time.Minute}}
	other := newFamily(t, name, 1, o) // another process: its own client and hub
	waiting := newFamily(t, name, 1, o)
	holders := map[string]redsem.Lease{}
	for _, key := range []string{"a", "b"} {
		l, err := member(t, other, key).TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders[key] = l
	}
	got := map[string]chan redsem.Lease{}
	c := redistest.Client(t)
	for _, key := range []string{"b", "a"} { // b's waiter first: the older
		ch := make(chan redsem.Lease, 1)
		got[key] = ch
		s := member(t, waiting, key)
		go func() {
			l, err := s.Acquire(ctx)
			if err == nil {
				ch <- l
			}
		}()
		meta := core.MemberKeys(core.DefaultPrefix, name, shards, key).List[core.KeyMeta]
		redistest.WaitFor(t, 5*time.Second, key+"'s waiter asked for notices", func() (bool, error) {
			n, err := c.HExists(ctx, meta, "_want").Result()
			return n, err
		})
	}
	if err := holders["a"].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got["a"]:
		_ = l.Release(ctx)
	case <-time.After(2 * time.Second):
		t.Fatal("a's waiter was not woken by the release of a's slot (the wake-up went to another member's waiter)")
	}
	select {
	case <-got["b"]:
		t.Fatal("b's waiter was granted although b's slot is held")
	case <-time.After(100 * time.Millisecond):
	}
	if err := holders["b"].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got["b"]:
		_ = l.Release(ctx)
	case <-time.After(2 * time.Second):
		t.Fatal("b's waiter was not woken by the release of b's slot")
	}
}
