package lua_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// floorLua is the floor script pair, which the bench tool also runs as its
// "floor" variant (redsem bench --variant floor): it lives there, beside
// the bench's other baselines, and is read here by its path in the checkout.
const floorLua = "../cmd/redsem/internal/bench/floor.lua"

// BenchmarkFloor sets the library's uncontended unfair cycle (TryAcquire,
// then Release) beside the two floors of floor.lua (floorLua): the leanest
// script pair that keeps the records a lease needs (server clock, fencing
// token, slot, a record per id, a tombstone) and runs the same commands as
// the library's, once on the library's own layout and call shape
// ("floor-library-layout": what the library's Lua logic costs above its
// commands) and once on a packed layout with every counter in one field
// ("floor": what a new data layout could save beyond that). All run
// pipelined, 100 calls per round trip, on one server of their own, each on
// fresh keys; "us/script" is the mean time per call from INFO commandstats
// (docs/benchmarks.md).
//
//	go test ./lua -run '^$' -bench Floor -benchtime 20000x -count 3
func BenchmarkFloor(b *testing.B) {
	const pipe = 100
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	src, err := os.ReadFile(floorLua)
	if err != nil {
		b.Fatal(err)
	}
	_, lib := lua.Library()
	for _, l := range []string{lib, string(src)} {
		if err := c.FunctionLoad(ctx, l).Err(); err != nil {
			b.Fatal(err)
		}
	}
	id := func(i int) string { return "id-" + strconv.Itoa(i) }
	cases := []struct {
		name string
		do   cycle
	}{
		{"library", func(p redis.Pipeliner, k core.Keys, i int) {
			p.FCall(ctx, lua.Acquire.Function(), k.List, k.Chan, "PUBLISH", 5, id(i), 1, 30000, "try", "-", 0, "bench", 0)
			p.FCall(ctx, lua.Release.Function(), k.List, k.Chan, "PUBLISH", 5, id(i), "owner", 15000)
		}},
		{"floor", func(p redis.Pipeliner, k core.Keys, i int) {
			keys := []string{k.List[core.KeyHolders], k.List[core.KeyFree], k.List[core.KeyEnded], k.List[core.KeyMeta]}
			p.FCall(ctx, "floor_acquire", keys, 5, id(i), 30000)
			p.FCall(ctx, "floor_release", keys, id(i), 15000)
		}},
		{"floor-library-layout", func(p redis.Pipeliner, k core.Keys, i int) {
			p.FCall(ctx, "floor1_acquire", k.List, k.Chan, "PUBLISH", 5, id(i), 1, 30000, "try", "-", 0, "bench", 0)
			p.FCall(ctx, "floor1_release", k.List, k.Chan, "PUBLISH", 5, id(i), "owner", 15000)
		}},
	}
	for _, cs := range cases {
		b.Run(cs.name, func(b *testing.B) {
			// Afresh on every run of the function: the same semaphore state
			// (and tombstone count) for both cases.
			k := core.KeysFor("redsem", "floor-"+cs.name)
			if err := c.Del(ctx, k.List...).Err(); err != nil {
				b.Fatal(err)
			}
			timePipe(ctx, b, c, k, cs.do, pipe).report(ctx, b, func() {})
		})
	}
}
