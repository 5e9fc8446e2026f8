package lua_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// releasemany.lua answers for each id as release.lua's owner mode would,
// in ARGV order (a live lease 1 with its tombstone, an id named twice 1
// again, a lease never there 0), and admits the waiters that the freed
// slots let in once, after all of them: a waiter for two slots gets the two
// that two holders of the call gave back. A rerun finds the tombstones
// (1 again, nothing admitted); on a semaphore with no keys it writes
// nothing; bad arguments are refused and write nothing.
func TestReleaseManyCodes(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	const limit = 3
	call := func(args ...any) []any {
		t.Helper()
		r, err := run(ctx, t, c, args[0].(lua.Script), k, args[1:]...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return r
	}
	call(lua.Heartbeat, limit, "sess", 60000, "new")
	for _, id := range []string{"a", "b", "c"} { // slots 0, 1, 2
		if r := call(lua.Acquire, limit, id, 1, 60000, "queue", "sess", 0, "t", 0); r[0] != int64(1) {
			t.Fatalf("acquire %s: %v", id, r)
		}
	}
	if r := call(lua.Acquire, limit, "w", 2, 60000, "queue", "sess", 0, "t", 0); r[0] != int64(0) {
		t.Fatalf("w (two slots) not queued: %v", r)
	}

	r := call(lua.ReleaseMany, limit, 5000, "a", "never", "b", "a")
	if len(r) != 9 {
		t.Fatalf("releasemany: %v, want {now, 4 kinds, one grant of 4 fields}", r)
	}
	if r[1] != int64(1) || r[2] != int64(0) || r[3] != int64(1) || r[4] != int64(1) {
		t.Fatalf("releasemany: %v, want kinds 1 (a), 0 (never), 1 (b), 1 (a again)", r)
	}
	if r[5] != "w" || r[8] != "0,1" {
		t.Fatalf("releasemany: %v, want w granted the slots 0,1 that a and b gave back", r)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := c.ZScore(ctx, k.List[core.KeyEnded], id).Result(); err != nil {
			t.Fatalf("no tombstone for %s: %v", id, err)
		}
		if _, err := c.ZScore(ctx, k.List[core.KeyHolders], id).Result(); err == nil {
			t.Fatalf("%s still listed as a holder", id)
		}
	}
	if _, err := c.ZScore(ctx, k.List[core.KeyEnded], "never").Result(); err == nil {
		t.Fatal("a tombstone for an id that held nothing")
	}
	if again := call(lua.ReleaseMany, limit, 5000, "a", "b"); len(again) != 3 || again[1] != int64(1) || again[2] != int64(1) {
		t.Fatalf("rerun: %v, want {now, 1, 1} (the tombstones), nothing admitted", again)
	}

	// No keys at all (never used, or expired while idle): nothing written.
	k2 := core.KeysFor("redsem", redistest.Name(t)+"-none")
	if r, err := run(ctx, t, c, lua.ReleaseMany, k2, limit, 5000, "x", "y"); err != nil || len(r) != 3 || r[1] != int64(0) || r[2] != int64(0) {
		t.Fatalf("on no keys: %v %v, want {now, 0, 0}", r, err)
	}
	many := []any{limit, 1000}
	for i := 0; i <= 4096; i++ {
		many = append(many, "id-"+strconv.Itoa(i))
	}
	for desc, args := range map[string][]any{
		"no ids":        {limit, 1000},
		"4097 ids":      many,
		"empty id":      {limit, 1000, "a", ""},
		"zero record":   {limit, 0, "a"},
		"zero limit":    {0, 1000, "a"},
		"sentinel id":   {limit, 1000, "~"},
		"meta field id": {limit, 1000, "_limit"},
	} {
		if _, err := run(ctx, t, c, lua.ReleaseMany, k2, args...); err == nil {
			t.Errorf("%s: no error", desc)
		}
	}
	if n := c.Exists(ctx, k2.List...).Val(); n != 0 {
		t.Fatalf("%d keys written on a semaphore with none", n)
	}
}
