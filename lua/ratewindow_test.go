package lua_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// The rate window's state across an idle stretch, and its wake time for
// weighted requests, checked against what the test computes on its own
// from the grants' tokens (the window's records: server µs) and the period.

// rwRec is one grant as the test saw it: its token (the score of its window
// record) and its weight.
type rwRec struct {
	token int64
	n     int
}

// rwServerUs is the server's clock in µs.
func rwServerUs(ctx context.Context, t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// rwWaitServerUs waits (bounded) until the server's clock reaches us.
func rwWaitServerUs(ctx context.Context, t *testing.T, c *redis.Client, us int64) {
	t.Helper()
	redistest.WaitFor(t, 10*time.Second, "the server clock to reach "+strconv.FormatInt(us, 10)+" µs", func() (bool, error) {
		now, err := c.Time(ctx).Result()
		return err == nil && now.UnixMicro() >= us, err
	})
}

// rwCeilDiv is a / b rounded up, for any sign of a (b > 0).
func rwCeilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// rwWake is when the window has room for n more slots, by the records alive
// at server µs now (those with a token above now - per): the token of the
// record whose leaving makes room, plus per. ok is false when n fits now.
func rwWake(recs []rwRec, limit, n int, perUs, now int64) (wake int64, ok bool) {
	var live []rwRec
	sum := 0
	for _, r := range recs {
		if r.token > now-perUs {
			live = append(live, r)
			sum += r.n
		}
	}
	if sum+n <= limit {
		return 0, false
	}
	need, acc := sum+n-limit, 0
	for _, r := range live {
		acc += r.n
		if acc >= need {
			return r.token + perUs, true
		}
	}
	return 0, false // n above the limit: not a rate refusal
}

// rwRateMs is the rate_ms values a refusal replied at server ms nowMs may
// carry: the script's clock is nowMs and some µs of that ms, and rate_ms is
// (wake - clock) rounded up to whole ms, never below 0. The records must
// be the same for every µs of the ms (the caller checks).
func rwRateMs(wake, nowMs int64) (lo, hi int64) {
	lo = max(rwCeilDiv(wake-(nowMs*1000+999), 1000), 0)
	hi = max(rwCeilDiv(wake-nowMs*1000, 1000), 0)
	return lo, hi
}

// rwCheckRecords checks that the window's records are exactly recs
// ("token:n" scored token), with the sentinel last.
func rwCheckRecords(ctx context.Context, t *testing.T, c *redis.Client, k core.Keys, recs []rwRec) {
	t.Helper()
	got, err := c.ZRangeWithScores(ctx, k.List[core.KeyWindow], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range recs {
		want = append(want, fmt.Sprintf("%d:%d@%d", r.token, r.n, r.token))
	}
	want = append(want, core.Sentinel+"@+Inf")
	var have []string
	for _, z := range got {
		have = append(have, fmt.Sprintf("%v@%v", z.Member, strconv.FormatFloat(z.Score, 'f', -1, 64)))
	}
	if strings.Join(have, " ") != strings.Join(want, " ") {
		t.Fatalf("window records %v, want %v", have, want)
	}
}

// rwExpectRefused runs a try-mode acquire of n that the window must refuse
// (slots are free, nobody queues) and checks rate_ms, the hint and the rate
// in the reply against the records. hintIsRate: the hint must be rate_ms
// (no holder may expire sooner).
func rwExpectRefused(ctx context.Context, t *testing.T, c *redis.Client, k core.Keys, lim string, recs []rwRec,
	limit, n int, perMs int64, id string, hintIsRate bool) {
	t.Helper()
	r, err := run(ctx, t, c, lua.Acquire, k, lim, id, n, 5000, "try", "-", 1000, "test", 0)
	if err != nil {
		t.Fatalf("acquire of %d: %v", n, err)
	}
	nowMs := r[1].(int64)
	perUs := perMs * 1000
	// Every µs of the script's ms must see the same records (the test
	// keeps far from their edges; it says so when the machine was too
	// slow for that).
	for _, x := range recs {
		if edge := x.token + perUs; edge > nowMs*1000 && edge <= nowMs*1000+999 {
			t.Fatalf("acquire of %d ran in the ms in which record %d leaves the window (%d µs): too late to check", n, x.token, edge)
		}
	}
	wake, ok := rwWake(recs, limit, n, perUs, nowMs*1000)
	if !ok {
		t.Fatalf("test bug: the records %v have room for %d at %d ms", recs, n, nowMs)
	}
	if r[0] != int64(0) {
		t.Fatalf("acquire of %d at server ms %d: %v, want refused by the rate: the window holds %v (limit %d per %d ms)", n, nowMs, r, recs, limit, perMs)
	}
	if len(r) != 7 || r[5] != int64(limit) || r[6] != perMs {
		t.Fatalf("acquire of %d refused: %v, want {0, now, hint, -1, rate_ms, %d, %d}", n, r, limit, perMs)
	}
	lo, hi := rwRateMs(wake, nowMs)
	if got := r[4].(int64); got < lo || got > hi {
		t.Fatalf("acquire of %d at server ms %d: rate_ms %d, want %d..%d: the window %v has room for it at %d µs (record %d + %d ms)",
			n, nowMs, got, lo, hi, recs, wake, wake-perUs, perMs)
	}
	if hintIsRate && r[2] != r[4] {
		t.Fatalf("acquire of %d: hint %v, rate_ms %v: want the hint to be the rate's (no holder expires sooner)", n, r[2], r[4])
	}
}

// rwGrant runs a try-mode acquire that must be granted and returns its
// record.
func rwGrant(ctx context.Context, t *testing.T, c *redis.Client, k core.Keys, lim any, id string, n, leaseMs int) rwRec {
	t.Helper()
	r, err := run(ctx, t, c, lua.Acquire, k, lim, id, n, leaseMs, "try", "-", 1000, "test", 0)
	if err != nil || r[0] != int64(1) {
		t.Fatalf("acquire %s of %d: %v %v, want granted", id, n, r, err)
	}
	return rwRec{token: r[2].(int64), n: n}
}

// A rate whose period outlives every lease keeps its window across an idle
// stretch in which every lease expired and a semaphore without a rate (the
// twin, given the same calls) let all its keys go: the window's records,
// and only they, still refuse a grant beyond the rate, and rate_ms is when
// the record whose leaving makes room leaves (weighted records, each
// request size). The window key lives until its youngest record leaves.
func TestRateWindowOutlivesLeases(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	k := core.KeysFor("redsem", name)
	twin := core.KeysFor("redsem", name+"-twin")
	// 5 slots, 5 grants per 4 s, 150 ms leases. The period must outlive
	// the keys of a semaphore without a rate by the time the test takes:
	// about 2 s after its first call.
	const limit, leaseMs, perMs = 5, 150, 4000
	lim := fmt.Sprintf("%d:%d:%d", limit, limit, perMs)
	var recs []rwRec
	for i, n := range []int{2, 1, 2} {
		if i > 0 {
			// Records 10 ms apart by the server's clock: a wake time one
			// record late is 10 ms late.
			rwWaitServerUs(ctx, t, c, recs[i-1].token+10_000)
		}
		id := "g" + strconv.Itoa(i)
		recs = append(recs, rwGrant(ctx, t, c, k, lim, id, n, leaseMs))
		rwGrant(ctx, t, c, twin, limit, id, n, leaseMs)
	}
	rwCheckRecords(ctx, t, c, k, recs)
	// The window key (and every key: the records are read with the
	// others) lives at least until its youngest record leaves.
	youngest := recs[len(recs)-1].token
	now := rwServerUs(ctx, t, c)
	for _, key := range []string{k.List[core.KeyWindow], k.List[core.KeyMeta], k.List[core.KeyHolders]} {
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if need := time.Duration(youngest+perMs*1000-now) * time.Microsecond; ttl < need {
			t.Errorf("%s: TTL %v, want at least %v: until the window's youngest record (%d µs) leaves it", key, ttl, need, youngest)
		}
	}

	// The idle stretch: until the twin's keys are gone (every lease has
	// long expired).
	redistest.WaitFor(t, 10*time.Second, "the twin's keys to expire", func() (bool, error) {
		n, err := c.Exists(ctx, twin.List...).Result()
		return n == 0, err
	})
	if now := rwServerUs(ctx, t, c); now >= recs[0].token+perMs*1000-500_000 {
		t.Fatalf("the idle stretch ended %d ms after the first grant: too close to the %d ms period to check the window (machine too slow)",
			(now-recs[0].token)/1000, perMs)
	}
	// Every request size the rate allows is refused, each waking when the
	// record that makes room for it leaves: 1 and 2 with the first record
	// (2 slots), 3 with the second, 4 and 5 with the third.
	for n := 1; n <= limit; n++ {
		rwExpectRefused(ctx, t, c, k, lim, recs, limit, n, perMs, "after-idle-"+strconv.Itoa(n), true)
	}
	rwCheckRecords(ctx, t, c, k, recs)
	st, err := run(ctx, t, c, lua.Status, k, lim)
	if err != nil {
		t.Fatal(err)
	}
	if tail := st[len(st)-3:]; tail[0] != int64(limit) || tail[1] != int64(perMs) || tail[2] != int64(5) {
		t.Fatalf("status after the idle stretch: rate %v/%v, %v granted in the window; want %d/%d, 5", tail[0], tail[1], tail[2], limit, perMs)
	}
	if h := st[2]; h != int64(0) {
		t.Fatalf("status after the idle stretch: %v holders, want none (every lease expired)", h)
	}
}

// The wake time of a weighted request that the window refuses is exact:
// the time of the record whose leaving makes room for it (the first whose
// slots, with those of the records before it, cover what the request
// lacks), plus the period; for every request size, before and after the
// oldest record left the window (and was trimmed from it). The hint is the
// same time (no holder expires sooner).
func TestRateWakeTimeWeighted(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	// 6 grants per 2 s; 20 slots, so that slots never refuse; leases
	// outlive the test.
	const rl, perMs, leaseMs = 6, 2000, 10000
	lim := fmt.Sprintf("%d:%d:%d", 20, rl, perMs)
	var recs []rwRec
	// grant takes n slots at least gapMs after the last grant by the
	// server's clock: records that far apart make a wake time one record
	// late that much late.
	grant := func(id string, n int, gapMs int64) {
		t.Helper()
		if len(recs) > 0 {
			rwWaitServerUs(ctx, t, c, recs[len(recs)-1].token+gapMs*1000)
		}
		recs = append(recs, rwGrant(ctx, t, c, k, lim, id, n, leaseMs))
	}
	// The second record comes 200 ms after the first: the checks after
	// the first leaves have that long before the second does.
	for i, x := range [][2]int{{1, 0}, {3, 200}, {1, 10}, {1, 10}} {
		grant("g"+strconv.Itoa(i), x[0], int64(x[1]))
	}
	rwCheckRecords(ctx, t, c, k, recs)
	// Full: n lacks n slots: 1 wakes with the first record, 2 to 4 with
	// the second (3 slots), 5 with the third, 6 with the fourth.
	for n := 1; n <= rl; n++ {
		rwExpectRefused(ctx, t, c, k, lim, recs, rl, n, perMs, "full-"+strconv.Itoa(n), true)
	}
	if r, err := run(ctx, t, c, lua.Acquire, k, lim, "too-many", rl+1, leaseMs, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(-3) {
		t.Fatalf("acquire of %d with a rate of %d: %v %v, want -3", rl+1, rl, r, err)
	}

	// The first record leaves: one slot is granted (the record is trimmed
	// then), and the window is full again with records of 3, 1, 1, 1.
	rwWaitServerUs(ctx, t, c, recs[0].token+perMs*1000+1000)
	grant("after-edge", 1, 10)
	recs = recs[1:]
	rwCheckRecords(ctx, t, c, k, recs)
	if v := c.HGet(ctx, k.List[core.KeyMeta], "_rsum").Val(); v != strconv.Itoa(rl) {
		t.Fatalf("_rsum %q after the trim and a grant of 1, want %d", v, rl)
	}
	// 1 to 3 wake with the record of 3, 4 with the next, 5 with the one
	// after, 6 with the newest.
	for n := 1; n <= rl; n++ {
		rwExpectRefused(ctx, t, c, k, lim, recs, rl, n, perMs, "again-"+strconv.Itoa(n), true)
	}
}

// A period that grows keeps the window's records for as long as they count
// against it: SetRate to a longer period, and an idle semaphore that takes
// a client's longer rate, extend every key until the youngest record
// leaves the new window, so that grants made before still refuse others
// once the leases that kept the keys alive have ended (setrate.lua: "grants
// made before the call count against the new rate"). Before: 2 grants
// under 2/1s, then SetRate 2/1h: rate_ms said an hour, but the keys (and
// the records with them) expired about 2 s later, and new grants came in.
func TestLongerPeriodKeepsWindow(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	c := redistest.Client(t)
	const hourMs = 3_600_000
	checkTTL := func(t *testing.T, k core.Keys, youngest int64) {
		t.Helper()
		now := rwServerUs(ctx, t, c)
		need := time.Duration(youngest+hourMs*1000-now) * time.Microsecond
		for _, key := range []string{k.List[core.KeyWindow], k.List[core.KeyMeta]} {
			ttl, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl < need {
				t.Fatalf("%s: TTL %v, want at least %v: until the youngest record leaves a window of an hour", key, ttl, need)
			}
		}
	}
	t.Run("SetRate", func(t *testing.T) {
		name := redistest.Name(t)
		k := core.KeysFor("redsem", name)
		twin := core.KeysFor("redsem", name+"-twin")
		lim := "5:2:1000"
		a := rwGrant(ctx, t, c, k, lim, "g0", 1, 150)
		b := rwGrant(ctx, t, c, k, lim, "g1", 1, 150)
		rwGrant(ctx, t, c, twin, 5, "g0", 1, 150)
		if _, err := run(ctx, t, c, lua.SetRate, k, lim, "call-1", 2, hourMs); err != nil {
			t.Fatal(err)
		}
		checkTTL(t, k, b.token)
		// Idle until a semaphore without a rate lost its keys: the window
		// still refuses, for about an hour.
		redistest.WaitFor(t, 10*time.Second, "the twin's keys to expire", func() (bool, error) {
			n, err := c.Exists(ctx, twin.List...).Result()
			return n == 0, err
		})
		rwExpectRefused(ctx, t, c, k, lim, []rwRec{a, b}, 2, 1, hourMs, "after-idle", false)
	})
	t.Run("IdleTakesClientRate", func(t *testing.T) {
		k := core.KeysFor("redsem", redistest.Name(t))
		a := rwGrant(ctx, t, c, k, "5:2:1000", "g0", 1, 100)
		b := rwGrant(ctx, t, c, k, "5:2:1000", "g1", 1, 100)
		// Both leases end; a client with 2 per hour finds the semaphore
		// idle and establishes its rate: the two grants count against it.
		rwWaitServerUs(ctx, t, c, b.token+150_000)
		rwExpectRefused(ctx, t, c, k, "5:2:3600000", []rwRec{a, b}, 2, 1, hourMs, "longer", false)
		checkTTL(t, k, b.token)
	})
}

// A drifted window sum (_rsum above what the records hold) is corrected,
// and the wake time of a refusal is still the window's: the record whose
// leaving makes room, plus the period. Before: the call that corrected it
// answered rate_ms 0 (RATE_AT = now), and its caller tried again at once.
func TestDriftedRateSumWakeTime(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	const rl, perMs = 3, 10000
	lim := fmt.Sprintf("%d:%d:%d", 10, rl, perMs)
	var recs []rwRec
	for i := 0; i < rl; i++ {
		if i > 0 {
			rwWaitServerUs(ctx, t, c, recs[i-1].token+5_000)
		}
		recs = append(recs, rwGrant(ctx, t, c, k, lim, "g"+strconv.Itoa(i), 1, 10000))
	}
	if err := c.HSet(ctx, k.List[core.KeyMeta], "_rsum", 10).Err(); err != nil {
		t.Fatal(err)
	}
	rwExpectRefused(ctx, t, c, k, lim, recs, rl, 1, perMs, "drifted", false)
	if v := c.HGet(ctx, k.List[core.KeyMeta], "_rsum").Val(); v != strconv.Itoa(rl) {
		t.Fatalf("_rsum %q after the correction, want %d (what the records hold)", v, rl)
	}
}
