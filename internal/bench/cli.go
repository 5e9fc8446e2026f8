package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
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
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/bench"
	"github.com/redsem/redsem/internal/redisproc"
	"github.com/redsem/redsem/unfair"
)

// benchFlags are the flags of "redsem bench".
type benchFlags struct {
	redisURL   string
	variants   string
	limit      int
	workers    int
	procs      int
	hold       string
	duration   time.Duration
	naiveRetry time.Duration
	jsonOut    bool
	svgDir     string
	suite      bool
	repeat     int
	quiet      bool
	validated  bool // the flags parsed; later errors are validation errors

	// child mode: run a share of the workers and print a bench.Trace.
	child      bool
	name       string
	workerBase int
	startNs    int64
	endNs      int64
	seed       uint64
}

const benchUsage = `usage: redsem bench [flags]

Runs workers that loop acquire, hold, release on one semaphore and reports
holds/s, slot utilisation (measured holds / (limit x elapsed)), waits next to
the ideal FIFO wait, handoff latency, Jain's fairness index, Redis commands
and CPU per hold, the most holders seen at once, and the PING round trip
with the uncontended TryAcquire+Release cost as a multiple of it.

Variants: fair, unfair, local (an in-process channel semaphore: the
ceiling), naive-counter (INCR/DECR, fixed retry), naive-zset (the seed's
sorted set, fixed retry). A comma list runs each in turn.

--suite runs the whole set behind docs/benchmarks.md (quick benchmark,
contended comparison, sweeps), prints Markdown tables and, with --svg,
writes the charts.

flags:
`

func parseBenchFlags(args []string, stderr io.Writer) (benchFlags, *flag.FlagSet, error) {
	var f benchFlags
	fs := flag.NewFlagSet("redsem bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.redisURL, "redis", "", "Redis URL (redis://host:port/db); default: start a throw-away redis-server from PATH")
	fs.StringVar(&f.variants, "variant", "fair", "fair | unfair | local | naive-counter | naive-zset, or a comma list")
	fs.IntVar(&f.limit, "limit", 5, "slots")
	fs.IntVar(&f.workers, "workers", 50, "workers in total (spread over --procs processes)")
	fs.IntVar(&f.procs, "procs", 1, "OS processes to spread the workers over")
	fs.StringVar(&f.hold, "hold", "2ms", "hold time: fixed (2ms), exp:MEAN or uniform:MIN-MAX")
	fs.DurationVar(&f.duration, "duration", 5*time.Second, "length of each run")
	fs.DurationVar(&f.naiveRetry, "naive-retry", 100*time.Millisecond, "retry interval of the naive baselines")
	fs.BoolVar(&f.jsonOut, "json", false, "print one JSON object per run instead of a table")
	fs.StringVar(&f.svgDir, "svg", "", "write SVG charts to this directory")
	fs.BoolVar(&f.suite, "suite", false, "run the docs/benchmarks.md suite")
	fs.IntVar(&f.repeat, "repeat", 1, "--suite: run each contended workload this many times and show the median")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line")
	fs.BoolVar(&f.child, "child", false, "internal: run as a worker process")
	fs.StringVar(&f.name, "name", "", "internal: semaphore name (child)")
	fs.IntVar(&f.workerBase, "worker-base", 0, "internal: first worker index (child)")
	fs.Int64Var(&f.startNs, "start-ns", 0, "internal: start, Unix ns (child)")
	fs.Int64Var(&f.endNs, "end-ns", 0, "internal: end, Unix ns (child)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the hold distribution")
	if err := fs.Parse(args); err != nil {
		return f, fs, err
	}
	f.validated = true // errors from here on are ours to print
	if fs.NArg() > 0 {
		return f, fs, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case f.limit < 1:
		return f, fs, fmt.Errorf("--limit %d: want >= 1", f.limit)
	case f.workers < 1:
		return f, fs, fmt.Errorf("--workers %d: want >= 1", f.workers)
	case f.procs < 1 || f.procs > f.workers:
		return f, fs, fmt.Errorf("--procs %d: want 1..workers", f.procs)
	case f.repeat < 1:
		return f, fs, fmt.Errorf("--repeat %d: want >= 1", f.repeat)
	case f.duration <= 0:
		return f, fs, fmt.Errorf("--duration %v: want > 0", f.duration)
	}
	if _, err := bench.ParseHold(f.hold); err != nil {
		return f, fs, err
	}
	for _, v := range strings.Split(f.variants, ",") {
		if !knownVariant(v) {
			return f, fs, fmt.Errorf("--variant %q: want one of %s", v, strings.Join(bench.Variants, ", "))
		}
		if v == "local" && f.procs > 1 && !f.suite {
			return f, fs, errors.New("--variant local runs in one process: use --procs 1")
		}
	}
	return f, fs, nil
}

func knownVariant(v string) bool {
	for _, k := range bench.Variants {
		if k == v {
			return true
		}
	}
	return false
}

func runBench(args []string, stdout, stderr io.Writer) int {
	f, fs, err := parseBenchFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if fs.Parsed() && err != nil && !f.validated {
		return 2 // the flag package has printed the error and the usage
	}
	if err != nil {
		fmt.Fprintf(stderr, "redsem bench: %v\n", err)
		fs.Usage()
		return 2
	}
	if f.child {
		if err := runChild(f, stdout); err != nil {
			fmt.Fprintf(stderr, "redsem bench child: %v\n", err)
			return 1
		}
		return 0
	}
	b, err := newBencher(f, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "redsem bench: %v\n", err)
		return 1
	}
	defer b.close()
	if f.suite {
		err = b.suite()
	} else {
		err = b.runAll()
	}
	if err != nil {
		fmt.Fprintf(stderr, "redsem bench: %v\n", err)
		return 1
	}
	return 0
}

// bencher runs workloads against one Redis.
type bencher struct {
	f              benchFlags
	stdout, stderr io.Writer
	url            string
	proc           *redisproc.Proc // the throw-away server, if we started it
	client         *redis.Client
	count          *bench.CommandCounter
	holds          atomic.Int64 // holds so far in the current in-process run
}

func newBencher(f benchFlags, stdout, stderr io.Writer) (*bencher, error) {
	// The progress line and the children write to stderr at once.
	b := &bencher{f: f, stdout: stdout, stderr: &lockedWriter{w: stderr}, url: f.redisURL, count: &bench.CommandCounter{}}
	if f.variants == "local" && !f.suite {
		return b, nil // no Redis needed
	}
	if b.url == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p, err := redisproc.Start(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start redis-server (or pass --redis URL): %w", err)
		}
		b.proc = p
		b.url = "redis://" + p.Addr()
	}
	c, err := newClient(b.url, b.count)
	if err != nil {
		b.close()
		return nil, err
	}
	b.client = c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.close()
		return nil, fmt.Errorf("redis %s: %w", b.url, err)
	}
	return b, nil
}

func newClient(url string, count *bench.CommandCounter) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("--redis %q: %w", url, err)
	}
	opt.PoolSize = max(opt.PoolSize, 64)
	c := redis.NewClient(opt)
	c.AddHook(count)
	return c, nil
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
	DurationS float64 `json:"duration_s"`
	bench.Metrics
	// Client-side count of commands sent (each EVALSHA once) per hold.
	CommandsPerHold float64 `json:"commands_per_hold"`
	// INFO total_commands_processed per hold: includes the commands that
	// scripts run inside Redis.
	RedisCallsPerHold float64 `json:"redis_calls_per_hold"`
	// INFO commandstats evalsha+eval per hold.
	ScriptCallsPerHold float64 `json:"script_calls_per_hold"`
	RedisCPUUsPerHold  float64 `json:"redis_cpu_us_per_hold"`
	PingRTTUs          float64 `json:"ping_rtt_us"`
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

type runSpec struct {
	variant        string
	limit, workers int
	procs          int
	hold           string
	duration       time.Duration
	uncontended    bool
}

func (b *bencher) runAll() error {
	var results []runResult
	for _, v := range strings.Split(b.f.variants, ",") {
		r, err := b.run(runSpec{variant: v, limit: b.f.limit, workers: b.f.workers, procs: b.f.procs,
			hold: b.f.hold, duration: b.f.duration, uncontended: true})
		if err != nil {
			return err
		}
		results = append(results, r)
		if b.f.jsonOut {
			if err := json.NewEncoder(b.stdout).Encode(r); err != nil {
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

func randomName(prefix string) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// run measures one workload.
func (b *bencher) run(s runSpec) (runResult, error) {
	ctx := context.Background()
	r := runResult{Variant: s.variant, Limit: s.limit, Workers: s.workers, Procs: s.procs,
		Hold: s.hold, DurationS: s.duration.Seconds()}
	hold, err := bench.ParseHold(s.hold)
	if err != nil {
		return r, err
	}
	name := randomName("bench-" + s.variant)
	if s.variant != "local" {
		rtt, err := bench.PingRTT(ctx, b.client, 200)
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
	var before bench.ServerStats
	if s.variant != "local" {
		if before, err = bench.ReadStats(ctx, b.client); err != nil {
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
	var tr bench.Trace
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
		after, err := bench.ReadStats(ctx, b.client)
		if err != nil {
			return r, err
		}
		d := after.Sub(before)
		d.Commands-- // the INFO that took the first snapshot
		if n := float64(len(tr.Records)); n > 0 {
			r.CommandsPerHold = float64(tr.Commands) / n
			r.RedisCallsPerHold = float64(d.Commands) / n
			r.ScriptCallsPerHold = float64(d.ScriptCalls) / n
			r.RedisCPUUsPerHold = d.CPU * 1e6 / n
		}
		if s.variant == "naive-counter" {
			_ = b.client.Del(ctx, "bench:naive-counter:{"+name+"}").Err()
		}
	}
	r.Metrics = bench.Analyze(tr.Records, s.limit, s.workers, start.UnixNano(), end.UnixNano())
	r.Errors, r.LastError = tr.Errors, tr.LastErr
	for _, rec := range tr.Records {
		r.waits = append(r.waits, float64(rec.Got-rec.Start)/1e6)
	}
	sort.Float64s(r.waits)
	if r.MaxHolders > s.limit {
		fmt.Fprintf(b.stderr, "redsem bench: %s: %d holders seen at once, limit %d: SAFETY VIOLATION\n", s.variant, r.MaxHolders, s.limit)
	}
	return r, nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// uncontended measures TryAcquire+Release cycles on a name nobody else uses.
func (b *bencher) uncontended(ctx context.Context, variant string, r *runResult) error {
	name := randomName("bench-uncontended-" + variant)
	var s redsem.Semaphore
	if variant == "fair" {
		fs, err := fair.New(b.client, name, 1, fair.Options{})
		if err != nil {
			return err
		}
		defer fs.Close()
		s = fs
	} else {
		us, err := unfair.New(b.client, name, 1, unfair.Options{})
		if err != nil {
			return err
		}
		defer us.Close()
		s = us
	}
	const n = 500
	c0 := b.count.N()
	med, _, perSec, err := bench.Uncontended(ctx, s, n)
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

func (b *bencher) inProcess(s runSpec, name string, hold bench.Hold, start, end time.Time) (bench.Trace, error) {
	var client redis.UniversalClient
	if s.variant != "local" {
		client = b.client
	}
	sem, err := bench.NewSem(s.variant, client, name, s.limit, bench.SemOptions{NaiveRetry: b.f.naiveRetry})
	if err != nil {
		return bench.Trace{}, err
	}
	defer sem.Close()
	c0 := b.count.N()
	tr := bench.RunWorkers(bench.Workload{Sem: sem, Workers: s.workers, Hold: hold,
		Start: start, End: end, Seed: b.f.seed, Progress: &b.holds})
	tr.Commands = b.count.N() - c0
	return tr, nil
}

// children runs the workers in s.procs child processes (this executable,
// re-run with --child) and merges their traces.
func (b *bencher) children(s runSpec, name string, start, end time.Time) (bench.Trace, error) {
	exe, err := os.Executable()
	if err != nil {
		return bench.Trace{}, err
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		merged bench.Trace
		errs   []error
	)
	base := 0
	for p := 0; p < s.procs; p++ {
		n := s.workers / s.procs
		if p < s.workers%s.procs {
			n++
		}
		args := []string{"bench", "--child", "--redis", b.url, "--variant", s.variant, "--name", name,
			"--limit", strconv.Itoa(s.limit), "--workers", strconv.Itoa(n), "--worker-base", strconv.Itoa(base),
			"--hold", s.hold, "--start-ns", strconv.FormatInt(start.UnixNano(), 10),
			"--end-ns", strconv.FormatInt(end.UnixNano(), 10), "--seed", strconv.FormatUint(b.f.seed+uint64(p)*1000003, 10),
			"--naive-retry", b.f.naiveRetry.String()}
		base += n
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(exe, args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, b.stderr
			err := cmd.Run()
			var tr bench.Trace
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

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// runChild is one worker process of a --procs run: it prints its trace as JSON.
func runChild(f benchFlags, stdout io.Writer) error {
	if f.redisURL == "" && f.variants != "local" {
		return errors.New("--child needs --redis")
	}
	hold, err := bench.ParseHold(f.hold)
	if err != nil {
		return err
	}
	count := &bench.CommandCounter{}
	var client redis.UniversalClient
	if f.variants != "local" {
		c, err := newClient(f.redisURL, count)
		if err != nil {
			return err
		}
		defer c.Close()
		client = c
	}
	sem, err := bench.NewSem(f.variants, client, f.name, f.limit, bench.SemOptions{NaiveRetry: f.naiveRetry})
	if err != nil {
		return err
	}
	defer sem.Close()
	tr := bench.RunWorkers(bench.Workload{Sem: sem, Workers: f.workers, WorkerBase: f.workerBase, Hold: hold,
		Start: time.Unix(0, f.startNs), End: time.Unix(0, f.endNs), Seed: f.seed})
	tr.Commands = count.N()
	return json.NewEncoder(stdout).Encode(tr)
}
