package fencing_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

func newRedisGuard(t *testing.T, opts fencing.RedisOptions) *fencing.RedisGuard {
	t.Helper()
	g, err := fencing.NewRedisGuard(redistest.Client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func wantStale(t *testing.T, err error, highest int64) {
	t.Helper()
	var se *fencing.StaleError
	if !errors.Is(err, fencing.ErrStale) || !errors.As(err, &se) {
		t.Fatalf("got %v, want a *StaleError", err)
	}
	if highest > 0 && se.Highest != highest {
		t.Fatalf("StaleError.Highest %d, want %d", se.Highest, highest)
	}
}

func TestRedisGuardCheck(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	// No clock bound: the tokens beyond 2^53 below are from the future
	// (TestForgedTokenRefused checks the bound).
	g := newRedisGuard(t, fencing.RedisOptions{MaxSkew: -1})
	r := redistest.Name(t)
	f := func(slot int, token int64) fencing.Fence { return fencing.Fence{Resource: r, Slot: slot, Token: token} }
	steps := []struct {
		fence fencing.Fence
		stale int64 // 0: accepted; else the recorded token in the StaleError
	}{
		{f(0, 10), 0},
		{f(0, 10), 0}, // equal: the same holder writes again
		{f(0, 9), 10}, // lower: stale
		{f(1, 5), 0},  // another slot is not disturbed by slot 0's 10
		{fencing.Fence{Resource: r + "-other", Slot: 0, Token: 1}, 0},
		{f(0, 11), 0},
		{f(0, 10), 11},
		// Beyond 2^53 (not exact in Lua's doubles): compared exactly.
		{f(2, 1<<60+1), 0},
		{f(2, 1<<60), 1<<60 + 1},
		{f(2, math.MaxInt64), 0},
		{f(2, math.MaxInt64-1), math.MaxInt64},
	}
	for i, s := range steps {
		err := g.Check(ctx, s.fence)
		if s.stale == 0 && err != nil {
			t.Fatalf("step %d %+v: %v", i, s.fence, err)
		}
		if s.stale != 0 {
			wantStale(t, err, s.stale)
		}
	}
	for slot, want := range map[int]int64{0: 11, 1: 5, 2: math.MaxInt64, 3: 0} {
		got, err := g.Highest(ctx, r, slot)
		if err != nil || got != want {
			t.Fatalf("Highest(slot %d) = %d, %v; want %d", slot, got, err, want)
		}
	}
	if ttl := redistest.Client(t).TTL(ctx, g.FenceKey(r)).Val(); ttl != -1 {
		t.Fatalf("fence key TTL %v, want none", ttl)
	}
}

func TestRedisGuardBadInput(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	g := newRedisGuard(t, fencing.RedisOptions{MaxSlots: 4})
	r := redistest.Name(t)
	for _, tc := range []struct {
		fence fencing.Fence
		field string
	}{
		{fencing.Fence{Resource: "", Slot: 0, Token: 1}, "resource"},
		{fencing.Fence{Resource: r, Slot: -1, Token: 1}, "slot"},
		{fencing.Fence{Resource: r, Slot: 4, Token: 1}, "slot"}, // MaxSlots
		{fencing.Fence{Resource: r, Slot: math.MaxInt32 + 1, Token: 1}, "slot"},
		{fencing.Fence{Resource: r, Slot: 0, Token: 0}, "token"},
		{fencing.Fence{Resource: r, Slot: 0, Token: -7}, "token"},
	} {
		for name, err := range map[string]error{
			"Check": g.Check(ctx, tc.fence),
			"Set":   g.Set(ctx, tc.fence, g.DataKey(r, "x"), "v", 0),
		} {
			var ie *fencing.InvalidFenceError
			if !errors.Is(err, fencing.ErrInvalidFence) || !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("%s(%+v) = %v, want an *InvalidFenceError for %s", name, tc.fence, err, tc.field)
			}
		}
	}
	if err := g.Set(ctx, fencing.Fence{Resource: r, Slot: 0, Token: 1}, g.DataKey(r, "x"), "v", -time.Second); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("negative ttl: %v", err)
	}
	if n := c.Exists(ctx, g.FenceKey(r), g.DataKey(r, "x")).Val(); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
	// The scripts validate too, before any write (also max_ahead_us, the
	// clock bound).
	for _, args := range [][]any{{"-1", "5"}, {"01", "5"}, {"0", "0"}, {"0", "abc"}, {"0", "12345678901234567890"}, {"0"},
		{"0", "5"}, {"0", "5", "x"}, {"0", "5", "-2"}, {"0", "5", "01"}, {"0", "5", "12345678901234567"}} {

		err := core.Script(lua.Fence).Run(ctx, c, []string{g.FenceKey(r)}, args...).Err()
		if err == nil || !strings.Contains(err.Error(), "fencing: bad") {
			t.Fatalf("fence.lua %v: %v, want a fencing: bad ... error", args, err)
		}
	}
	err := core.Script(lua.FenceSet).Run(ctx, c, []string{g.FenceKey(r), g.DataKey(r, "x")}, "0", "5", "-1", "v", "-3").Err()
	if err == nil || !strings.Contains(err.Error(), "fencing: bad ttl_ms") {
		t.Fatalf("fence_set.lua bad ttl: %v", err)
	}
	if n := c.Exists(ctx, g.FenceKey(r), g.DataKey(r, "x")).Val(); n != 0 {
		t.Fatalf("bad script arguments wrote %d keys", n)
	}
	// Constructor.
	for _, opts := range []fencing.RedisOptions{{KeyPrefix: "a{b"}, {MaxSlots: -1}} {
		if _, err := fencing.NewRedisGuard(c, opts); !errors.Is(err, fencing.ErrInvalidFence) {
			t.Fatalf("NewRedisGuard(%+v): %v", opts, err)
		}
	}
	if _, err := fencing.NewRedisGuard(nil, fencing.RedisOptions{}); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("NewRedisGuard(nil): %v", err)
	}
}

func TestRedisGuardSet(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	g := newRedisGuard(t, fencing.RedisOptions{KeyPrefix: "fence-test"})
	r := "weird {name}%" + redistest.Name(t)
	key := g.DataKey(r, "balance")
	tag := g.FenceKey(r)[:strings.Index(g.FenceKey(r), "}")+1]
	if !strings.HasPrefix(key, tag) || strings.Count(tag, "{") != 1 {
		t.Fatalf("keys %q and %q do not share one hash tag", g.FenceKey(r), key)
	}
	if err := g.Set(ctx, fencing.Fence{Resource: r, Slot: 1, Token: 100}, key, "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL %v after Set with ttl 1m", ttl)
	}
	err := g.Set(ctx, fencing.Fence{Resource: r, Slot: 1, Token: 99}, key, "zombie", 0)
	wantStale(t, err, 100)
	if v := c.Get(ctx, key).Val(); v != "b" {
		t.Fatalf("value %q after a stale Set, want b", v)
	}
	if err := g.Set(ctx, fencing.Fence{Resource: r, Slot: 1, Token: 100}, key, "b2", 0); err != nil {
		t.Fatal(err)
	}
	if v, ttl := c.Get(ctx, key).Val(), c.PTTL(ctx, key).Val(); v != "b2" || ttl != -1 {
		t.Fatalf("after Set with ttl 0: %q, PTTL %v; want b2 and no TTL", v, ttl)
	}
}

// TestRedisGuardConcurrent: goroutines present random tokens for the same
// resource; each slot ends with the highest token presented recorded, and
// its data key with the value of the highest accepted guarded Set.
func TestRedisGuardConcurrent(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	c := redistest.Client(t)
	g := newRedisGuard(t, fencing.RedisOptions{})
	r := redistest.Name(t)
	const workers, per, slots = 16, 60, 3
	var (
		mu      sync.Mutex
		highest [slots]int64 // highest token presented
		setMax  [slots]int64 // highest token of an accepted Set
		wg      sync.WaitGroup
	)
	errs := make(chan error, workers*per)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				f := fencing.Fence{Resource: r, Slot: rand.IntN(slots), Token: rand.Int64N(1<<40) + 1}
				mu.Lock()
				highest[f.Slot] = max(highest[f.Slot], f.Token)
				mu.Unlock()
				var err error
				if i%2 == 0 {
					err = g.Check(ctx, f)
				} else {
					err = g.Set(ctx, f, g.DataKey(r, strconv.Itoa(f.Slot)), strconv.FormatInt(f.Token, 10), 0)
					if err == nil {
						mu.Lock()
						setMax[f.Slot] = max(setMax[f.Slot], f.Token)
						mu.Unlock()
					}
				}
				var se *fencing.StaleError
				if errors.As(err, &se) {
					if se.Highest <= f.Token {
						errs <- errors.New("stale with a recorded token not above it: " + err.Error())
					}
				} else if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for slot := 0; slot < slots; slot++ {
		got, err := g.Highest(ctx, r, slot)
		if err != nil || got != highest[slot] {
			t.Fatalf("slot %d: recorded %d, %v; highest presented %d", slot, got, err, highest[slot])
		}
		// Once the highest accepted Set wrote, only Sets with a token at
		// least as high could be accepted: the data key holds its value.
		v, err := c.Get(ctx, g.DataKey(r, strconv.Itoa(slot))).Int64()
		if setMax[slot] == 0 && errors.Is(err, redis.Nil) {
			continue // every Set of this slot met a higher Check: none wrote
		}
		if err != nil || v != setMax[slot] {
			t.Fatalf("slot %d: data %d, %v; highest accepted Set %d", slot, v, err, setMax[slot])
		}
	}
}
