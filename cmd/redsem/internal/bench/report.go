package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// progress prints a progress line on stderr until the returned func is called.
func (b *bencher) progress(s runSpec, start, end time.Time) func(errors int) {
	if b.f.quiet {
		return func(int) {}
	}
	b.holds.Store(0)
	done := make(chan struct{})
	finished := make(chan struct{})
	label := fmt.Sprintf("%s limit=%d workers=%d procs=%d hold=%s", s.variant, s.limit, s.workers, s.procs, s.hold)
	if s.weights.Weighted() {
		label += " weights=" + s.weights.String()
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			el := time.Since(start).Seconds()
			if el < 0 {
				fmt.Fprintf(b.stderr, "\r%s: starting...          ", label)
				continue
			}
			el = min(el, end.Sub(start).Seconds())
			if s.procs > 1 {
				fmt.Fprintf(b.stderr, "\r%s: %.1fs/%.1fs          ", label, el, end.Sub(start).Seconds())
			} else {
				fmt.Fprintf(b.stderr, "\r%s: %.1fs/%.1fs holds=%d   ", label, el, end.Sub(start).Seconds(), b.holds.Load())
			}
		}
	}()
	return func(errors int) {
		close(done)
		<-finished
		fmt.Fprintf(b.stderr, "\r%s: done (%d errors)                    \n", label, errors)
	}
}

func printTable(w io.Writer, rs []runResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tprocs\tworkers\tholds/s\tutil\tmean hold ms\twait p50\tp90\tp99\tmax\tideal\tp99/ideal\thandoff p50\tp99\tjain\tmax holders\tcmds/hold\tredis calls/hold\tcpu µs/hold\t")
	for _, r := range rs {
		name := r.Variant
		if r.Weights != "" {
			name += " weights=" + r.Weights
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%.3f\t%.4f\t%d\t%.2f\t%.1f\t%.1f\t\n",
			name, r.Procs, r.Workers, r.HoldsPerSec, r.Utilisation, r.MeanHoldMs, r.WaitP50Ms, r.WaitP90Ms,
			r.WaitP99Ms, r.WaitMaxMs, r.IdealWaitMs, r.WaitP99OverIdeal, r.HandoffP50Ms, r.HandoffP99Ms,
			r.Jain, r.MaxHolders, r.CommandsPerHold, r.RedisCallsPerHold, r.RedisCPUUsPerHold)
	}
	_ = tw.Flush()
	for _, r := range rs {
		if r.PingRTTUs > 0 {
			fmt.Fprintf(w, "%s: PING RTT %.1f µs", r.Variant, r.PingRTTUs)
			if r.UncontendedUs > 0 {
				fmt.Fprintf(w, "; uncontended TryAcquire+Release %.1f µs = %.2f RTT (%.0f cycles/s, %.2f commands/cycle)",
					r.UncontendedUs, r.UncontendedOverRTT, r.UncontendedPerSec, r.UncontendedCmdsCycle)
			}
			fmt.Fprintln(w)
		}
		if rr := r.Rate; rr != nil {
			fmt.Fprintf(w, "%s: rate %s: %d slots granted of the %d it allows in the run (%.2f); busiest window of %v (%s times): %d, mean %.1f per window\n",
				r.Variant, rr.Rate, rr.Granted, rr.Allowed, rr.Achieved, time.Duration(rr.PerS*float64(time.Second)), rr.On, rr.BusiestWindow, rr.MeanPerWindow)
		}
		if r.ScriptCallsPerHold > 0 {
			fmt.Fprintf(w, "%s: scripts %.2f calls/hold, %.1f µs/call (inner commands %.1f)", r.Variant,
				r.ScriptCallsPerHold, r.ScriptUsPerCall, r.InnerUsPerScriptCall)
			for _, sc := range r.Scripts {
				fmt.Fprintf(w, "; %s %.2f/hold × %.1f µs", sc.Script, sc.CallsPerHold, sc.UsPerCall)
			}
			fmt.Fprintln(w)
		}
		if r.Errors > 0 {
			fmt.Fprintf(w, "%s: %d errors, last: %s\n", r.Variant, r.Errors, r.LastError)
		}
	}
}

// sweepPoint is one run of a sweep over the number of workers.
type sweepPoint struct {
	variant string
	workers int
	r       runResult
}

// writeCharts writes the SVG charts for the results it has data for.
func writeCharts(dir string, contended []runResult, sweep []sweepPoint) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, c Chart) error {
		return os.WriteFile(filepath.Join(dir, name), []byte(c.SVG()), 0o644)
	}
	if len(contended) > 0 {
		c := Chart{Title: "Wait time distribution (limit 5, 50 workers, hold 2ms)",
			XLabel: "wait (ms, log scale)", YLabel: "fraction of acquires waiting at most x", LogX: true, XMin: 0.01, YMin: 0, YMax: 1}
		for _, r := range contended {
			if r.Procs != 1 {
				continue
			}
			x, y := CDF(r.waits, 400)
			c.Series = append(c.Series, Series{Name: r.Variant, X: x, Y: y})
		}
		if err := write("wait-cdf.svg", c); err != nil {
			return err
		}
	}
	if len(sweep) == 0 {
		return nil
	}
	util := Chart{Title: "Slot utilisation vs workers (limit 5, hold 2ms)",
		XLabel: "workers", YLabel: "utilisation", YMin: 0, YMax: 1}
	hand := Chart{Title: "Handoff latency vs queue length (limit 5, hold 2ms)",
		XLabel: "waiters queued (workers - limit)", YLabel: "handoff latency (ms)"}
	byVariant := map[string][]sweepPoint{}
	var order []string
	for _, p := range sweep {
		if _, ok := byVariant[p.variant]; !ok {
			order = append(order, p.variant)
		}
		byVariant[p.variant] = append(byVariant[p.variant], p)
	}
	for _, v := range order {
		var x, u, qx, h50, h99 []float64
		for _, p := range byVariant[v] {
			x = append(x, float64(p.workers))
			u = append(u, p.r.Utilisation)
			if p.workers > p.r.Limit && v != "local" {
				qx = append(qx, float64(p.workers-p.r.Limit))
				h50 = append(h50, p.r.HandoffP50Ms)
				h99 = append(h99, p.r.HandoffP99Ms)
			}
		}
		util.Series = append(util.Series, Series{Name: v, X: x, Y: u})
		if len(qx) > 0 {
			hand.Series = append(hand.Series, Series{Name: v + " p50", X: qx, Y: h50},
				Series{Name: v + " p99", X: qx, Y: h99})
		}
	}
	if err := write("utilisation-vs-workers.svg", util); err != nil {
		return err
	}
	return write("handoff-vs-queue.svg", hand)
}

// suite runs everything docs/benchmarks.md quotes, in one run, and prints
// Markdown tables.
func (b *bencher) suite() error {
	w := b.stdout
	ctx := context.Background()
	fmt.Fprintf(w, "## Run of %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "Machine: %s; %s\n\n", machine(), redisVersion(ctx, b))

	// 1. Quick benchmark: uncontended cycles next to redis-benchmark's PING rate.
	fmt.Fprintf(w, "### Quick benchmark (uncontended)\n\n")
	fmt.Fprintln(w, "| what | rate | per op | Redis commands per op |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	for _, c := range []int{1, 50} {
		rate, err := redisBenchmarkPing(b.url, c)
		if err != nil {
			fmt.Fprintf(w, "| redis-benchmark PING, %d client(s) | n/a (%v) | | |\n", c, err)
			continue
		}
		fmt.Fprintf(w, "| `redis-benchmark -t ping -c %d` | %.0f PING/s | %.1f µs | 1 |\n", c, rate, 1e6/rate*float64(c))
	}
	rtt, err := PingRTT(ctx, b.client, 500)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "| go-redis PING, 1 goroutine (median RTT) | %.0f PING/s | %.1f µs | 1 |\n", 1e6/us(rtt), us(rtt))
	var quick []runResult
	for _, v := range []string{"unfair", "fair"} {
		r := runResult{Variant: v, PingRTTUs: us(rtt)}
		if err := b.uncontended(ctx, v, &r); err != nil {
			return err
		}
		quick = append(quick, r)
		fmt.Fprintf(w, "| %s TryAcquire+Release, 1 goroutine | %.0f cycles/s | %.1f µs median = %.2f PING RTT | %.2f |\n",
			v, r.UncontendedPerSec, r.UncontendedUs, r.UncontendedOverRTT, r.UncontendedCmdsCycle)
	}
	fmt.Fprintln(w)

	// 2. Contended: limit 5, 50 workers, hold 2ms; all variants, then fair
	// and unfair over 4 processes. With --repeat n each is run n times,
	// round robin (so that a burst of load on the machine hits all
	// variants alike), and the run with the median utilisation is shown.
	specs := []runSpec{
		{variant: "local", procs: 1}, {variant: "fair", procs: 1}, {variant: "unfair", procs: 1},
		{variant: "naive-zset", procs: 1}, {variant: "naive-counter", procs: 1},
		{variant: "fair", procs: 4}, {variant: "unfair", procs: 4},
	}
	runs := make([][]runResult, len(specs))
	for rep := 0; rep < b.f.repeat; rep++ {
		for i, s := range specs {
			s.limit, s.workers, s.hold, s.duration = 5, 50, "2ms", b.f.duration
			s.uncontended = true
			r, err := b.run(s)
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], r)
		}
	}
	var contended []runResult
	for _, rs := range runs {
		contended = append(contended, medianRun(rs))
	}
	fmt.Fprintf(w, "### Contended: limit 5, 50 workers, hold 2ms, %v per run", b.f.duration)
	if b.f.repeat > 1 {
		fmt.Fprintf(w, " (median of %d runs by utilisation)", b.f.repeat)
	}
	fmt.Fprint(w, "\n\n")
	markdownTable(w, contended)
	if b.f.repeat > 1 {
		fmt.Fprintln(w, "| variant | procs | utilisation, every run | p99 / ideal wait, every run | handoff p50 ms, every run | Redis CPU µs / hold, every run |")
		fmt.Fprintln(w, "|---|---:|---|---|---|---|")
		for i, rs := range runs {
			var u, p, h, c []string
			for _, r := range rs {
				u = append(u, fmt.Sprintf("%.3f", r.Utilisation))
				p = append(p, fmt.Sprintf("%.2f", r.WaitP99OverIdeal))
				h = append(h, fmt.Sprintf("%.2f", r.HandoffP50Ms))
				c = append(c, fmt.Sprintf("%.0f", r.RedisCPUUsPerHold))
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s |\n", specs[i].variant, specs[i].procs,
				strings.Join(u, ", "), strings.Join(p, ", "), strings.Join(h, ", "), strings.Join(c, ", "))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "PING round trip and uncontended TryAcquire+Release measured just before each run shown above:")
	fmt.Fprintln(w)
	for _, r := range contended {
		if r.UncontendedUs > 0 {
			fmt.Fprintf(w, "- %s (procs %d): PING %.1f µs; TryAcquire+Release %.1f µs = %.2f PING RTT\n",
				r.Variant, r.Procs, r.PingRTTUs, r.UncontendedUs, r.UncontendedOverRTT)
		}
	}
	fmt.Fprintln(w)

	// 3. Sweep over workers (queue length) for the charts.
	var sweep []sweepPoint
	for _, v := range []string{"local", "fair", "unfair"} {
		for _, n := range []int{10, 25, 50, 100, 200} {
			r, err := b.run(runSpec{variant: v, limit: 5, workers: n, procs: 1, hold: "2ms", duration: b.f.duration * 3 / 5})
			if err != nil {
				return err
			}
			sweep = append(sweep, sweepPoint{variant: v, workers: n, r: r})
		}
	}
	fmt.Fprintf(w, "### Sweep: limit 5, hold 2ms, %v per point\n\n", b.f.duration*3/5)
	var rs []runResult
	for _, p := range sweep {
		rs = append(rs, p.r)
	}
	markdownTable(w, rs)
	if b.f.svgDir != "" {
		return writeCharts(b.f.svgDir, contended, sweep)
	}
	return nil
}

// medianRun returns the run with the median utilisation (the lower middle
// for an even count).
func medianRun(rs []runResult) runResult {
	c := append([]runResult(nil), rs...)
	sort.Slice(c, func(i, j int) bool { return c[i].Utilisation < c[j].Utilisation })
	return c[(len(c)-1)/2]
}

func markdownTable(w io.Writer, rs []runResult) {
	fmt.Fprintln(w, "| variant | procs | workers | holds/s | utilisation | mean hold ms | wait p50 / p90 / p99 / max ms | ideal wait ms | p99 / ideal | handoff p50 / p99 ms | Jain | max holders | cmds / hold | Redis calls / hold | Redis CPU µs / hold | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		cost := "| - | - | -"
		if r.Variant != "local" {
			cost = fmt.Sprintf("| %.2f | %.1f | %.1f", r.CommandsPerHold, r.RedisCallsPerHold, r.RedisCPUUsPerHold)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.0f | %.3f | %.2f | %.1f / %.1f / %.1f / %.1f | %.1f | %.2f | %.2f / %.2f | %.4f | %d %s | %d |\n",
			r.Variant, r.Procs, r.Workers, r.HoldsPerSec, r.Utilisation, r.MeanHoldMs,
			r.WaitP50Ms, r.WaitP90Ms, r.WaitP99Ms, r.WaitMaxMs, r.IdealWaitMs, r.WaitP99OverIdeal,
			r.HandoffP50Ms, r.HandoffP99Ms, r.Jain, r.MaxHolders, cost, r.Errors)
	}
	fmt.Fprintln(w)
	scriptTable(w, rs)
}

// scriptTable prints what each script cost Redis, per variant: calls per
// hold and mean µs per call (SLOWLOG's split, from a run of its own, scaled
// to the measured run's totals), then the mean over all script calls
// (INFO commandstats) and the part of it the scripts' own commands took.
func scriptTable(w io.Writer, rs []runResult) {
	any := false
	for _, r := range rs {
		any = any || r.ScriptCallsPerHold > 0
	}
	if !any {
		return
	}
	fmt.Fprintln(w, "| variant | procs | script | calls / hold | µs / call | µs / hold |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|")
	for _, r := range rs {
		if r.ScriptCallsPerHold == 0 {
			continue
		}
		for _, sc := range r.Scripts {
			fmt.Fprintf(w, "| %s | %d | %s | %.2f | %.1f | %.1f |\n", r.Variant, r.Procs, sc.Script,
				sc.CallsPerHold, sc.UsPerCall, sc.CallsPerHold*sc.UsPerCall)
		}
		fmt.Fprintf(w, "| %s | %d | all (commandstats; inner commands %.1f µs / call) | %.2f | %.1f | %.1f |\n",
			r.Variant, r.Procs, r.InnerUsPerScriptCall, r.ScriptCallsPerHold, r.ScriptUsPerCall,
			r.ScriptCallsPerHold*r.ScriptUsPerCall)
	}
	fmt.Fprintln(w)
}

// redisBenchmarkPing runs redis-benchmark's PING test with c clients and
// returns its requests per second.
func redisBenchmarkPing(url string, c int) (float64, error) {
	host, port := "127.0.0.1", "6379"
	if rest, ok := strings.CutPrefix(url, "redis://"); ok {
		rest, _, _ = strings.Cut(rest, "/")
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			rest = rest[i+1:]
		}
		if h, p, ok := strings.Cut(rest, ":"); ok {
			host, port = h, p
		}
	}
	n := "20000"
	if c > 1 {
		n = "200000"
	}
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-t", "ping", "-c", fmt.Sprint(c),
		"-n", n, "--csv").Output()
	if err != nil {
		return 0, err
	}
	// "test","rps",...  then "PING_INLINE","55555.56",... and "PING_MBULK",...
	var best float64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 2 && strings.HasPrefix(f[0], `"PING_MBULK"`) {
			fmt.Sscanf(strings.Trim(f[1], `"`), "%g", &best)
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no PING_MBULK line in %q", out)
	}
	return best, nil
}

func machine() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model := ""
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			n++
			if _, v, ok := strings.Cut(l, ":"); ok {
				model = strings.TrimSpace(v)
			}
		}
	}
	return fmt.Sprintf("%d x %s", n, model)
}

func redisVersion(ctx context.Context, b *bencher) string {
	s, err := b.client.Info(ctx, "server").Result()
	if err != nil {
		return "redis ?"
	}
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			return "Redis " + v
		}
	}
	return "redis ?"
}
