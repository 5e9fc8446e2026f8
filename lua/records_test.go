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

// A setting (SetLimit, SetRate, SetTotal) whose request reaches Redis after
// its caller gave up changes nothing: past its refuse_after bound it
// writes nothing and says so ({-1, now}); after its call id was cancelled
// (the caller gave up without a deadline) it finds its record. Before
// issue 43's review, a SetTotal(1) (or SetLimit(1)) held in the network
// past its caller's deadline ran after another client's later SetTotal(5)
// had returned, and set 1 for good.
func TestLateSettingChangesNothing(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	past := now.UnixMilli() - 1
	if _, err := run(ctx, t, c, lua.SetLimit, k, 5, "call-b", 0); err != nil {
		t.Fatal(err)
	}
	r, err := run(ctx, t, c, lua.SetLimit, k, 1, "call-late", past)
	if err != nil || len(r) < 1 || r[0] != int64(-1) {
		t.Fatalf("SetLimit past its refuse_after: %v, %v; want {-1, now}", r, err)
	}
	if _, err := run(ctx, t, c, lua.SetRate, k, 5, "call-late-rate", 1, 1000, past); err != nil {
		t.Fatal(err)
	}
	// Cancelled, then the request itself.
	if _, err := run(ctx, t, c, lua.SetLimit, k, 5, "call-gone", 0, "cancel"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.SetLimit, k, 1, "call-gone", 0); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, k.List[core.KeyOverride]).Result(); v != "5" {
		t.Fatalf("limit %q after late SetLimit(1) requests; want 5", v)
	}
	if n, _ := c.Exists(ctx, k.List[core.KeyRate]).Result(); n != 0 {
		t.Fatalf("a SetRate past its refuse_after wrote the rate")
	}

	fam := core.FamilyKeys("redsem", redistest.Name(t)+"-fam")
	base := strings.TrimSuffix(fam[core.FamTot], "tot")
	keys := append(append([]string{}, fam...), base+"sessions")
	setTotal := func(args ...any) ([]any, error) {
		return core.Script(lua.SetTotal).Run(ctx, c, keys, append([]any{base + "ch", "PUBLISH", "2+3:f"}, args...)...).Slice()
	}
	if _, err := setTotal(5, "t-b", 0); err != nil {
		t.Fatal(err)
	}
	if r, err := setTotal(1, "t-late", past); err != nil || r[0] != int64(-1) {
		t.Fatalf("SetTotal past its refuse_after: %v, %v; want {-1, now}", r, err)
	}
	if _, err := setTotal(5, "t-gone", 0, "cancel"); err != nil {
		t.Fatal(err)
	}
	if _, err := setTotal(1, "t-gone", 0); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, fam[core.FamTotal]).Result(); v != "5" {
		t.Fatalf("total %q after late SetTotal(1) requests; want 5", v)
	}
}
