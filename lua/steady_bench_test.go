package lua_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// TestSteadyState times the uncontended unfair cycle (TryAcquire, then
// Release, as FCALLs) on a semaphore in the state a busy one is in, next to
// fresh keys, one call per round trip ("isolated") and 100 per round trip
// ("pipelined"); µs per script call from INFO commandstats, on a server of
// its own:
//
//   - small: keys deleted every 8 cycles (meta stays a listpack of about 20
//     fields, ended a listpack; the init call included);
//   - grow: fresh keys at the start, growing with the run (as BenchmarkScripts);
//   - steady10k: 10 000 tombstones made first (~2 000 releases a second for
//     5 s, none due yet: the state);
//   - steady30k: 30 000 tombstones whose ends are spread over the next 15 s
//     (~2 000 releases a second for more than 15 s: as many end each second
//     as are made, so prune removes ~2 000 a second).
//
// Modes: isolated (one call per round trip, back to back), paced (the same
// with a 1 ms sleep after each cycle, as peers.sh's uncontended redsem runs
// pace theirs), pipelined (100 calls per round trip).
//
// It runs only when asked: REDSEM_STEADY=1 (REDSEM_STEADY_ROUNDS, default 3;
// REDSEM_STEADY_CYCLES, cycles per measurement, default 2000;
// REDSEM_STEADY_PIN=1 pins the server to CPU 0 (run the test binary on CPU 1:
// taskset -c 1); REDSEM_STEADY_ADDR=host:port uses that server instead of
// one of its own; REDSEM_STEADY_STATES and REDSEM_STEADY_MODES (comma
// separated) pick states and modes.
func TestSteadyState(t *testing.T) {
	if os.Getenv("REDSEM_STEADY") == "" {
		t.Skip("set REDSEM_STEADY=1 to time the scripts in steady state")
	}
	rounds := envInt("REDSEM_STEADY_ROUNDS", 3)
	cycles := envInt("REDSEM_STEADY_CYCLES", 2000)
	var c *redis.Client
	if addr := os.Getenv("REDSEM_STEADY_ADDR"); addr != "" {
		c = redis.NewClient(&redis.Options{Addr: addr}) // a server of the caller's (e.g. under perf)
		t.Cleanup(func() { _ = c.Close() })
	} else {
		c = redistest.Start(t).Client(t)
	}
	ctx := context.Background()
	if os.Getenv("REDSEM_STEADY_PIN") == "1" {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		pid := ""
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
				pid = v
			}
		}
		if b, err := exec.Command("taskset", "-pc", "0", pid).CombinedOutput(); err != nil {
			t.Fatalf("taskset: %v: %s", err, b)
		}
	}
	_, lib := lua.Library()
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		t.Fatal(err)
	}
	// REDSEM_STEADY_FUNCS=floor1 times floor.lua's floor (floorLua) on the
	// library's layout instead of the library's scripts.
	fa, fr := lua.Acquire.Function(), lua.Release.Function()
	if os.Getenv("REDSEM_STEADY_FUNCS") == "floor1" {
		src, err := os.ReadFile(floorLua)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.FunctionLoadReplace(ctx, string(src)).Err(); err != nil {
			t.Fatal(err)
		}
		fa, fr = "floor1_acquire", "floor1_release"
	}
	acq := func(p redis.Cmdable, k core.Keys, id string) {
		p.FCall(ctx, fa, k.List, k.Chan, "PUBLISH", 5, id, 1, 30000, "try", "-", 0, "bench", 0)
	}
	rel := func(p redis.Cmdable, k core.Keys, id string, ms int) {
		p.FCall(ctx, fr, k.List, k.Chan, "PUBLISH", 5, id, "owner", ms)
	}
	// fill makes n tombstones in k, pipelined; record_ms(i) is the life of
	// the i-th.
	fill := func(k core.Keys, n int, recordMS func(i int) int) {
		for i := 0; i < n; i += 500 {
			p := c.Pipeline()
			for j := i; j < min(i+500, n); j++ {
				id := "fill-" + strconv.Itoa(j)
				acq(p, k, id)
				rel(p, k, id, recordMS(j))
			}
			if _, err := p.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	describe := func(k core.Keys) string {
		m, e := k.List[core.KeyMeta], k.List[core.KeyEnded]
		me, _ := c.ObjectEncoding(ctx, m).Result()
		ee, _ := c.ObjectEncoding(ctx, e).Result()
		return fmt.Sprintf("meta %s/%d ended %s/%d", me, c.HLen(ctx, m).Val(), ee, c.ZCard(ctx, e).Val())
	}
	type state struct {
		name  string
		setup func(k core.Keys)
	}
	states := []state{
		{"fresh", nil},
		{"steady10k", func(k core.Keys) { fill(k, 10000, func(int) int { return 15000 }) }},
		{"steady30k", func(k core.Keys) { fill(k, 30000, func(i int) int { return 1 + 15000*i/30000 }) }},
	}
	if only := os.Getenv("REDSEM_STEADY_STATES"); only != "" {
		var keep []state
		for _, st := range states {
			if strings.Contains(","+only+",", ","+st.name+",") {
				keep = append(keep, st)
			}
		}
		states = keep
	}
	modes := []string{"isolated", "paced", "pipelined"}
	if m := os.Getenv("REDSEM_STEADY_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	const freshCycles = 8 // cycles per fresh semaphore
	results := map[string][]float64{}
	var order []string
	seq := 0
	for r := 1; r <= rounds; r++ {
		for _, st := range states {
			for _, mode := range modes {
				seq++
				// keys(i) is the semaphore of cycle i: one for a steady
				// state, a new one every freshCycles cycles for fresh keys,
				// each initialised beforehand by one cycle of its own.
				var keys func(i int) core.Keys
				var first core.Keys
				if st.setup != nil {
					k := core.KeysFor("redsem", fmt.Sprintf("steady-%d", seq))
					st.setup(k)
					keys = func(int) core.Keys { return k }
					first = k
				} else {
					ks := make([]core.Keys, (cycles+freshCycles-1)/freshCycles)
					p := c.Pipeline()
					for j := range ks {
						ks[j] = core.KeysFor("redsem", fmt.Sprintf("steady-%d-%d", seq, j))
						acq(p, ks[j], "init")
						rel(p, ks[j], "init", 15000)
					}
					if _, err := p.Exec(ctx); err != nil {
						t.Fatal(err)
					}
					keys = func(i int) core.Keys { return ks[i/freshCycles] }
					first = ks[0]
				}
				before := describe(first)
				s0, err := commandStats(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				if mode == "isolated" || mode == "paced" {
					for i := 0; i < cycles; i++ {
						k, id := keys(i), "m-"+strconv.Itoa(i)
						acq(c, k, id)
						rel(c, k, id, 15000)
						if mode == "paced" {
							time.Sleep(time.Millisecond) // as redsem bench's 1 µs holds: ~700 cycles a second
						}
					}
				} else {
					for i := 0; i < cycles; i += 50 {
						p := c.Pipeline()
						for j := i; j < i+50; j++ {
							k, id := keys(j), "m-"+strconv.Itoa(j)
							acq(p, k, id)
							rel(p, k, id, 15000)
						}
						if _, err := p.Exec(ctx); err != nil {
							t.Fatal(err)
						}
					}
				}
				el := time.Since(start)
				s1, err := commandStats(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				var calls, usec, inner int64
				for name, v := range s1 {
					d := [2]int64{v[0] - s0[name][0], v[1] - s0[name][1]}
					switch {
					case strings.HasPrefix(name, "fcall"):
						calls += d[0]
						usec += d[1]
					case name == "info":
					default:
						inner += d[1]
					}
				}
				us := float64(usec) / float64(calls)
				name := st.name + " " + mode
				if results[name] == nil {
					order = append(order, name)
				}
				results[name] = append(results[name], us)
				t.Logf("round %d %-10s %-9s %6.2f us/script (inner %5.2f) %5.0f cycles/s  before: %s  after: %s",
					r, st.name, mode, us, float64(inner)/float64(calls),
					float64(cycles)/el.Seconds(), before, describe(keys(cycles-1)))
				for j := 0; j < cycles; j += freshCycles {
					c.Del(ctx, keys(j).List...)
				}
			}
		}
	}
	stat := func(v []float64) (lo, med, hi float64) {
		v = append([]float64(nil), v...)
		sort.Float64s(v)
		return v[0], v[len(v)/2], v[len(v)-1]
	}
	for _, name := range order {
		lo, med, hi := stat(results[name])
		line := fmt.Sprintf("summary %-20s min %6.2f median %6.2f max %6.2f us/script (%d runs)", name, lo, med, hi, len(results[name]))
		// The ratio to fresh keys in the same mode and round.
		state, mode, _ := strings.Cut(name, " ")
		if f := results["fresh "+mode]; state != "fresh" && len(f) == len(results[name]) {
			var ratio []float64
			for i, v := range results[name] {
				ratio = append(ratio, v/f[i])
			}
			lo, med, hi := stat(ratio)
			line += fmt.Sprintf("; / fresh in the same round: min %.2f median %.2f max %.2f", lo, med, hi)
		}
		t.Logf("%s", line)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestSteadyPaired times the same as TestSteadyState with the noise of a
// shared machine taken out: two servers of its own (both on CPU 0 with
// REDSEM_STEADY_PIN=1), one holding fresh keys and the other a semaphore
// with 10 000 tombstones (their roles swapped every round), and cycles
// alternating between them one by one, so that both see the same load; µs
// per script call from each server's INFO commandstats. Modes: isolated
// (back to back) and paced (1 ms sleep after each cycle).
// REDSEM_STEADY_TOMBSTONES sets how many tombstones (10 000);
// REDSEM_STEADY_FILL=meta or =ended writes them directly into that key
// only (the other stays small), to tell their costs apart.
//
//	REDSEM_STEADY=1 go test ./lua -run TestSteadyPaired -v
func TestSteadyPaired(t *testing.T) {
	if os.Getenv("REDSEM_STEADY") == "" {
		t.Skip("set REDSEM_STEADY=1 to time the scripts in steady state")
	}
	rounds := envInt("REDSEM_STEADY_ROUNDS", 4)
	cycles := envInt("REDSEM_STEADY_CYCLES", 1000)
	tomb := envInt("REDSEM_STEADY_TOMBSTONES", 10000)
	ctx := context.Background()
	var cs [2]*redis.Client
	for i := range cs {
		cs[i] = redistest.Start(t).Client(t)
		if os.Getenv("REDSEM_STEADY_PIN") == "1" {
			info := cs[i].Info(ctx, "server").Val()
			for _, l := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
					if b, err := exec.Command("taskset", "-pc", "0", v).CombinedOutput(); err != nil {
						t.Fatalf("taskset: %v: %s", err, b)
					}
				}
			}
		}
		_, lib := lua.Library()
		if err := cs[i].FunctionLoadReplace(ctx, lib).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cycle := func(c redis.Cmdable, k core.Keys, id string) {
		c.FCall(ctx, lua.Acquire.Function(), k.List, k.Chan, "PUBLISH", 5, id, 1, 30000, "try", "-", 0, "bench", 0)
		c.FCall(ctx, lua.Release.Function(), k.List, k.Chan, "PUBLISH", 5, id, "owner", 15000)
	}
	scriptUs := func(s0, s1 map[string][2]int64) float64 {
		var calls, usec int64
		for name, v := range s1 {
			if strings.HasPrefix(name, "fcall") {
				calls += v[0] - s0[name][0]
				usec += v[1] - s0[name][1]
			}
		}
		return float64(usec) / float64(calls)
	}
	ratios := map[string][]float64{}
	seq := 0
	for r := 0; r < rounds; r++ {
		for _, mode := range []string{"isolated", "paced"} {
			seq++
			steady := r % 2 // the server that holds the steady semaphore
			var keys [2]func(i int) core.Keys
			for s := range cs {
				if s == steady {
					k := core.KeysFor("redsem", fmt.Sprintf("paired-%d", seq))
					p := cs[s].Pipeline()
					fill := os.Getenv("REDSEM_STEADY_FILL") // "meta" or "ended": the records of one key only
					if fill != "" {
						cycle(p, k, "init")
						if _, err := p.Exec(ctx); err != nil {
							t.Fatal(err)
						}
					}
					ms := cs[s].Time(ctx).Val().UnixMilli() + 15000
					for i := 0; i < tomb; i++ {
						id := "fill-" + strconv.Itoa(i)
						switch fill {
						case "meta":
							p.HSet(ctx, k.List[core.KeyMeta], id, "R")
						case "ended":
							p.ZAdd(ctx, k.List[core.KeyEnded], redis.Z{Score: float64(ms), Member: id})
						default:
							cycle(p, k, id)
						}
						if i%500 == 499 || i == tomb-1 {
							if _, err := p.Exec(ctx); err != nil {
								t.Fatal(err)
							}
						}
					}
					keys[s] = func(int) core.Keys { return k }
				} else {
					ks := make([]core.Keys, cycles/8+1)
					p := cs[s].Pipeline()
					for j := range ks {
						ks[j] = core.KeysFor("redsem", fmt.Sprintf("paired-%d-%d", seq, j))
						cycle(p, ks[j], "init")
					}
					if _, err := p.Exec(ctx); err != nil {
						t.Fatal(err)
					}
					keys[s] = func(i int) core.Keys { return ks[i/8] }
				}
			}
			var s0 [2]map[string][2]int64
			for s := range cs {
				s0[s], _ = commandStats(ctx, cs[s])
			}
			for i := 0; i < cycles; i++ {
				for s := range cs {
					cycle(cs[s], keys[s](i), "m-"+strconv.Itoa(i))
					if mode == "paced" {
						time.Sleep(time.Millisecond)
					}
				}
			}
			var us [2]float64
			for s := range cs {
				s1, _ := commandStats(ctx, cs[s])
				us[s] = scriptUs(s0[s], s1)
			}
			m := keys[steady](0).List[core.KeyMeta]
			e := keys[steady](0).List[core.KeyEnded]
			t.Logf("round %d %-8s fresh %6.2f  steady %6.2f us/script (x%.2f; steady on server %d: meta %s/%d, ended %s/%d)",
				r+1, mode, us[1-steady], us[steady], us[steady]/us[1-steady], steady,
				cs[steady].ObjectEncoding(ctx, m).Val(), cs[steady].HLen(ctx, m).Val(),
				cs[steady].ObjectEncoding(ctx, e).Val(), cs[steady].ZCard(ctx, e).Val())
			ratios[mode] = append(ratios[mode], us[steady]/us[1-steady])
			for s := range cs {
				cs[s].FlushAll(ctx)
			}
		}
	}
	for _, mode := range []string{"isolated", "paced"} {
		v := append([]float64(nil), ratios[mode]...)
		sort.Float64s(v)
		t.Logf("summary %-8s steady/fresh min %.2f median %.2f max %.2f (%d rounds)", mode, v[0], v[len(v)/2], v[len(v)-1], len(v))
	}
}
