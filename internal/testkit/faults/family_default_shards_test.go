package faults_test

import (
	"context"
	"errors"
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

// familyOf returns a get function for the family name of the variant on
// client c with shards shards (zero: the default), closed when the test
// ends: one process's family.
func familyOf(t *testing.T, variant string, c redis.UniversalClient, name string, shards int) func(key string) redsem.Semaphore {
	t.Helper()
	o := fair.Options{LeaseTTL: time.Minute, QueueTTL: time.Minute, FallbackInterval: 200 * time.Millisecond}
	var get func(string) (redsem.Semaphore, error)
	if variant == "fair" {
		f, err := fair.NewFamily(c, name, 1, fair.FamilyOptions{Options: o, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		get = func(key string) (redsem.Semaphore, error) { return f.Get(key) }
	} else {
		f, err := unfair.NewFamily(c, name, 1, unfair.FamilyOptions{Options: unfair.Options{
			LeaseTTL: o.LeaseTTL, FallbackInterval: o.FallbackInterval}, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		get = func(key string) (redsem.Semaphore, error) { return f.Get(key) }
	}
	return func(key string) redsem.Semaphore {
		t.Helper()
		s, err := get(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// A family left at the default shard count on a cluster client keeps the
// layout of families made before shards existed, so that it shares its
// members with processes of an older version, which write their keys under
// the family's tag and no shard record. On a one-node cluster, a process
// of the older layout (simulated: a family of one shard whose record is
// then deleted, as the older version never wrote one; its holders key is
// the older version's, redsem:{FAMILY}:m:KEY:holders) holds member "k" of
// limit 1. A process with the default is then refused "k" (before the fix
// it used 16 shards, other keys, and was a second holder of "k"), sees the
// holder in Status, and records one shard; a process built with 16 shards
// is refused with a ConfigError and writes nothing. Once the old process
// releases "k", the default one gets it.
func TestClusterFamilyDefaultKeepsOldLayout(t *testing.T) {
	cl := redistest.StartCluster(t, 1, 0)
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			redistest.CheckLeaks(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			admin := cl.Client(t)
			record := core.ShardsKey(core.DefaultPrefix, name)

			old := familyOf(t, variant, cl.Client(t), name, 1)
			held, err := old("k").TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Del(ctx, record).Err(); err != nil { // an older process writes no record
				t.Fatal(err)
			}
			// The older version's key for the holders of member k (KeysForMember
			// before shards, ecfa379^).
			if n, err := admin.Exists(ctx, core.DefaultPrefix+":{"+name+"}:m:k:holders").Result(); err != nil || n != 1 {
				t.Fatalf("the older layout's holders key exists %d (%v)", n, err)
			}

			def := familyOf(t, variant, cl.Client(t), name, 0)
			if l, err := def("k").TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				if err == nil {
					_ = l.Release(ctx)
				}
				t.Fatalf("TryAcquire of k (limit 1, held by a process of the older layout) with the default shards: %v, want ErrNoSlot", err)
			}
			st, err := def("k").Status(ctx)
			if err != nil || len(st.Holders) != 1 {
				t.Fatalf("Status of k with the default shards: %d holders (%v), want the older process's one", len(st.Holders), err)
			}
			if v, err := admin.Get(ctx, record).Result(); err != nil || v != "1" {
				t.Fatalf("shard record %q (%v) after a default client's call, want 1", v, err)
			}

			sixteen := familyOf(t, variant, cl.Client(t), name, 16)
			k16 := core.MemberKeys(core.DefaultPrefix, name, 16, "k")
			var ce *redsem.ConfigError
			if l, err := sixteen("k").TryAcquire(ctx); !errors.As(err, &ce) || ce.Field != "FamilyOptions.Shards" {
				if err == nil {
					_ = l.Release(ctx)
				}
				t.Fatalf("TryAcquire of k with Shards: 16 where the default recorded 1: %v, want a ConfigError", err)
			}
			if n, err := admin.Exists(ctx, k16.List[core.KeyHolders], k16.List[core.KeyMeta]).Result(); err != nil || n != 0 {
				t.Fatalf("%d keys of the 16-shard layout (%v), want none", n, err)
			}

			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := def("k").TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire of k with the default once the older process released it: %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A family whose record says more than one shard (a client built with
// Shards: 16 used it first, as the previous version's default did on a
// cluster client) is refused to a client left at the default, with a
// ConfigError that names both counts, from TryAcquire, Acquire, SetLimit
// and SetRate, writing nothing: a default never spreads a family, and
// never splits one.
func TestClusterFamilyDefaultRefusesOtherRecord(t *testing.T) {
	redistest.CheckLeaks(t)
	cl := redistest.StartCluster(t, 1, 0)
	ctx := redistest.Ctx(t, 60*time.Second)
	name := redistest.Name(t)
	admin := cl.Client(t)

	sixteen := familyOf(t, "fair", cl.Client(t), name, 16)
	held, err := sixteen("k").TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Release(ctx) }()
	if v, err := admin.Get(ctx, core.ShardsKey(core.DefaultPrefix, name)).Result(); err != nil || v != "16" {
		t.Fatalf("shard record %q (%v), want 16", v, err)
	}
	before, err := admin.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	def := familyOf(t, "unfair", cl.Client(t), name, 0)
	mismatch := func(what string, err error) {
		t.Helper()
		var ce *redsem.ConfigError
		if !errors.As(err, &ce) || ce.Field != "FamilyOptions.Shards" || !strings.Contains(err.Error(), "over 16 shards") ||
			!strings.Contains(err.Error(), "default") {
			t.Fatalf("%s with the default where 16 shards are recorded: %v, want a ConfigError naming 16 and the default", what, err)
		}
	}
	_, err = def("k").TryAcquire(ctx)
	mismatch("TryAcquire", err)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = def("j").Acquire(actx)
	cancel()
	mismatch("Acquire", err)
	mismatch("SetLimit", def("k").SetLimit(ctx, 2))
	mismatch("SetRate", def("k").SetRate(ctx, redsem.Rate{Limit: 1, Per: time.Second}))
	if after, err := admin.DBSize(ctx).Result(); err != nil || after != before {
		t.Fatalf("%d keys after the refused calls, %d before (%v)", after, before, err)
	}
}
