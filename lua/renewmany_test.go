package lua_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// renewmany.lua answers for each id as renew.lua would: a live lease is
// extended (never moved earlier), a lease released by its holder is -1, a
// lease gone or never there is 0, and a lease listed past its deadline is
// dropped from the holders; bad arguments write nothing.
func TestRenewManyCodes(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	const limit = 5
	for _, id := range []string{"live-1", "live-2", "released", "stale"} {
		lease := 5000
		if id == "stale" {
			lease = 30
		}
		if r, err := run(ctx, t, c, lua.Acquire, k, limit, id, 1, lease, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
			t.Fatalf("acquire %s: %v %v", id, r, err)
		}
	}
	if r, err := run(ctx, t, c, lua.Release, k, limit, "released", "owner", 15000); err != nil || r[0] != int64(1) {
		t.Fatalf("release: %v %v", r, err)
	}
	time.Sleep(60 * time.Millisecond) // "stale" is past its deadline, still listed
	if n := c.ZCard(ctx, k.List[core.KeyHolders]).Val(); n != 4 {
		t.Fatalf("%d holders listed before the renewal, want 4 (the sentinel, the stale one still there)", n)
	}
	before := c.ZScore(ctx, k.List[core.KeyHolders], "live-2").Val()

	r, err := run(ctx, t, c, lua.RenewMany, k, limit, 20000, "live-1", "released", "never", "stale", "live-2")
	if err != nil || len(r) != 6 {
		t.Fatalf("renewmany: %v %v, want {now, 5 codes}", r, err)
	}
	now := r[0].(int64)
	for _, i := range []int{1, 5} {
		if d, _ := r[i].(int64); d < now+20000 || d > now+20000+5 {
			t.Fatalf("reply %v: a live lease's deadline %v, want now+20000 (%d)", r, r[i], now+20000)
		}
	}
	if r[2] != int64(-1) || r[3] != int64(0) || r[4] != int64(0) {
		t.Fatalf("reply %v: want -1 (released by its holder), 0 (never there), 0 (past its deadline)", r)
	}
	if got := c.ZScore(ctx, k.List[core.KeyHolders], "live-2").Val(); got <= before {
		t.Fatalf("live-2's score %v, was %v: not extended", got, before)
	}
	if _, err := c.ZScore(ctx, k.List[core.KeyHolders], "stale").Result(); err == nil {
		t.Fatal("the stale lease is still listed after renewmany found it past its deadline")
	}

	// Never earlier: a shorter lease_ms leaves the deadlines as they are.
	again, err := run(ctx, t, c, lua.RenewMany, k, limit, 1, "live-1", "live-2")
	if err != nil || again[1] != r[1] || again[2] != r[5] {
		t.Fatalf("renewmany with lease_ms 1: %v %v, want the deadlines %v and %v kept", again, err, r[1], r[5])
	}

	// Bad arguments: refused, nothing written.
	k2 := core.KeysFor("redsem", redistest.Name(t)+"-bad")
	many := []any{limit, 1000}
	for i := 0; i <= 4096; i++ {
		many = append(many, "id-"+strconv.Itoa(i))
	}
	for desc, args := range map[string][]any{
		"no ids":        {limit, 1000},
		"4097 ids":      many,
		"empty id":      {limit, 1000, "a", ""},
		"zero lease":    {limit, 0, "a"},
		"zero limit":    {0, 1000, "a"},
		"sentinel id":   {limit, 1000, "~"},
		"meta field id": {limit, 1000, "_limit"},
	} {
		if _, err := run(ctx, t, c, lua.RenewMany, k2, args...); err == nil {
			t.Errorf("%s: no error", desc)
		}
	}
	if n := c.Exists(ctx, k2.List...).Val(); n != 0 {
		t.Fatalf("%d keys written by refused calls", n)
	}
}
