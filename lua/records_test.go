package lua_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Issue 19, found 5: the scripts' own bugs, one test each. Each failed on
// 521bc1f as its comment quotes (docs/testing.md lists them).

// A stored limit written from outside ("inf", "1e9", "nan", "2.5") is
// refused with an error naming it, before any write: it must not make the
// semaphore unlimited, shut or rounded. Before: "inf" and "1e9" granted
// (unlimited), "nan" refused every acquire as a limit mismatch, "2.5"
// granted under a rounded limit.
func TestStoredLimitValidated(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	for _, v := range []string{"inf", "1e9", "nan", "2.5", "0", "-3", "99999999999"} {
		k := core.KeysFor("redsem", redistest.Name(t)+"-"+v)
		if err := c.Set(ctx, k.List[core.KeyOverride], v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := run(ctx, t, c, lua.Acquire, k, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0)
		if err == nil || !strings.Contains(err.Error(), "the stored limit") {
			t.Errorf("stored limit %q: acquire replied %v, %v; want an error about the stored limit", v, r, err)
		}
		// A fair Acquire's first call is its session's first heartbeat:
		// before, it set the keys up without reading the stored limit, and
		// the acquire that followed never read it again (granted under the
		// client's own limit).
		r, err = run(ctx, t, c, lua.Heartbeat, k, 2, "session-1", 3000, "new")
		if err == nil || !strings.Contains(err.Error(), "the stored limit") {
			t.Errorf("stored limit %q: heartbeat replied %v, %v; want an error about the stored limit", v, r, err)
		}
		for i, key := range k.List {
			if i == core.KeyOverride {
				continue
			}
			if n, _ := c.Exists(ctx, key).Result(); n != 0 {
				t.Errorf("stored limit %q: the refused acquire wrote %s", v, key)
			}
		}
	}
}

// Every script checks that it got its nine keys. Before: a call with six
// ran, with KEYS[7] nil, and failed half-way through with a Lua error.
func TestKeysCounted(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	short := k
	short.List = k.List[:6]
	_, err := run(ctx, t, c, lua.Acquire, short, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0)
	if err == nil || !strings.Contains(err.Error(), "want 9 keys, got 6") {
		t.Fatalf("acquire with 6 keys: %v, want a refusal naming the count", err)
	}
}

// A SetLimit call record keeps the keys alive as long as itself, so that a
// copy of the call re-sent after the semaphore went idle (go-redis sends a
// command again after its read timeout, 3 s by default) finds it and
// changes nothing. Before: the record lived as long as the keys, which on
// an idle semaphore expire about 2 s after the call; the copy then set its
// limit again, over a later SetLimit of another client.
func TestSetLimitRecordOutlivesIdleKeys(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.SetLimit, k, 4, "call-a"); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.PTTL(ctx, k.List[core.KeyMeta]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 14*time.Second {
		t.Fatalf("the keys of an idle semaphore live %v after a SetLimit; its call record must last 15 s", ttl)
	}
	if _, err := run(ctx, t, c, lua.SetLimit, k, 1, "call-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.SetLimit, k, 4, "call-a"); err != nil { // the re-sent copy
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, k.List[core.KeyOverride]).Result(); v != "1" {
		t.Fatalf("limit %q after a re-sent SetLimit(4) that ran before SetLimit(1); want 1", v)
	}
}

// Pruning an ended id deletes its record only if it is a tombstone: an id
// that was a SetLimit call and then a lease keeps its lease record. Before:
// prune deleted whatever record an ended id had, leaving a holder entry
// without its lease record (a slot that no release can free).
func TestPruneDeletesOnlyTombstones(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.SetLimit, k, 3, "reused-id"); err != nil {
		t.Fatal(err)
	}
	if r, err := run(ctx, t, c, lua.Acquire, k, 3, "reused-id", 1, 60000, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
		t.Fatalf("acquire under an id that was a SetLimit call: %v, %v", r, err)
	}
	// Time passes: the call's entry in "ended" is due, and prune is due.
	if err := c.ZAdd(ctx, k.List[core.KeyEnded], redisZ(1, "reused-id")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, k.List[core.KeyMeta], "_prune", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.Acquire, k, 3, "other", 1, 60000, "try", "-", 1000, "test", 0); err != nil {
		t.Fatal(err)
	}
	rec, err := c.HGet(ctx, k.List[core.KeyMeta], "reused-id").Result()
	if err != nil || !strings.HasPrefix(rec, "L|") {
		t.Fatalf("the live lease's record after prune: %q, %v; want its lease record", rec, err)
	}
	if r, err := run(ctx, t, c, lua.Release, k, 3, "reused-id", "owner", 15000); err != nil || r[0] != int64(1) {
		t.Fatalf("release of the lease: %v, %v; want released", r, err)
	}
}

// A waiter's lease time of 1e14 ms and more is stored as digits, and the
// waiter stays live. Before: Lua's own conversion wrote "1e+14" into the
// record, which the record's pattern then failed to read: the waiter was
// taken for dead and evicted.
func TestLargeLeaseRecord(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.Heartbeat, k, 1, "sess", 60000, "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.Acquire, k, 1, "holder", 1, 60000, "queue", "sess", 1000, "test", 0); err != nil {
		t.Fatal(err)
	}
	const big = "100000000000000" // 1e14 ms
	if r, err := run(ctx, t, c, lua.Acquire, k, 1, "waiter", 1, big, "queue", "sess", 1000, "test", 0); err != nil || r[0] != int64(0) {
		t.Fatalf("queueing with lease_ms 1e14: %v, %v", r, err)
	}
	rec, _ := c.HGet(ctx, k.List[core.KeyMeta], "waiter").Result()
	if !strings.Contains(rec, "|"+big+"|") {
		t.Fatalf("waiter record %q, want lease_ms written as %s", rec, big)
	}
	r, err := run(ctx, t, c, lua.Release, k, 1, "holder", "owner", 15000)
	if err != nil {
		t.Fatal(err)
	}
	if len(r) < 3 || r[2] != "waiter" {
		t.Fatalf("release admitted %v; want the waiter granted", r)
	}
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
