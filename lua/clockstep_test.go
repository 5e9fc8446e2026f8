package lua_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// The fencing counter ahead of the server's clock, as after a step back of
// the clock: a grant keeps the keys, and the counter with them, until the
// clock has passed its token, so that a token granted once they expired
// (the clock's alone) is above every token granted before. Planted: the
// counter 2.2 s ahead of the clock, past the horizon (2.1 s away) that a
// lease of 100 ms gives the keys. Before: the keys expired with the counter
// 0.1 s ahead of the clock, and the next grant's token was below it.
func TestTokenOutlivesKeys(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	grant := func(id string) int64 {
		t.Helper()
		r, err := run(ctx, t, c, lua.Acquire, k, 2, id, 1, 100, "try", "-", 1000, "test", 0)
		if err != nil || r[0] != int64(1) {
			t.Fatalf("acquire %s: %v %v", id, r, err)
		}
		if _, err := run(ctx, t, c, lua.Release, k, 2, id, "owner", 100); err != nil {
			t.Fatal(err)
		}
		return r[2].(int64)
	}
	grant("a")
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ahead := now.UnixMicro() + (2200 * time.Millisecond).Microseconds()
	meta := k.List[core.KeyMeta]
	if err := c.HSet(ctx, meta, "_token", strconv.FormatInt(ahead, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if tok := grant("b"); tok != ahead+1 {
		t.Fatalf("token %d after the counter was set to %d", tok, ahead)
	}
	l, err := redistest.ReadLayout(ctx, c, k.List)
	if err != nil {
		t.Fatal(err)
	}
	if p := l.Check(2); !p.OK() {
		t.Fatalf("after a grant with the counter ahead of the clock: %v", p)
	}
	redistest.WaitFor(t, 10*time.Second, "the keys to expire or the clock to pass the token", func() (bool, error) {
		n, err := c.Exists(ctx, meta).Result()
		if err != nil || n == 0 {
			return true, err
		}
		now, err := c.Time(ctx).Result()
		return now.UnixMicro() > ahead+1, err
	})
	if tok := grant("c"); tok <= ahead+1 {
		t.Fatalf("token went backwards: %d after %d", tok, ahead+1)
	}
}
