package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// wfence is a weighted fence over slots (ascending).
func wfence(resource string, token int64, slots ...int) fencing.Fence {
	f := fencing.Fence{Resource: resource, Slot: slots[0], Token: token}
	if len(slots) > 1 {
		f.Slots = slots
	}
	return f
}

func TestFenceValidateSlots(t *testing.T) {
	for _, tc := range []struct {
		fence fencing.Fence
		field string // "" valid
	}{
		{wfence("r", 1, 0, 3, 4), ""},
		{fencing.Fence{Resource: "r", Slot: 5, Slots: []int{5}, Token: 1}, ""}, // one element: the same as Slot
		{fencing.Fence{Resource: "r", Slot: 5, Token: 1}, ""},
		{fencing.Fence{Resource: "r", Slot: 0, Slots: []int{}, Token: 1}, "slots"},
		{fencing.Fence{Resource: "r", Slot: -1, Slots: []int{-1, 2}, Token: 1}, "slots"},
		{fencing.Fence{Resource: "r", Slot: 0, Slots: []int{0, math.MaxInt32 + 1}, Token: 1}, "slots"},
		{fencing.Fence{Resource: "r", Slot: 3, Slots: []int{3, 1}, Token: 1}, "slots"},
		{fencing.Fence{Resource: "r", Slot: 1, Slots: []int{1, 1}, Token: 1}, "slots"},
		{fencing.Fence{Resource: "r", Slot: 0, Slots: []int{1, 2}, Token: 1}, "slot"}, // Slot is not Slots[0]
		{fencing.Fence{Resource: "r", Slot: 1, Slots: []int{1, 2}, Token: 0}, "token"},
		{fencing.Fence{Resource: "", Slot: 1, Slots: []int{1, 2}, Token: 1}, "resource"},
	} {
		err := tc.fence.Validate()
		if tc.field == "" {
			if err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", tc.fence, err)
			}
			continue
		}
		var ie *fencing.InvalidFenceError
		if !errors.As(err, &ie) || !errors.Is(err, fencing.ErrInvalidFence) || ie.Field != tc.field {
			t.Fatalf("Validate(%+v) = %v, want an *InvalidFenceError for %s", tc.fence, err, tc.field)
		}
	}
	if got := wfence("r", 1, 0, 3, 4).AllSlots(); !slices.Equal(got, []int{0, 3, 4}) {
		t.Fatalf("AllSlots %v", got)
	}
	if got := (fencing.Fence{Resource: "r", Slot: 7, Token: 1}).AllSlots(); !slices.Equal(got, []int{7}) {
		t.Fatalf("AllSlots %v", got)
	}
}

// TestOfWeighted: Of carries every slot of a weighted lease, and stays the
// plain single-slot fence (Slots nil) for a lease of one slot.
func TestOfWeighted(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	sem, err := unfair.New(redistest.Client(t), redistest.Name(t), 4, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	w, err := sem.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release(ctx)
	one, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Release(ctx)
	f := fencing.Of("r", w)
	if f.Resource != "r" || f.Token != w.Token() || f.Slot != w.Slot() || !slices.Equal(f.Slots, w.Slots()) || len(f.Slots) != 3 {
		t.Fatalf("Of(weighted lease %v, token %d) = %+v", w.Slots(), w.Token(), f)
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	f.Slots[0] = 99 // the fence owns its slice: the lease is not changed
	if w.Slots()[0] == 99 {
		t.Fatal("Of shares the lease's slots")
	}
	if g := fencing.Of("r", one); g.Slots != nil || g.Slot != one.Slot() || g.Token != one.Token() {
		t.Fatalf("Of(single lease) = %+v, want Slots nil", g)
	}
}

// store is a guard under test with a way to read its records.
type store struct {
	check   func(ctx context.Context, f fencing.Fence) error
	highest func(ctx context.Context, resource string, slot int) int64
}

func redisGuardStore(t *testing.T) store { return redisGuardStoreSkew(t, 0) }

// redisGuardStoreSkew is redisGuardStore with RedisOptions.MaxSkew skew.
func redisGuardStoreSkew(t *testing.T, skew time.Duration) store {
	g := newRedisGuard(t, fencing.RedisOptions{MaxSkew: skew})
	return store{check: g.Check, highest: func(ctx context.Context, r string, slot int) int64 {
		n, err := g.Highest(ctx, r, slot)
		if err != nil {
			t.Error(err)
		}
		return n
	}}
}

func sqlGuardStore(t *testing.T) store { return sqlGuardStoreSkew(t, 0) }

// sqlGuardStoreSkew is sqlGuardStore with SQLOptions.MaxSkew skew; two
// stores of one test share the table.
func sqlGuardStoreSkew(t *testing.T, skew time.Duration) store {
	db := pgDB(t)
	g := newSQLGuardOpts(t, db, fencing.SQLOptions{MaxSkew: skew})
	return store{check: g.On(db).Check, highest: func(_ context.Context, r string, slot int) int64 {
		return recorded(t, db, g, r, slot)
	}}
}

var guardStores = []struct {
	name   string
	mk     func(*testing.T) store
	mkSkew func(*testing.T, time.Duration) store // the same records, another MaxSkew
}{{"redis", redisGuardStore, redisGuardStoreSkew}, {"sql", sqlGuardStore, sqlGuardStoreSkew}}

// TestGuardWeighted: a weighted fence is accepted only when its token is at
// least the highest of every slot, is then recorded for every slot, and a
// stale one records nothing for any slot.
func TestGuardWeighted(t *testing.T) {
	for _, gs := range guardStores {
		t.Run(gs.name, func(t *testing.T) {
			ctx := redistest.Ctx(t, 10*time.Second)
			s := gs.mk(t)
			r := redistest.Name(t)
			want := func(slots map[int]int64) {
				t.Helper()
				for slot, tok := range slots {
					if got := s.highest(ctx, r, slot); got != tok {
						t.Fatalf("slot %d: recorded %d, want %d", slot, got, tok)
					}
				}
			}
			ok := func(f fencing.Fence) {
				t.Helper()
				if err := s.check(ctx, f); err != nil {
					t.Fatalf("%+v: %v", f, err)
				}
			}
			stale := func(f fencing.Fence, slot int, highest int64) {
				t.Helper()
				err := s.check(ctx, f)
				var se *fencing.StaleError
				if !errors.Is(err, fencing.ErrStale) || !errors.As(err, &se) {
					t.Fatalf("%+v: %v, want a *StaleError", f, err)
				}
				if gs.name == "redis" && (se.Slot != slot || se.Highest != highest) {
					t.Fatalf("%+v: StaleError slot %d highest %d, want slot %d highest %d", f, se.Slot, se.Highest, slot, highest)
				}
				if gs.name == "sql" && se.Slot != -1 {
					t.Fatalf("%+v: StaleError slot %d, want -1", f, se.Slot)
				}
			}
			ok(wfence(r, 10, 0, 3, 4))
			want(map[int]int64{0: 10, 1: 0, 3: 10, 4: 10})
			ok(wfence(r, 10, 0, 3, 4)) // equal: the same holder writes again
			// Slot 3 goes to a single-slot lease with a higher token.
			ok(wfence(r, 12, 3))
			// The zombie of slots 0, 3, 4 is rejected because of slot 3
			// alone, and records nothing, also not on slots 1 and 2 that
			// it never had and that are still free in the store.
			stale(wfence(r, 11, 0, 1, 2, 3, 4), 3, 12)
			want(map[int]int64{0: 10, 1: 0, 2: 0, 3: 12, 4: 10})
			// The stale slot may be the last: nothing recorded before it.
			ok(wfence(r, 20, 9))
			stale(wfence(r, 15, 5, 6, 7, 9), 9, 20)
			want(map[int]int64{5: 0, 6: 0, 7: 0, 9: 20})
			// A newer weighted lease over all of them is accepted.
			ok(wfence(r, 30, 0, 1, 3, 4, 9))
			want(map[int]int64{0: 30, 1: 30, 2: 0, 3: 30, 4: 30, 9: 30})
			// Tokens beyond 2^53 compare exactly. They are from the future:
			// the same records through a guard without the clock bound.
			s = gs.mkSkew(t, -1)
			ok(wfence(r, 1<<60+1, 10, 11))
			stale(wfence(r, 1<<60, 11, 12), 11, 1<<60+1)
			ok(wfence(r, math.MaxInt64, 11, 12))
			want(map[int]int64{10: 1<<60 + 1, 11: math.MaxInt64, 12: math.MaxInt64})
			// Many slots (more than one script chunk of 1000).
			big := make([]int, 2500)
			for i := range big {
				big[i] = 100 + i
			}
			ok(wfence(r, 40, big...))
			ok(wfence(r, 41, big[len(big)-1]))
			stale(wfence(r, 40, big...), big[len(big)-1], 41)
			want(map[int]int64{100: 40, 1500: 40, big[len(big)-1]: 41})
		})
	}
}

// TestRedisGuardWeightedSet: a stale weighted Set writes neither the
// records nor the data key.
func TestRedisGuardWeightedSet(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	g := newRedisGuard(t, fencing.RedisOptions{MaxSlots: 8})
	r := redistest.Name(t)
	key := g.DataKey(r, "v")
	if err := g.Set(ctx, wfence(r, 5, 1, 2, 7), key, "A", 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(ctx, wfence(r, 6, 2), key, "B", 0); err != nil {
		t.Fatal(err)
	}
	err := g.Set(ctx, wfence(r, 5, 0, 1, 2, 7), key, "A late", 0)
	wantStale(t, err, 6)
	if v := c.Get(ctx, key).Val(); v != "B" {
		t.Fatalf("data %q after a stale weighted Set, want B", v)
	}
	if h, _ := g.Highest(ctx, r, 0); h != 0 {
		t.Fatalf("slot 0 recorded %d by a stale Set", h)
	}
	if !strings.Contains(err.Error(), `slot 2 (of slots 0,1,2,7): token 6 was already recorded`) {
		t.Fatalf("message %q", err)
	}
	// MaxSlots bounds every slot, not only the first.
	if err := g.Check(ctx, wfence(r, 9, 1, 8)); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("slot 8 with MaxSlots 8: %v", err)
	}
	// The script validates the list itself, before any write.
	for _, list := range []string{"0,0", "3,1", "1,", ",1", "0, 1", "2147483648", "1,,2", ""} {
		err := core.Script(lua.Fence).Run(ctx, c, []string{g.FenceKey(r + "-args")}, list, "5").Err()
		if err == nil || !strings.Contains(err.Error(), "fencing: bad slot") {
			t.Fatalf("fence.lua slots %q: %v, want a fencing: bad slot... error", list, err)
		}
	}
	if n := c.Exists(ctx, g.FenceKey(r+"-args")).Val(); n != 0 {
		t.Fatal("bad slot lists wrote the fence key")
	}
}

// TestGuardWeightedConcurrent: goroutines check fences over random subsets
// of shared slots with unique random tokens; each fence also names a slot
// of its own that no other fence uses. A partial record would show as a
// rejected fence whose own slot holds its token, or an accepted one whose
// own slot does not. The shared slots end with the highest accepted token
// that covers them.
func TestGuardWeightedConcurrent(t *testing.T) {
	for _, gs := range guardStores {
		t.Run(gs.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 60*time.Second)
			s := gs.mk(t)
			r := redistest.Name(t)
			const workers, per = 12, 40
			shared := []int{0, 1, 2, 3, 5000, 5001, 5002, 5003}
			type result struct {
				f        fencing.Fence
				own      int
				accepted bool
			}
			var (
				mu      sync.Mutex
				results []result
				used    = map[int64]bool{}
				aborted int // stale found by the SQL guard's abort path (a race)
				wg      sync.WaitGroup
			)
			// Tokens rise roughly with time, as a semaphore issues them, but
			// overlap, so that concurrent checks pass each other's snapshot
			// (the race the SQL statement must abort) as well as fail early.
			var clock int64 = 1000
			token := func() int64 {
				mu.Lock()
				defer mu.Unlock()
				clock += 10
				for {
					tok := clock - rand.Int64N(200)
					if !used[tok] {
						used[tok] = true
						return tok
					}
				}
			}
			errs := make(chan error, workers*per)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						own := 1000 + w*per + i // between the two halves of shared
						slots := []int{own}
						for _, sl := range shared {
							if rand.IntN(3) == 0 {
								slots = append(slots, sl)
							}
						}
						slices.Sort(slots)
						f := wfence(r, token(), slots...)
						err := s.check(ctx, f)
						var se *fencing.StaleError
						switch {
						case err == nil:
						case errors.As(err, &se):
							if se.Err != nil {
								mu.Lock()
								aborted++
								mu.Unlock()
							}
							if se.Slot >= 0 && (!slices.Contains(slots, se.Slot) || se.Highest <= f.Token) {
								errs <- fmt.Errorf("%+v: implausible %v", f, err)
							}
						default:
							errs <- err
						}
						mu.Lock()
						results = append(results, result{f, own, err == nil})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			best := map[int]int64{}
			accepted := 0
			for _, res := range results {
				got := s.highest(ctx, r, res.own)
				if res.accepted && got != res.f.Token || !res.accepted && got != 0 {
					t.Fatalf("fence %v token %d accepted %v: its own slot %d records %d", res.f.AllSlots(), res.f.Token, res.accepted, res.own, got)
				}
				if res.accepted {
					accepted++
					for _, sl := range res.f.AllSlots() {
						best[sl] = max(best[sl], res.f.Token)
					}
				}
			}
			for _, sl := range shared {
				if got := s.highest(ctx, r, sl); got != best[sl] {
					t.Fatalf("shared slot %d: recorded %d, highest accepted %d", sl, got, best[sl])
				}
			}
			t.Logf("%d of %d weighted checks accepted; %d rejected by an aborted statement", accepted, len(results), aborted)
			if accepted == 0 || accepted == len(results) {
				t.Fatalf("%d of %d accepted: the test did not contend", accepted, len(results))
			}
		})
	}
}

// TestSQLGuardWeightedRace: a weighted check that passed its snapshot's
// NOT EXISTS and then meets a higher token that a concurrent transaction
// commits on one of its slots (a new row or an updated one) records nothing
// for any slot; one that meets a lower token goes on and records them all.
func TestSQLGuardWeightedRace(t *testing.T) {
	db := pgDB(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	g := newSQLGuard(t, db)
	blocked := func() bool {
		var n int
		_ = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "+g.Table()+" AS cur %'").Scan(&n)
		return n > 0
	}
	for _, tc := range []struct {
		name     string
		before   int64 // token recorded on slot 2 beforehand; 0: no row
		other    int64 // token the concurrent transaction records on slot 2
		accepted bool  // the weighted check (token 10, slots 0, 2, 4)
	}{
		{"new row higher", 0, 20, false},
		{"updated row higher", 5, 20, false},
		{"new row lower", 0, 7, true},
		{"updated row lower", 5, 7, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Name(t)
			if tc.before > 0 {
				if err := g.Check(ctx, db, wfence(r, tc.before, 2)); err != nil {
					t.Fatal(err)
				}
			}
			other, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = other.Rollback() }()
			if err := g.Check(ctx, other, wfence(r, tc.other, 2)); err != nil {
				t.Fatal(err)
			}
			// The weighted check runs in its own transaction, to see that
			// the caller can tell from the error that it is aborted.
			done := make(chan error, 1)
			go func() {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					done <- err
					return
				}
				if err := g.Check(ctx, tx, wfence(r, 10, 0, 2, 4)); err != nil {
					_ = tx.Rollback()
					done <- err
					return
				}
				done <- tx.Commit()
			}()
			waitFor(t, 10*time.Second, blocked) // it wrote slot 0 and waits for slot 2
			if err := other.Commit(); err != nil {
				t.Fatal(err)
			}
			err = <-done
			want := map[int]int64{0: 0, 2: tc.other, 4: 0}
			if tc.accepted {
				if err != nil {
					t.Fatal(err)
				}
				want = map[int]int64{0: 10, 2: 10, 4: 10}
			} else {
				var se *fencing.StaleError
				if !errors.As(err, &se) || se.Err == nil {
					t.Fatalf("%v, want a *StaleError from the aborted statement", err)
				}
			}
			for slot, tok := range want {
				if got := recorded(t, db, g, r, slot); got != tok {
					t.Fatalf("slot %d: recorded %d, want %d", slot, got, tok)
				}
			}
		})
	}
}

func TestHeadersWeighted(t *testing.T) {
	h := http.Header{}
	h.Set(fencing.HeaderSlot, "9") // a stale one-slot header is replaced
	f := wfence("a/b c", 42, 0, 3, 4)
	if err := fencing.SetHeaders(h, f); err != nil {
		t.Fatal(err)
	}
	if got := h.Get(fencing.HeaderSlots); got != "0,3,4" || h.Values(fencing.HeaderSlot) != nil {
		t.Fatalf("headers %v: want %s 0,3,4 and no %s", h, fencing.HeaderSlots, fencing.HeaderSlot)
	}
	back, err := fencing.ParseHeaders(h)
	if err != nil || back.Resource != f.Resource || back.Slot != 0 || !slices.Equal(back.Slots, f.Slots) || back.Token != 42 {
		t.Fatalf("ParseHeaders = %+v, %v; want %+v", back, err, f)
	}
	// A one-slot fence is sent as before, and replaces a Slots header.
	if err := fencing.SetHeaders(h, wfence("r", 42, 7)); err != nil {
		t.Fatal(err)
	}
	if h.Get(fencing.HeaderSlot) != "7" || h.Values(fencing.HeaderSlots) != nil {
		t.Fatalf("headers %v after a one-slot fence", h)
	}
	base := func(slot, slots string) http.Header {
		h := http.Header{}
		h.Set(fencing.HeaderResource, "r")
		h.Set(fencing.HeaderToken, "5")
		if slot != "" {
			h.Set(fencing.HeaderSlot, slot)
		}
		if slots != "" {
			h.Set(fencing.HeaderSlots, slots)
		}
		return h
	}
	for _, tc := range []struct {
		slot, slots string
		want        []int // nil: invalid
	}{
		{"", "1, 5 ,9", []int{1, 5, 9}},
		{"1", "1,5", []int{1, 5}}, // both, consistent
		{"", "6", []int{6}},       // one element: a plain fence
		{"2", "", []int{2}},
		{"0", "1,5", nil}, // both, inconsistent
		{"", "5,1", nil},
		{"", "1,1", nil},
		{"", "1,,2", nil},
		{"", "-1,2", nil},
		{"", "1,2147483648", nil},
		{"", "a", nil},
		{"", " ", nil},
	} {
		f, err := fencing.ParseHeaders(base(tc.slot, tc.slots))
		if tc.want == nil {
			if !errors.Is(err, fencing.ErrInvalidFence) {
				t.Fatalf("slot %q slots %q: %+v, %v; want ErrInvalidFence", tc.slot, tc.slots, f, err)
			}
			continue
		}
		if err != nil || !slices.Equal(f.AllSlots(), tc.want) || (len(tc.want) == 1) != (f.Slots == nil) {
			t.Fatalf("slot %q slots %q: %+v, %v; want slots %v", tc.slot, tc.slots, f, err, tc.want)
		}
	}
	h = base("", "1,2")
	h.Add(fencing.HeaderSlots, "3")
	if _, err := fencing.ParseHeaders(h); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("repeated %s: %v", fencing.HeaderSlots, err)
	}
}

// TestHTTPWeighted: Transport sends every slot and Middleware checks them
// all: a weighted zombie gets 409 as soon as one of its slots has a newer
// holder, and nothing is recorded for its other slots.
func TestHTTPWeighted(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	g := newRedisGuard(t, fencing.RedisOptions{})
	srv := fencedServer(t, g)
	r := redistest.Name(t)
	for i, s := range []struct {
		fence  fencing.Fence
		status int
	}{
		{wfence(r, 10, 0, 1, 2), http.StatusOK},
		{wfence(r, 11, 2), http.StatusOK}, // slot 2 changes hands
		{wfence(r, 10, 0, 1, 2), http.StatusConflict},
		{wfence(r, 9, 3, 4), http.StatusOK},
		{wfence(r, 10, 3, 4, 5), http.StatusOK},
	} {
		status, body, err := send(t, fencing.WithFence(ctx, s.fence), srv.URL)
		if err != nil || status != s.status {
			t.Fatalf("step %d %+v: %d %q %v, want %d", i, s.fence, status, body, err, s.status)
		}
	}
	for slot, want := range map[int]int64{0: 10, 1: 10, 2: 11, 3: 10, 5: 10} {
		if got, err := g.Highest(ctx, r, slot); err != nil || got != want {
			t.Fatalf("slot %d: %d, %v; want %d", slot, got, err, want)
		}
	}
	// An unsorted weighted fence in the context is not sent.
	bad := fencing.Fence{Resource: r, Slot: 4, Slots: []int{4, 3}, Token: 12}
	if _, _, err := send(t, fencing.WithFence(ctx, bad), srv.URL); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("unsorted slots: %v, want ErrInvalidFence", err)
	}
}

// TestGuardWeightedModel drives each guard and an in-memory model side by
// side with random one-slot and weighted fences: the model accepts a token
// when it is at least the recorded one of every slot and then records it
// for all of them. Every answer and, at the end, every record must agree.
func TestGuardWeightedModel(t *testing.T) {
	for _, gs := range guardStores {
		t.Run(gs.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 30*time.Second)
			s := gs.mk(t)
			r := redistest.Name(t)
			const slots, steps = 8, 400
			model := make([]int64, slots)
			seed := rand.Uint64()
			rng := rand.New(rand.NewPCG(seed, 2))
			t.Logf("seed %d", seed)
			for i := 0; i < steps; i++ {
				var held []int
				for sl := 0; sl < slots; sl++ {
					if rng.IntN(3) == 0 {
						held = append(held, sl)
					}
				}
				if len(held) == 0 {
					held = []int{rng.IntN(slots)}
				}
				f := wfence(r, int64(i/2+rng.IntN(20)+1), held...) // rising, overlapping
				want := true
				for _, sl := range held {
					want = want && f.Token >= model[sl]
				}
				err := s.check(ctx, f)
				if want != (err == nil) || (err != nil && !errors.Is(err, fencing.ErrStale)) {
					t.Fatalf("seed %d step %d: %v token %d over %v: %v, model accepts: %v", seed, i, held, f.Token, model, err, want)
				}
				if want {
					for _, sl := range held {
						model[sl] = f.Token
					}
				}
			}
			for sl, tok := range model {
				if got := s.highest(ctx, r, sl); got != tok {
					t.Fatalf("seed %d: slot %d records %d, model %d", seed, sl, got, tok)
				}
			}
		})
	}
}

// FuzzParseHeaders: whatever the slot headers say, ParseHeaders returns a
// valid fence or an *InvalidFenceError, and a valid fence survives
// SetHeaders and ParseHeaders unchanged.
func FuzzParseHeaders(f *testing.F) {
	for _, seed := range [][2]string{{"", "0,3,4"}, {"1", "1,5"}, {"3", ""}, {"", "5,1"}, {"", "1,,2"}, {"0", " 0 , 7"}, {"", "-0,1"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, slot, slots string) {
		h := http.Header{}
		h.Set(fencing.HeaderResource, "r")
		h.Set(fencing.HeaderToken, "5")
		if slot != "" {
			h.Set(fencing.HeaderSlot, slot)
		}
		if slots != "" {
			h.Set(fencing.HeaderSlots, slots)
		}
		fence, err := fencing.ParseHeaders(h)
		if err != nil {
			if !errors.Is(err, fencing.ErrInvalidFence) {
				t.Fatalf("%q %q: %v", slot, slots, err)
			}
			return
		}
		if err := fence.Validate(); err != nil {
			t.Fatalf("%q %q: parsed %+v fails Validate: %v", slot, slots, fence, err)
		}
		h2 := http.Header{}
		if err := fencing.SetHeaders(h2, fence); err != nil {
			t.Fatal(err)
		}
		back, err := fencing.ParseHeaders(h2)
		if err != nil || back.Slot != fence.Slot || !slices.Equal(back.Slots, fence.Slots) || (back.Slots == nil) != (fence.Slots == nil) {
			t.Fatalf("%+v -> %v -> %+v, %v", fence, h2, back, err)
		}
	})
}
