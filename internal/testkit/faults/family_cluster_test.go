package faults_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A keyed family works on a cluster: the keys of every member and its
// shard's shared sessions key and channels hash to one slot, and a member's
// waiter is woken by the sharded pub/sub grant of a release that another
// client (another process's family) made.
func TestClusterFamily(t *testing.T) {
	redistest.CheckLeaks(t)
	cl := redistest.StartCluster(t, 3, 0)
	ctx := redistest.Ctx(t, 60*time.Second)
	name := redistest.Name(t) + "{x}"

	cc := cl.Client(t)
	slot, err := cc.ClusterKeySlot(ctx, "{"+core.EscapeTag(name)+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cc.ClusterKeySlot(ctx, core.ShardsKey(core.DefaultPrefix, name)).Result(); err != nil || got != slot {
		t.Fatalf("shard record in slot %d (%v), the family's tag in %d", got, err, slot)
	}
	// The families below have 16 shards (set: the default is one): each
	// member's keys, its shard's sessions key and channels are in its
	// shard's slot (as Slot computes it).
	const shards = 16
	for _, key := range []string{"a", "b{", "}c", "%7B"} {
		k := core.MemberKeys(core.DefaultPrefix, name, shards, key)
		want := int64(core.Slot(k.List[0]))
		for _, rk := range append(append([]string(nil), k.List...), k.Chan, k.Free, k.Want, k.Chan+":s:0123456789abcdef") {
			got, err := cc.ClusterKeySlot(ctx, rk).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%s in slot %d, its shard's tag in %d", rk, got, want)
			}
		}
	}

	// Only the grant message can wake the waiter in time: long fallback and
	// lease, and the holder is in another family on another client.
	o := fair.FamilyOptions{Options: fair.Options{LeaseTTL: time.Minute, QueueTTL: 2 * time.Minute, FallbackInterval: time.Minute}, Shards: shards}
	holders, err := fair.NewFamily(cl.Client(t), name, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	defer holders.Close()
	waiters, err := fair.NewFamily(cl.Client(t), name, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	defer waiters.Close()
	for i := range 3 {
		key := fmt.Sprint("tenant-", i)
		h, err := holders.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w, err := waiters.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := w.Acquire(ctx)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		redistest.WaitFor(t, 10*time.Second, "the waiter queued", func() (bool, error) {
			st, err := h.Status(ctx)
			return err == nil && len(st.Waiters) == 1, err
		})
		start := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("woken after %v", d)
		}
	}
}
