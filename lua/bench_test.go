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

// BenchmarkScripts measures what each semaphore script costs Redis per call,
// pipelined (100 calls per round trip) on a server of its own, so that the
// network and the client barely count: the figures are the server's. Each
// sub-benchmark reports "us/script": the mean time Redis spent in one script
// call (INFO commandstats, inner commands included), of which
// "inner-us/script" were the commands the scripts ran (every command but
// EVAL*/FCALL*); and per script it ran, "us/<script>": SLOWLOG's split of
// that mean by script, from a short pass after the timed one (SLOWLOG at
// threshold 0 slows what it times; see scriptCost.report).
//
//	go test ./lua -run '^$' -bench Scripts -benchtime 2000x
func BenchmarkScripts(b *testing.B) {
	const pipe = 100
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()

	_, lib := lua.Library()
	if err := c.FunctionLoad(ctx, lib).Err(); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"evalsha", "fcall"} {
		for _, sc := range scriptCases(ctx, c, mode) {
			b.Run(mode+"/"+sc.name, func(b *testing.B) {
				k := core.KeysFor("redsem", "bench-"+mode+"-"+sc.name)
				if sc.setup != nil {
					if err := sc.setup(k); err != nil {
						b.Fatal(err)
					}
				}
				cost := timePipe(ctx, b, c, k, sc.do, pipe)
				// The split by script, from a short pass of its own with
				// SLOWLOG on (see report).
				cost.report(ctx, b, func() {
					for i := 0; i < splitCycles; i += pipe {
						if _, err := runPipe(ctx, c, k, sc.do, pipe+b.N+i, pipe); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}

// timePipe times b.N cycles of do, pipe per round trip, after a warm-up
// round (the scripts are loaded and the keys exist), and returns their cost
// for report.
func timePipe(ctx context.Context, b *testing.B, c *redis.Client, k core.Keys, do cycle, pipe int) *scriptCost {
	if _, err := runPipe(ctx, c, k, do, 0, pipe); err != nil {
		b.Fatal(err)
	}
	cost := startCost(ctx, b, c)
	b.ResetTimer()
	for i := 0; i < b.N; i += pipe {
		if _, err := runPipe(ctx, c, k, do, pipe+i, min(pipe, b.N-i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	return cost
}

// waitPruneDue waits, at most within, until the server's clock has reached
// the semaphore's next prune time (meta's _prune), so that the next script
// call of k runs the prune step.
func waitPruneDue(ctx context.Context, c *redis.Client, k core.Keys, within time.Duration) error {
	next, err := c.HGet(ctx, k.List[core.KeyMeta], "_prune").Int64()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(within)
	for {
		now, err := c.Time(ctx).Result()
		if err != nil {
			return err
		}
		if now.UnixMilli() >= next {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server's clock did not reach _prune %d within %v", next, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// cycle sends the script calls of cycle i into p.
type cycle func(p redis.Pipeliner, k core.Keys, i int)

// scriptCase is one workload of BenchmarkScripts and TestScriptInstructions:
// setup (may be nil) prepares the semaphore's keys, then cycles repeat.
type scriptCase struct {
	name  string
	setup func(k core.Keys) error
	do    cycle
}

// scriptCases returns the workloads, calling the scripts with EVALSHA
// (mode "evalsha") or as functions of the library ("fcall").
func scriptCases(ctx context.Context, c *redis.Client, mode string) []scriptCase {
	var cases []scriptCase
	bench := func(name string, setup func(k core.Keys) error, do cycle) {
		cases = append(cases, scriptCase{name, setup, do})
	}
	call := func(p redis.Pipeliner, k core.Keys, s lua.Script, args ...any) {
		argv := append([]any{k.Chan, "PUBLISH"}, args...)
		if mode == "fcall" {
			p.FCall(ctx, s.Function(), k.List, argv...)
		} else {
			p.EvalSha(ctx, s.Hash(), k.List, argv...)
		}
	}
	id := func(i int) string { return "id-" + strconv.Itoa(i) }

	// The uncontended unfair cycle: TryAcquire, then Release.
	tryRelease := func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, 5, id(i), 1, 30000, "try", "-", 0, "bench", 0)
		call(p, k, lua.Release, 5, id(i), "owner", 15000)
	}
	bench("unfair-try-release", nil, tryRelease)
	// Four holders' releases that meet in one call (core's releases.go: the
	// releases that come while one is in flight): four TryAcquires, then
	// one releasemany.lua call for the four, against unfair-try-release's
	// release.lua call per lease.
	bench("unfair-try-releasemany-4", nil, func(p redis.Pipeliner, k core.Keys, i int) {
		args := make([]any, 0, 6)
		args = append(args, 5, 15000)
		for j := 0; j < 4; j++ {
			call(p, k, lua.Acquire, 5, id(4*i+j), 1, 30000, "try", "-", 0, "bench", 0)
			args = append(args, id(4*i+j))
		}
		call(p, k, lua.ReleaseMany, args...)
	})
	// The unfair cycle on a semaphore whose meta holds 300 tombstones (as
	// one that turns over 20 leases a second keeps: each lives 15 s), after
	// a prune step has run: the field lookups of a listpack of 300 fields
	// against a hash table (keep_hashed, lib_prune.lua).
	bench("unfair-try-release-300", func(k core.Keys) error {
		// Afresh on every run of the benchmark function (the framework
		// runs it more than once): 300 tombstones, not 300 per run.
		if err := c.Del(ctx, k.List...).Err(); err != nil {
			return err
		}
		for i := 0; i < 300; i++ {
			if _, err := run1(ctx, c, lua.Acquire, k, 5, "t"+id(i), 1, 30000, "try", "-", 0, "bench", 0); err != nil {
				return err
			}
			if _, err := run1(ctx, c, lua.Release, k, 5, "t"+id(i), "owner", 15000); err != nil {
				return err
			}
		}
		if err := waitPruneDue(ctx, c, k, 5*time.Second); err != nil {
			return err
		}
		_, err := run1(ctx, c, lua.Release, k, 5, "none", "owner", 15000) // runs prune
		return err
	}, tryRelease)
	// The unfair cycle on fresh keys: a new semaphore every 8 cycles (its
	// first call makes its keys), so that meta stays a listpack of about
	// 20 fields and ended a small one.
	bench("unfair-try-release-fresh", nil, func(p redis.Pipeliner, k core.Keys, i int) {
		fk := core.KeysFor("redsem", k.List[core.KeyMeta]+"-"+strconv.Itoa(i/8))
		call(p, fk, lua.Acquire, 5, id(i), 1, 30000, "try", "-", 0, "bench", 0)
		call(p, fk, lua.Release, 5, id(i), "owner", 15000)
	})
	// The unfair cycle in the steady state of a semaphore released ~2 000
	// times a second: 10 000 tombstones (5 s of it, none due yet: meta a
	// hash table, ended a skiplist), and 30 000 whose ends are spread over
	// the next 15 s (more than 15 s of it: as many end each second as are
	// made, so prune removes ~2 000 a second).
	bench("unfair-try-release-10k", func(k core.Keys) error {
		return fillTombstones(ctx, c, k, 10000, func(i int) int64 { return 15000 })
	}, tryRelease)
	bench("unfair-try-release-30k", func(k core.Keys) error {
		return fillTombstones(ctx, c, k, 30000, func(i int) int64 { return 1 + int64(15000*i/30000) })
	}, tryRelease)
	// The uncontended fair cycle: a queue-mode acquire granted at once, then
	// Release, under a live session.
	bench("fair-queue-release", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Heartbeat, k, 5, "sess", 600000, "new"); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, 5, id(i), 1, 30000, "queue", "sess", 0, "bench", 0)
		call(p, k, lua.Release, 5, id(i), "owner", 15000)
	})
	// A fair waiter queued behind full slots, then removed (an undo), with
	// 4 holders of 5 slots: the queue path and the cancelling release.
	bench("fair-queue-undo", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Heartbeat, k, 5, "sess", 600000, "new"); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, 5, "holder", 5, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, 5, id(i), 1, 30000, "queue", "sess", 0, "bench", 0)
		call(p, k, lua.Release, 5, id(i), "undo", 15000)
	})
	// The contended fair path: a handoff per cycle. Limit 1; id(i)
	// holds; id(i+1) queues behind it (acquire, not granted), then
	// id(i)'s Release admits id(i+1) (the grant, its record, the
	// PUBLISH to the session's channel). The setup starts the chain
	// afresh on every run of the benchmark function.
	bench("fair-handoff", func(k core.Keys) error {
		if err := c.Del(ctx, k.List...).Err(); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Heartbeat, k, 1, "sess", 600000, "new"); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, 1, id(0), 1, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, 1, id(i+1), 1, 600000, "queue", "sess", 0, "bench", 0)
		call(p, k, lua.Release, 1, id(i), "owner", 15000)
	})
	// Renew of one held lease.
	bench("renew", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Acquire, k, 5, "held", 1, 30000, "try", "-", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Renew, 5, "held", 30000)
	})
	// The heartbeat of a session with a waiter queued behind full slots.
	bench("heartbeat", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Heartbeat, k, 5, "sess", 600000, "new"); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, 5, "holder", 5, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, 5, "waiter", 1, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Heartbeat, 5, "sess", 600000, "old")
	})
	// Status (a read-only script) of a semaphore with 5 holders.
	bench("status", func(k core.Keys) error {
		for i := 0; i < 5; i++ {
			if _, err := run1(ctx, c, lua.Acquire, k, 5, id(-1-i), 1, 600000, "try", "-", 0, "bench", 0); err != nil {
				return err
			}
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		if mode == "fcall" {
			p.FCallRO(ctx, lua.Status.Function(), k.List, k.Chan, "PUBLISH", 5)
		} else {
			p.EvalShaRO(ctx, lua.Status.Hash(), k.List, k.Chan, "PUBLISH", 5)
		}
	})

	// The same under a rate (Options.Rate). "5:R:P" is the client's
	// limit 5 with a rate of R slots per P ms (client_arg, lib_args.lua).
	//
	// rate-*-release: a rate that always has room (a million per 100
	// ms), so every grant is checked against, and recorded in, a window
	// of a few thousand records that each call also trims.
	const roomy = "5:1000000:100"
	bench("rate-unfair-try-release", nil, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, roomy, id(i), 1, 30000, "try", "-", 0, "bench", 0)
		call(p, k, lua.Release, roomy, id(i), "owner", 15000)
	})
	bench("rate-fair-queue-release", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Heartbeat, k, roomy, "sess", 600000, "new"); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, roomy, id(i), 1, 30000, "queue", "sess", 0, "bench", 0)
		call(p, k, lua.Release, roomy, id(i), "owner", 15000)
	})
	// rate-try-refused: a slot is free but the window is full (2 of 2
	// per minute granted): TryAcquire is refused by the rate and told
	// when the window has room.
	const full = "5:2:60000"
	bench("rate-try-refused", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Acquire, k, full, "held", 2, 600000, "try", "-", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Acquire, full, id(i), 1, 30000, "try", "-", 0, "bench", 0)
	})
	// rate-heartbeat: the head waiter fits the free slots but the
	// window is full: each beat checks the window and keeps it queued.
	bench("rate-heartbeat", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Heartbeat, k, full, "sess", 600000, "new"); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, full, "holder", 2, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		if _, err := run1(ctx, c, lua.Acquire, k, full, "waiter", 1, 600000, "queue", "sess", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		call(p, k, lua.Heartbeat, full, "sess", 600000, "old")
	})
	// rate-status: Status sums the window's records (2 here).
	bench("rate-status", func(k core.Keys) error {
		if _, err := run1(ctx, c, lua.Acquire, k, full, "held", 2, 600000, "try", "-", 0, "bench", 0); err != nil {
			return err
		}
		return nil
	}, func(p redis.Pipeliner, k core.Keys, i int) {
		if mode == "fcall" {
			p.FCallRO(ctx, lua.Status.Function(), k.List, k.Chan, "PUBLISH", full)
		} else {
			p.EvalShaRO(ctx, lua.Status.Hash(), k.List, k.Chan, "PUBLISH", full)
		}
	})
	return cases
}

func run1(ctx context.Context, c *redis.Client, s lua.Script, k core.Keys, args ...any) ([]any, error) {
	return core.Script(s).Run(ctx, c, k.List, append([]any{k.Chan, "PUBLISH"}, args...)...).Slice()
}

func runPipe(ctx context.Context, c *redis.Client, k core.Keys, do func(redis.Pipeliner, core.Keys, int), from, n int) ([]redis.Cmder, error) {
	p := c.Pipeline()
	for i := from; i < from+n; i++ {
		do(p, k, i)
	}
	cmds, err := p.Exec(ctx)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		// Load every script once, then run the batch again.
		for _, s := range lua.Scripts() {
			if err := c.ScriptLoad(ctx, s.Source()).Err(); err != nil {
				return nil, err
			}
		}
		return runPipe(ctx, c, k, do, from, n)
	}
	for _, cmd := range cmds {
		if cmd.Err() != nil {
			return cmds, fmt.Errorf("%v: %w", cmd.Args()[:2], cmd.Err())
		}
	}
	return cmds, err
}

// splitCycles is how many cycles the SLOWLOG pass of report runs.
const splitCycles = 300

// scriptCost measures the server's time per script call between its start
// and report.
type scriptCost struct {
	c      *redis.Client
	before map[string][2]int64 // commandstats: name -> calls, usec
}

func startCost(ctx context.Context, b *testing.B, c *redis.Client) *scriptCost {
	st, err := commandStats(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	return &scriptCost{c: c, before: st}
}

// report reports "us/script", the mean time per script call since start
// from INFO commandstats, and "inner-us/script", the commands the scripts
// ran. Then it runs split with SLOWLOG timing every command, which splits
// the time by script ("us/<script>"), scaled so that the calls' mean is
// us/script: SLOWLOG at threshold 0 logs every command a script runs, which
// slowed the scripts by 10-45%, so it is not on while the benchmark runs.
func (s *scriptCost) report(ctx context.Context, b *testing.B, split func()) {
	after, err := commandStats(ctx, s.c)
	if err != nil {
		b.Fatal(err)
	}
	var calls, usec, inner int64
	for name, v := range after {
		d := [2]int64{v[0] - s.before[name][0], v[1] - s.before[name][1]}
		switch {
		case strings.HasPrefix(name, "eval"), strings.HasPrefix(name, "fcall"):
			calls += d[0]
			usec += d[1]
		case name == "slowlog", name == "config", name == "info":
		default:
			inner += d[1]
		}
	}
	if calls == 0 {
		return
	}
	mean := float64(usec) / float64(calls)
	b.ReportMetric(mean, "us/script")
	b.ReportMetric(float64(inner)/float64(calls), "inner-us/script")

	for _, cmd := range [][]any{
		{"config", "set", "slowlog-log-slower-than", "0"},
		{"config", "set", "slowlog-max-len", "1000000"},
		{"slowlog", "reset"},
	} {
		if err := s.c.Do(ctx, cmd...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	split()
	if err := s.c.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err(); err != nil {
		b.Fatal(err)
	}
	defer s.c.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
	// SLOWLOG splits the time by script (its SHA1 or function name is the
	// entry's second argument).
	names := map[string]string{}
	for _, sc := range lua.Scripts() {
		names[sc.Hash()] = strings.TrimSuffix(sc.String(), ".lua")
		if f := sc.Function(); f != "" {
			names[f] = strings.TrimSuffix(sc.String(), ".lua")
		}
	}
	logs, err := s.c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	per := map[string][2]float64{}
	var n, t float64
	for _, l := range logs {
		if len(l.Args) < 2 || !(strings.HasPrefix(strings.ToLower(l.Args[0]), "evalsha") || strings.HasPrefix(strings.ToLower(l.Args[0]), "fcall")) {
			continue
		}
		name := names[l.Args[1]]
		if name == "" {
			continue
		}
		v := per[name]
		us := float64(l.Duration / time.Microsecond)
		per[name] = [2]float64{v[0] + 1, v[1] + us}
		n++
		t += us
	}
	if t == 0 {
		return
	}
	for name, v := range per {
		b.ReportMetric(v[1]/v[0]*mean/(t/n), "us/"+name)
	}
}

// commandStats reads INFO commandstats as name -> {calls, usec}.
func commandStats(ctx context.Context, c *redis.Client) (map[string][2]int64, error) {
	text, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	m := map[string][2]int64{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(k, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var calls, usec int64
		for _, f := range strings.Split(v, ",") {
			if x, ok := strings.CutPrefix(f, "calls="); ok {
				calls, _ = strconv.ParseInt(x, 10, 64)
			}
			if x, ok := strings.CutPrefix(f, "usec="); ok {
				usec, _ = strconv.ParseInt(x, 10, 64)
			}
		}
		m[name] = [2]int64{calls, usec}
	}
	return m, nil
}

// fillTombstones makes k a semaphore whose meta holds n release tombstones
// ("R", as release.lua leaves them), the i-th listed in ended until
// lifeMS(i) ms from now (server time): the keys afresh, one cycle of the
// scripts to make them, then the records written directly (much faster
// than n cycles, under callgrind too).
func fillTombstones(ctx context.Context, c *redis.Client, k core.Keys, n int, lifeMS func(i int) int64) error {
	if err := c.Del(ctx, k.List...).Err(); err != nil {
		return err
	}
	if _, err := run1(ctx, c, lua.Acquire, k, 5, "fill", 1, 30000, "try", "-", 0, "bench", 0); err != nil {
		return err
	}
	if _, err := run1(ctx, c, lua.Release, k, 5, "fill", "owner", 15000); err != nil {
		return err
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	ms := now.UnixMilli()
	for i := 0; i < n; i += 500 {
		p := c.Pipeline()
		for j := i; j < min(i+500, n); j++ {
			id := "fill-" + strconv.Itoa(j)
			p.HSet(ctx, k.List[core.KeyMeta], id, "R")
			p.ZAdd(ctx, k.List[core.KeyEnded], redis.Z{Score: float64(ms + lifeMS(j)), Member: id})
		}
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}
