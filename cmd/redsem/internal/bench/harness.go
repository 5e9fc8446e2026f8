package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/redisinfo"
	"github.com/redsem/redsem/internal/redisproc"
	"github.com/redsem/redsem/unfair"
)

// redisClient is the client the harness measures through: one server (the
// INFO counters it reads are one server's).
type redisClient = *redis.Client

// bencher runs workloads against one Redis.
type bencher struct {
	f              flags
	stdout, stderr io.Writer
	url            string          // what the children get as --redis
	proc           *redisproc.Proc // the throw-away server, if we started it
	client         redisClient
	count          *redisinfo.CommandCounter
	holds          atomic.Int64 // holds so far in the current in-process run
}

// newBencher connects to the Redis the flags name, or, when the user named
// none (given is false), to a throw-away redis-server it starts. A bad
// --redis is returned as a usageErr.
func newBencher(f flags, given bool, stdout, stderr io.Writer) (*bencher, error) {
	// The progress line and the children write to stderr at once.
	b := &bencher{f: f, stdout: stdout, stderr: &lockedWriter{w: stderr}, url: f.redis, count: &redisinfo.CommandCounter{}}
	if f.variants == "local" && !f.suite {
		return b, nil // no Redis needed
	}
	if !given {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := redisproc.Start(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start redis-server (or pass --redis URL): %w", err)
		}
		b.proc = p
		b.url = "redis://" + p.Addr()
	}
	t, err := cli.ParseTarget(b.url)
	if err != nil {
		b.close()
		return nil, usageErr{err}
	}
	if t.Cluster != nil {
		b.close()
		return nil, usageErr{errors.New("the bench measures one server, not a cluster: give one redis:// URL or host:port")}
	}
	b.client = newClient(t, b.count)
	ctx, cancel := cli.OpContext(context.Background())
	defer cancel()
	if err := b.client.Ping(ctx).Err(); err != nil {
		b.close()
		return nil, cli.ReachErr(t, err)
	}
	return b, nil
}

// newClient returns a client of t (one server) that counts its commands in
// count, with a pool large enough for the workers.
func newClient(t *cli.Target, count *redisinfo.CommandCounter) redisClient {
	c := t.ClientWith(func(o *redis.Options) { o.PoolSize = max(o.PoolSize, 64) }).(*redis.Client)
	c.AddHook(count)
	return c
}

func (b *bencher) close() {
	if b.client != nil {
		_ = b.client.Close()
	}
	if b.proc != nil {
		b.proc.Stop()
	}
}

// runResult is one run as printed with --json.
type runResult struct {
	Variant   string  `json:"variant"`
	Limit     int     `json:"limit"`
	Workers   int     `json:"workers"`
	Procs     int     `json:"procs"`
	Hold      string  `json:"hold"`
	Weights   string  `json:"weights,omitempty"` // "A-B" when an acquire may take more than one slot
	DurationS float64 `json:"duration_s"`
	Metrics
	// Rate: with --rate, the grants per window against the rate.
	Rate *RateReport `json:"rate,omitempty"`
	// Client-side count of commands sent (each EVALSHA once) per hold.
	CommandsPerHold float64 `json:"commands_per_hold"`
	// INFO total_commands_processed per hold: includes the commands that
	// scripts run inside Redis.
	RedisCallsPerHold float64 `json:"redis_calls_per_hold"`
	// INFO commandstats evalsha+eval per hold.
	ScriptCallsPerHold float64 `json:"script_calls_per_hold"`
	// INFO commandstats: mean usec per script call (inner commands
	// included), and of that the commands the scripts ran.
	ScriptUsPerCall      float64 `json:"script_us_per_call"`
	InnerUsPerScriptCall float64 `json:"inner_us_per_script_call"`
	// Per script: calls per hold and mean usec per call. SLOWLOG splits
	// the time by script, but at threshold 0 it slows Redis itself (every
	// command a script runs is logged: 20-45% more Redis CPU per hold), so
	// it runs only in a short second run after the measured one (splitRun),
	// whose split is scaled to this run's commandstats totals.
	Scripts           []ScriptCost `json:"scripts,omitempty"`
	RedisCPUUsPerHold float64      `json:"redis_cpu_us_per_hold"`
	PingRTTUs         float64      `json:"ping_rtt_us"`
	// Uncontended TryAcquire+Release (fair and unfair only), on a name of
	// its own before the workload: the median cycle, as a multiple of the
	// PING round trip, cycles per second, and commands per cycle.
	UncontendedUs        float64 `json:"uncontended_us,omitempty"`
	UncontendedOverRTT   float64 `json:"uncontended_over_rtt,omitempty"`
	UncontendedPerSec    float64 `json:"uncontended_cycles_per_s,omitempty"`
	UncontendedCmdsCycle float64 `json:"uncontended_commands_per_cycle,omitempty"`
	Errors               int     `json:"errors"`
	LastError            string  `json:"last_error,omitempty"`

	waits []float64 // sorted, ms; for charts
}

// runSpec is one workload to measure.
type runSpec struct {
	variant        string
	limit, workers int
	procs          int
	hold           string
	weights        Weights
	rate           redsem.Rate // fair and unfair: Options.Rate
	duration       time.Duration
	uncontended    bool
}

func (b *bencher) runAll() error {
	weights, err := ParseWeights(b.f.weights)
	if err != nil {
		return err
	}
	rate, err := b.f.parsedRate()
	if err != nil {
		return err
	}
	var results []runResult
	for _, v := range strings.Split(b.f.variants, ",") {
		r, err := b.run(runSpec{variant: v, limit: b.f.limit, workers: b.f.workers, procs: b.f.procs,
			hold: b.f.hold, weights: weights, rate: rate, duration: b.f.duration, uncontended: true})
		if err != nil {
			return err
		}
		results = append(results, r)
		if b.f.jsonOut {
			if err := jsonLine(b.stdout, r); err != nil {
				return err
			}
		}
	}
	if !b.f.jsonOut {
		printTable(b.stdout, results)
	}
	if b.f.svgDir != "" {
		return writeCharts(b.f.svgDir, results, nil)
	}
	return nil
}

// jsonLine writes v as one line of JSON.
func jsonLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

func randomName(prefix string) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// run measures one workload.
func (b *bencher) run(s runSpec) (runResult, error) {
	ctx := context.Background()
	if s.weights.Min == 0 {
		s.weights = Weights{1, 1}
	}
	r := runResult{Variant: s.variant, Limit: s.limit, Workers: s.workers, Procs: s.procs,
		Hold: s.hold, DurationS: s.duration.Seconds()}
	if s.weights.Weighted() {
		r.Weights = s.weights.String()
	}
	hold, err := ParseHold(s.hold)
	if err != nil {
		return r, err
	}
	name := randomName("bench-" + s.variant)
	if s.variant != "local" {
		rtt, err := PingRTT(ctx, b.client, 200)
		if err != nil {
			return r, err
		}
		r.PingRTTUs = us(rtt)
		if s.uncontended && (s.variant == "fair" || s.variant == "unfair") {
			if err := b.uncontended(ctx, s.variant, &r); err != nil {
				return r, err
			}
		}
	}
	var before redisinfo.ServerStats
	if s.variant != "local" {
		if before, err = redisinfo.ReadStats(ctx, b.client); err != nil {
			return r, err
		}
	}
	lead := 200 * time.Millisecond
	if s.procs > 1 {
		lead = 1500 * time.Millisecond // children start and connect
	}
	start := time.Now().Add(lead)
	end := start.Add(s.duration)
	stopProgress := b.progress(s, start, end)
	var tr Trace
	if s.procs == 1 {
		tr, err = b.inProcess(s, name, hold, start, end)
	} else {
		tr, err = b.children(s, name, start, end)
	}
	stopProgress(tr.Errors)
	if err != nil {
		return r, err
	}
	if s.variant != "local" {
		after, err := redisinfo.ReadStats(ctx, b.client)
		if err != nil {
			return r, err
		}
		d := after.Sub(before)
		d.Commands-- // the INFO that took the first snapshot
		if n := float64(len(tr.Records)); n > 0 {
			r.CommandsPerHold = float64(tr.Commands) / n
			r.RedisCallsPerHold = float64(d.Commands) / n
			r.ScriptCallsPerHold = float64(d.ScriptCalls) / n
			if d.ScriptCalls > 0 {
				r.ScriptUsPerCall = float64(d.ScriptUsec) / float64(d.ScriptCalls)
				r.InnerUsPerScriptCall = float64(d.OtherUsec) / float64(d.ScriptCalls)
			}
			r.RedisCPUUsPerHold = d.CPU * 1e6 / n
		}
		if s.variant == "naive-counter" {
			_ = b.client.Del(ctx, naiveKey(b.f.prefix, s.variant, name)).Err()
		}
		if r.ScriptCallsPerHold > 0 {
			if r.Scripts, err = b.splitRun(s, hold); err != nil {
				return r, err
			}
			scaleScripts(r.Scripts, r.ScriptCallsPerHold, r.ScriptCallsPerHold*r.ScriptUsPerCall)
		}
	}
	r.Metrics = Analyze(tr.Records, s.limit, s.workers, start.UnixNano(), end.UnixNano())
	if !s.rate.IsZero() {
		r.Rate = RateOf(tr.Records, s.rate, start.UnixNano(), end.UnixNano())
	}
	r.Errors, r.LastError = tr.Errors, tr.LastErr
	for _, rec := range tr.Records {
		r.waits = append(r.waits, float64(rec.Got-rec.Start)/1e6)
	}
	sort.Float64s(r.waits)
	if r.MaxHolders > s.limit {
		fmt.Fprintf(b.stderr, "redsem bench: %s: %d slots held at once, limit %d: SAFETY VIOLATION\n", s.variant, r.MaxHolders, s.limit)
	}
	return r, nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// splitRunLength is how long splitRun runs the workload.
const splitRunLength = 500 * time.Millisecond

// splitRun runs the workload of s again, in this process, for
// splitRunLength on a name of its own, with SLOWLOG timing every command,
// and returns what each script cost per hold in it (nil when the server
// refuses CONFIG SET). Its figures are SLOWLOG's, which slows Redis: run
// only for the split, after the measured run.
func (b *bencher) splitRun(s runSpec, hold Hold) ([]ScriptCost, error) {
	ctx := context.Background()
	s.procs = 1
	slog := startScriptLog(ctx, b.client)
	start := time.Now().Add(100 * time.Millisecond)
	tr, err := b.inProcess(s, randomName("bench-split-"+s.variant), hold, start, start.Add(splitRunLength))
	if err != nil {
		slog.stop(ctx, 0)
		return nil, err
	}
	return slog.stop(ctx, len(tr.Records)), nil
}

// scaleScripts scales a split by script (from splitRun) to the totals of
// the measured run: calls per hold summing to calls, and µs per hold
// summing to usPerHold, keeping the split's proportions.
func scaleScripts(sc []ScriptCost, calls, usPerHold float64) {
	var n, t float64
	for _, c := range sc {
		n += c.CallsPerHold
	}
	if n == 0 {
		return
	}
	for i := range sc {
		sc[i].CallsPerHold *= calls / n
		t += sc[i].CallsPerHold * sc[i].UsPerCall
	}
	if t == 0 {
		return
	}
	for i := range sc {
		sc[i].UsPerCall *= usPerHold / t
	}
}

// uncontended measures TryAcquire+Release cycles on a name nobody else uses.
func (b *bencher) uncontended(ctx context.Context, variant string, r *runResult) error {
	name := randomName("bench-uncontended-" + variant)
	var s redsem.Semaphore
	var err error
	if variant == "fair" {
		s, err = fair.New(b.client, name, 1, fair.Options{KeyPrefix: b.f.prefix})
	} else {
		s, err = unfair.New(b.client, name, 1, unfair.Options{KeyPrefix: b.f.prefix})
	}
	if err != nil {
		return err
	}
	defer s.Close()
	const n = 500
	c0 := b.count.N()
	med, _, perSec, err := Uncontended(ctx, s, n)
	if err != nil {
		return err
	}
	r.UncontendedUs = us(med)
	r.UncontendedPerSec = perSec
	r.UncontendedCmdsCycle = float64(b.count.N()-c0) / (n + 5)
	if r.PingRTTUs > 0 {
		r.UncontendedOverRTT = r.UncontendedUs / r.PingRTTUs
	}
	return nil
}

func (b *bencher) inProcess(s runSpec, name string, hold Hold, start, end time.Time) (Trace, error) {
	var client redisClient
	if s.variant != "local" {
		client = b.client
	}
	sem, err := NewSem(s.variant, client, name, s.limit, SemOptions{NaiveRetry: b.f.naiveRetry, KeyPrefix: b.f.prefix, Rate: s.rate})
	if err != nil {
		return Trace{}, err
	}
	defer sem.Close()
	c0 := b.count.N()
	tr := RunWorkers(Workload{Sem: sem, Workers: s.workers, Hold: hold, Weights: s.weights,
		Start: start, End: end, Seed: b.f.seed, Progress: &b.holds, GoSleep: b.f.goSleep})
	tr.Commands = b.count.N() - c0
	return tr, nil
}

// children runs the workers in s.procs child processes (this executable,
// re-run with ChildCommand --child) and merges their traces.
func (b *bencher) children(s runSpec, name string, start, end time.Time) (Trace, error) {
	exe, err := os.Executable()
	if err != nil {
		return Trace{}, err
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		merged Trace
		errs   []error
	)
	base := 0
	for p := 0; p < s.procs; p++ {
		n := s.workers / s.procs
		if p < s.workers%s.procs {
			n++
		}
		args := []string{ChildCommand, "--child", "--redis", b.url, "--prefix", b.f.prefix, "--variant", s.variant,
			"--name", name, "--limit", strconv.Itoa(s.limit), "--workers", strconv.Itoa(n),
			"--worker-base", strconv.Itoa(base), "--hold", s.hold, "--weights", s.weights.String(), "--rate", s.rate.String(),
			"--start-ns", strconv.FormatInt(start.UnixNano(), 10), "--end-ns", strconv.FormatInt(end.UnixNano(), 10),
			"--seed", strconv.FormatUint(b.f.seed+uint64(p)*1000003, 10), "--naive-retry", b.f.naiveRetry.String()}
		if b.f.goSleep {
			args = append(args, "--go-sleep")
		}
		base += n
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(exe, args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, b.stderr
			err := cmd.Run()
			var tr Trace
			if err == nil {
				err = json.Unmarshal(out.Bytes(), &tr)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("child: %w", err))
				return
			}
			merged.Records = append(merged.Records, tr.Records...)
			merged.Commands += tr.Commands
			merged.Errors += tr.Errors
			merged.Workers += tr.Workers
			if tr.LastErr != "" {
				merged.LastErr = tr.LastErr
			}
		}()
	}
	wg.Wait()
	return merged, errors.Join(errs...)
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write writes p to w, one call at a time.
func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
