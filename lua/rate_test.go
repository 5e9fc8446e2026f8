package lua_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// windowSum is the slots of the window's records (sentinel aside).
func windowSum(t *testing.T, recs []string) int {
	t.Helper()
	sum := 0
	for _, m := range recs {
		if m == core.Sentinel {
			continue
		}
		_, w, ok := strings.Cut(m, ":")
		if !ok {
			t.Fatalf("window record %q", m)
		}
		n := 0
		for _, ch := range w {
			n = 10*n + int(ch-'0')
		}
		sum += n
	}
	return sum
}

// A re-sent acquire (same id) and renewals record nothing in the window; a
// weighted grant records its weight once.
func TestRateResentAndRenewCountNothing(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	lim := "5:4:60000" // limit 5, rate 4 per minute
	for i := 0; i < 3; i++ {
		r, err := run(ctx, t, c, lua.Acquire, k, lim, "id-1", 2, 5000, "try", "-", 1000, "test", 0)
		if err != nil || r[0] != int64(1) {
			t.Fatalf("acquire %d: %v %v", i, r, err)
		}
		if _, err := run(ctx, t, c, lua.Renew, k, lim, "id-1", 5000); err != nil {
			t.Fatal(err)
		}
	}
	recs := c.ZRange(ctx, k.List[core.KeyWindow], 0, -1).Val()
	if windowSum(t, recs) != 2 || len(recs) != 2 {
		t.Fatalf("window %v after one grant of 2, re-sent and renewed, want one record of 2", recs)
	}
	if v := c.HGet(ctx, k.List[core.KeyMeta], "_rsum").Val(); v != "2" {
		t.Fatalf("_rsum %q, want 2", v)
	}
	// 2 more fit (4 per minute), the third is refused by the rate, with a
	// slot free: rate_ms about a minute, and the rate in force.
	if r, err := run(ctx, t, c, lua.Acquire, k, lim, "id-2", 2, 5000, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
		t.Fatalf("acquire id-2: %v %v", r, err)
	}
	r, err := run(ctx, t, c, lua.Acquire, k, lim, "id-3", 1, 5000, "try", "-", 1000, "test", 0)
	if err != nil || len(r) != 7 || r[0] != int64(0) || r[4].(int64) < 59000 || r[4].(int64) > 60000 || r[5] != int64(4) || r[6] != int64(60000) {
		t.Fatalf("acquire id-3 with the window full: %v %v, want {0, now, hint, -1, ~60000, 4, 60000}", r, err)
	}
	// Above the rate's limit: -3 with both bounds.
	r, err = run(ctx, t, c, lua.Acquire, k, lim, "id-4", 5, 5000, "try", "-", 1000, "test", 0)
	if err != nil || r[0] != int64(-3) || r[2] != int64(5) || r[3] != int64(4) {
		t.Fatalf("acquire of 5 with rate 4: %v %v, want {-3, now, 5, 4}", r, err)
	}
}

// The window is exact at its edge: a grant is refused while the oldest
// record is younger than the period, by a microsecond, and taken once it is
// not; records leave the window (and the sum) only then.
func TestRateWindowEdge(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	lim := "5:1:200" // rate 1 per 200 ms
	r, err := run(ctx, t, c, lua.Acquire, k, lim, "a", 1, 5000, "try", "-", 1000, "test", 0)
	if err != nil || r[0] != int64(1) {
		t.Fatal(r, err)
	}
	token := r[2].(int64)
	for i := 0; ; i++ {
		r, err := run(ctx, t, c, lua.Acquire, k, lim, "b", 1, 5000, "try", "-", 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		now := r[1].(int64) // ms
		if r[0] == int64(1) {
			if gap := r[2].(int64) - token; gap < 200000 {
				t.Fatalf("granted %d µs after the first grant, want >= 200000", gap)
			}
			break
		}
		if now*1000 > token+200000+1000 {
			t.Fatalf("still refused at %d ms, a ms after the window had room (first token %d)", now, token)
		}
		if r[4].(int64) < 0 {
			t.Fatalf("refused without rate_ms: %v", r)
		}
		time.Sleep(time.Millisecond)
	}
}

// A semaphore without a rate has no window key (nor a semaphore made by a
// version without it); the first grant under a rate makes it, with its
// sentinel and a TTL.
func TestRateWindowKeyMadeByFirstGrant(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.Acquire, k, 5, "a", 1, 5000, "try", "-", 1000, "test", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.Release, k, 5, "a", "owner", 1000); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, k.List[core.KeyWindow]).Val(); n != 0 {
		t.Fatal("a window key without a rate")
	}
	if r, err := run(ctx, t, c, lua.Acquire, k, "5:2:1000", "b", 1, 5000, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
		t.Fatal(r, err)
	}
	ttl := c.PTTL(ctx, k.List[core.KeyWindow]).Val()
	if ttl <= 0 {
		t.Fatalf("window key TTL %v, want one", ttl)
	}
	if s, err := c.ZScore(ctx, k.List[core.KeyWindow], core.Sentinel).Result(); err != nil || s < 1e300 {
		t.Fatalf("window sentinel: %v %v", s, err)
	}
}

// A stored rate that is not "limit/per_ms" (an outside write) is refused
// by acquire and status before any write; SetRate overwrites it.
func TestStoredRateValidated(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	for _, v := range []string{"inf", "5", "5/0", "0/5", "-1/100", "1.5/100", "5/1e3", "x"} {
		k := core.KeysFor("redsem", redistest.Name(t)+"-"+v)
		if err := c.Set(ctx, k.List[core.KeyRate], v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := run(ctx, t, c, lua.Acquire, k, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0)
		if err == nil || !strings.Contains(err.Error(), "the stored rate") {
			t.Errorf("stored rate %q: acquire replied %v, %v; want an error about the stored rate", v, r, err)
		}
		if n := c.Exists(ctx, k.List[:core.KeyOverride]...).Val(); n != 0 {
			t.Errorf("stored rate %q: the refused acquire wrote %d keys", v, n)
		}
		if _, err := run(ctx, t, c, lua.SetRate, k, 2, "call-1", 3, 1000); err != nil {
			t.Fatal(err)
		}
		if r, err := run(ctx, t, c, lua.Acquire, k, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
			t.Errorf("stored rate %q, then SetRate 3/1000: %v %v", v, r, err)
		}
	}
}

// The window's key expires with the others, and the SetRate override never.
func TestRateKeysExpire(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.Acquire, k, "2:2:30000", "h", 1, 3000, "try", "-", 1000, "test", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.SetRate, k, 2, "call-1", 3, 1000); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, k.List[core.KeyWindow]).Val(); ttl < 30*time.Second {
		t.Errorf("window TTL %v, want past the 30 s period", ttl)
	}
	if ttl := c.PTTL(ctx, k.List[core.KeyRate]).Val(); ttl != -1 {
		t.Errorf("rate override TTL %v, want none", ttl)
	}
	if v := c.Get(ctx, k.List[core.KeyRate]).Val(); v != "3/1000" {
		t.Errorf("rate override %q, want 3/1000", v)
	}
	// A re-sent SetRate call changes nothing.
	if _, err := run(ctx, t, c, lua.SetRate, k, 2, "call-2", 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.SetRate, k, 2, "call-1", 3, 1000); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, k.List[core.KeyRate]).Val(); v != "0/0" {
		t.Errorf("rate override %q after a re-sent older call, want 0/0", v)
	}
	for _, bad := range [][2]any{{0, 1000}, {3, 0}, {-1, 1000}, {3, "1e3"}, {1 << 21, 1000}} {
		if _, err := run(ctx, t, c, lua.SetRate, k, 2, "call-3", bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), "bad rate") {
			t.Errorf("SetRate %v: %v, want bad rate", bad, err)
		}
	}
}
