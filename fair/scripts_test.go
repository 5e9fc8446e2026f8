package fair_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
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
		v, err := script(ctx, c, lua.Acquire, name, limit, id, 1, 60000, mode, sid, 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		return ints(t, v)
	}
	for _, sid := range []string{"sessionA", "sessionB"} {
		if _, err := script(ctx, c, lua.Heartbeat, name, limit, sid, 60000, "new"); err != nil {
			t.Fatal(err)
		}
	}

	// try mode, retried: the same slot and token, one holder.
	h1 := acquire("holder", "try", "-")
	h2 := acquire("holder", "try", "-")
	if h1[0] != 1 || h2[0] != 1 || h1[2] != h2[2] || h1[4] != h2[4] {
		t.Fatalf("retried try: %v then %v, want the same grant", h1, h2)
	}
	tokenAfterGrant := metaField(t, ctx, c, name, "_token")

	// queue mode, retried: one queue entry, same position, no new arrival number.
	q1 := acquire("waiter", "queue", "sessionA")
	seq := metaField(t, ctx, c, name, "_seq")
	q2 := acquire("waiter", "queue", "sessionA")
	if q1[0] != 0 || q2[0] != 0 || q1[3] != 0 || q2[3] != 0 {
		t.Fatalf("queued: %v then %v, want position 0 twice", q1, q2)
	}
	if r := raw(t, ctx, c, name); r.queue != 1 || r.waiters != 1 {
		t.Fatalf("after a retried queue request: %+v, want one entry", r)
	}
	if s := metaField(t, ctx, c, name, "_seq"); s != seq {
		t.Fatalf("retried queue request took arrival number %s after %s", s, seq)
	}
	acquire("second", "queue", "sessionB")

	// Release, retried: the first frees the slot and grants it to the head;
	// the retry finds its tombstone and grants nothing more.
	r1, err := script(ctx, c, lua.Release, name, limit, "holder", "owner", 10000)
	if err != nil {
		t.Fatal(err)
	}
	if len(r1) != 6 || r1[0] != int64(1) || r1[2] != "waiter" || r1[5] != "0" {
		t.Fatalf("release reply %v, want kind 1 and one grant of slot 0 to the head waiter", r1)
	}
	token := r1[3].(int64)
	r2, err := script(ctx, c, lua.Release, name, limit, "holder", "owner", 10000)
	if err != nil {
		t.Fatal(err)
	}
	if rel2 := ints(t, r2); rel2[0] != 1 || len(rel2) != 2 {
		t.Fatalf("retried release %v, want kind 1 (the tombstone) and no grant", rel2)
	}
	if tok := metaField(t, ctx, c, name, "_token"); tok == tokenAfterGrant {
		t.Fatal("grant issued no new token")
	}

	// The grantee asks again (a retried request, or a lost message): it
	// gets the grant it has, and a further retry changes nothing.
	tokenAfterHandoff := metaField(t, ctx, c, name, "_token")
	for i := 0; i < 2; i++ {
		g := acquire("waiter", "queue", "sessionA")
		if g[0] != 1 || g[2] != token || len(g) != 5 || g[4] != 0 {
			t.Fatalf("ask %d: %v, want slot 0 token %d", i, g, token)
		}
	}
	if tok := metaField(t, ctx, c, name, "_token"); tok != tokenAfterHandoff {
		t.Fatalf("a retried request issued token %s after %s", tok, tokenAfterHandoff)
	}
	if r := raw(t, ctx, c, name); r.holders != 1 || r.queue != 1 || r.waiters != 1 {
		t.Fatalf("after the handoff: %+v, want one holder and one waiter", r)
	}

	// Heartbeat, retried: the session lives on, no grant.
	for i := 0; i < 2; i++ {
		v, err := script(ctx, c, lua.Heartbeat, name, limit, "sessionB", 60000, "old")
		if err != nil {
			t.Fatal(err)
		}
		if hb := ints(t, v); len(hb) != 3 || hb[1] != 1 {
			t.Fatalf("heartbeat %d: %v, want the session alive and no grant", i, hb)
		}
	}

	// Renew, retried, and release of the grantee: once, then the tombstone.
	for i := 0; i < 2; i++ {
		v, err := script(ctx, c, lua.Renew, name, limit, "waiter", 60000)
		if err != nil {
			t.Fatal(err)
		}
		if r := ints(t, v); r[0] != 1 {
			t.Fatalf("renew %d: %v", i, r)
		}
	}
	for i := 0; i < 2; i++ {
		v, err := script(ctx, c, lua.Release, name, limit, "waiter", "owner", 10000)
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != int64(1) || (i == 1 && len(v) != 2) {
			t.Fatalf("release %d of the grantee: %v, want kind 1 (and no grant on the retry)", i, v)
		}
	}
	// The first of those released grants to "second"; its release empties all.
	if _, err := script(ctx, c, lua.Release, name, limit, "second", "owner", 10000); err != nil {
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
		{0, "id", 1, 1000, "queue", "s", 1000, "o", 0},      // limit 0
		{1, "", 1, 1000, "queue", "s", 1000, "o", 0},        // empty id
		{1, "id", 0, 1000, "queue", "s", 1000, "o", 0},      // weight 0
		{1, "id", 1, 0, "queue", "s", 1000, "o", 0},         // lease_ms 0
		{1, "id", 1, 1000, "grab", "s", 1000, "o", 0},       // bad mode
		{1, "id", 1, 1000, "queue", "", 1000, "o", 0},       // no session
		{1, "id", 1, 1000, "queue", "a|b", 1000, "o", 0},    // session with the separator
		{1, "id", 1, 1000, "queue", "s", 1000, "o", -1},     // negative queue bound
		{1, "id", 1, 1000, "queue", "s", 1000, "o", "lots"}, // queue bound not a number
		{1, "id", 1, 1000, "queue", "s", 1000, "a|b", 0},    // owner with the separator
		{1, "id", 1, 1000, "wait", "-", "banana", "o", 0},   // want_ms not a number
		{1, "id", "two", 1000, "queue", "s", 1000, "o", 0},  // weight not a number
	} {
		k := keysOf(name)
		err := core.Script(lua.Acquire).Run(ctx, c, k.List, append([]any{k.Chan, "PUBLISH"}, args...)...).Err()
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
