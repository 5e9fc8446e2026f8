package fair_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/lua"
)

func ints(t *testing.T, v []any) []int64 {
	t.Helper()
	out := make([]int64, len(v))
	for i, x := range v {
		n, ok := x.(int64)
		if !ok {
			t.Fatalf("reply %v: element %d is %T", v, i, x)
		}
		out[i] = n
	}
	return out
}

func metaField(t *testing.T, ctx context.Context, c redis.UniversalClient, name, field string) string {
	t.Helper()
	v, err := c.HGet(ctx, keysOf(name).List[core.KeyMeta], field).Result()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A lost reply is harmless because every script is idempotent per waiter
// id: go-redis (or the caller) may run the same request again and it
// neither queues twice, nor admits twice, nor issues a second token.
func TestScriptsIdempotentPerID(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	const limit = 1
	acquire := func(id, mode, sid string) []int64 {
		t.Helper()
		v, err := script(ctx, c, lua.Acquire, name, limit, id, 60000, mode, sid, 60000)
		if err != nil {
			t.Fatal(err)
		}
		return ints(t, v)
	}

	// try mode, retried: the same slot and token, one holder.
	h1 := acquire("holder", "try", "")
	h2 := acquire("holder", "try", "")
	if h1[0] != 1 || h2[0] != 1 || h1[1] != h2[1] || h1[2] != h2[2] {
		t.Fatalf("retried try: %v then %v, want the same grant", h1, h2)
	}
	tokenAfterGrant := metaField(t, ctx, c, name, "token")

	// queue mode, retried: one queue entry, same position, no new arrival number.
	q1 := acquire("waiter", "queue", "sessionA")
	seq := metaField(t, ctx, c, name, "seq")
	q2 := acquire("waiter", "queue", "sessionA")
	if q1[0] != 0 || q2[0] != 0 || q1[2] != 0 || q2[2] != 0 {
		t.Fatalf("queued: %v then %v, want position 0 twice", q1, q2)
	}
	if r := raw(t, ctx, c, name); r.queue != 1 || r.waiters != 1 || r.bysess != 1 {
		t.Fatalf("after a retried queue request: %+v, want one entry", r)
	}
	if s := metaField(t, ctx, c, name, "seq"); s != seq {
		t.Fatalf("retried queue request took arrival number %s after %s", s, seq)
	}
	acquire("second", "queue", "sessionB")

	// Release, retried: the first frees the slot and grants it to the head;
	// the retry finds nothing and grants nothing more.
	r1, err := script(ctx, c, lua.Release, name, limit, "holder")
	if err != nil {
		t.Fatal(err)
	}
	if len(r1) != 6 || r1[0] != int64(1) || r1[2] != "waiter" {
		t.Fatalf("release reply %v, want kind 1 and one grant to the head waiter", r1)
	}
	rel := ints(t, []any{r1[0], r1[1], int64(0), r1[3], r1[4], r1[5]})
	r2, err := script(ctx, c, lua.Release, name, limit, "holder")
	if err != nil {
		t.Fatal(err)
	}
	if rel2 := ints(t, r2); rel2[0] != 0 || len(rel2) != 2 {
		t.Fatalf("retried release %v, want kind 0 and no grant", rel2)
	}
	slot, token := rel[3], rel[4]
	if tok := metaField(t, ctx, c, name, "token"); tok == tokenAfterGrant {
		t.Fatal("grant issued no new token")
	}

	// The grantee asks again (its claim, or a retried request): it gets the
	// grant it has, claims it, and a further retry changes nothing.
	tokenAfterHandoff := metaField(t, ctx, c, name, "token")
	for i := 0; i < 2; i++ {
		g := acquire("waiter", "queue", "sessionA")
		if g[0] != 1 || g[1] != slot || g[2] != token {
			t.Fatalf("claim %d: %v, want slot %d token %d", i, g, slot, token)
		}
	}
	if tok := metaField(t, ctx, c, name, "token"); tok != tokenAfterHandoff {
		t.Fatalf("a retried claim issued token %s after %s", tok, tokenAfterHandoff)
	}
	if r := raw(t, ctx, c, name); r.holders != 1 || r.queue != 1 || r.waiters != 1 || r.bysess != 1 {
		t.Fatalf("after the claim: %+v, want one holder (claimed) and one waiter", r)
	}

	// Heartbeat, retried: same report, no second grant.
	for i := 0; i < 2; i++ {
		v, err := script(ctx, c, lua.Heartbeat, name, limit, "sessionB", 60000, "second")
		if err != nil {
			t.Fatal(err)
		}
		if hb := ints(t, v); len(hb) != 6 || hb[2] != 0 || hb[3] != 0 {
			t.Fatalf("heartbeat %d: %v, want the waiter queued at position 0", i, hb)
		}
	}

	// Renew, retried, and release of the grantee: once, then nothing.
	for i := 0; i < 2; i++ {
		v, err := script(ctx, c, lua.Renew, name, limit, "waiter", 60000)
		if err != nil {
			t.Fatal(err)
		}
		if r := ints(t, v); r[0] != 1 {
			t.Fatalf("renew %d: %v", i, r)
		}
	}
	for i, want := range []int64{1, 0} {
		v, err := script(ctx, c, lua.Release, name, limit, "waiter")
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != want {
			t.Fatalf("release %d of the grantee: %v, want kind %d", i, v, want)
		}
	}
	// The first of those released grants to "second"; its release empties all.
	if _, err := script(ctx, c, lua.Release, name, limit, "second"); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, c, name)
}

// Bad arguments are refused before any write.
func TestScriptsRejectBadArgs(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	for _, args := range [][]any{
		{0, "id", 1000, "queue", "s", 1000},     // limit 0
		{1, "", 1000, "queue", "s", 1000},       // empty id
		{1, "id", 0, "queue", "s", 1000},        // lease_ms 0
		{1, "id", 1000, "wait", "s", 1000},      // bad mode
		{1, "id", 1000, "queue", "", 1000},      // no session
		{1, "id", 1000, "queue", "a|b", 1000},   // session with the separator
		{1, "id", 1000, "queue", "s", 0},        // queue_ms 0
		{1, "id", 1000, "queue", "s", "banana"}, // queue_ms not a number
	} {
		k := keysOf(name)
		err := lua.Acquire.Run(ctx, c, k.List, append([]any{k.Chan}, args...)...).Err()
		if err == nil {
			t.Errorf("acquire %v: no error", args)
		}
	}
	n, err := c.Exists(ctx, keysOf(name).List...).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("bad arguments wrote %d keys", n)
	}
}
