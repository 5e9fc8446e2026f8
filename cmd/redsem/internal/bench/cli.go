package bench

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/redisinfo"
)

// ChildCommand is the argument a --procs run puts before "--child" when it
// re-executes its own executable: the executable must hand the arguments
// after it to Main (cmd/redsem does, as "redsem bench").
const ChildCommand = "bench"

// flags are the flags of "redsem bench".
type flags struct {
	redis      string // --redis, or a throw-away server's URL
	prefix     string
	variants   string
	limit      int
	workers    int
	procs      int
	hold       string
	weights    string
	rate       string // --rate LIMIT/PER ("" or "none": no rate)
	duration   time.Duration
	naiveRetry time.Duration
	jsonOut    bool
	svgDir     string
	suite      bool
	repeat     int
	quiet      bool
	family     int // --family TOTAL: the family workload (family.go)
	cpuProfile string
	goSleep    bool // holds sleep with time.Sleep, not a timerfd (holder.go)

	// child mode: run a share of the workers and print a Trace.
	child      bool
	name       string
	workerBase int
	startNs    int64
	endNs      int64
	seed       uint64
}

const about = `Runs workers that loop acquire, hold, release on one semaphore and reports
holds/s, slot utilisation (slot-time held / (limit x elapsed)), waits next to
the ideal FIFO wait, handoff latency, Jain's fairness index, Redis commands
and CPU per hold, the most slots held at once, and the PING round trip
with the uncontended TryAcquire+Release cost as a multiple of it.

Per script it reports calls per hold and the mean time Redis spent in one
call (inner commands included). The measured run leaves SLOWLOG alone (at
threshold 0 it slows Redis by a fifth or more); a second run of 0.5 s with
SLOWLOG timing every command splits the time by script, scaled to the
measured run's INFO commandstats totals (its threshold is restored after;
a server that refuses CONFIG SET gets only the commandstats mean over all
scripts).

Variants: fair, unfair, local (an in-process channel semaphore: the
ceiling), naive-counter (INCR/DECR, fixed retry), naive-zset (the textbook
sorted set, fixed retry), floor (the leanest scripts that keep a lease's
records, on go-redis without redsem: the ceiling of the uncontended
cycle; fixed retry). A comma list runs each in turn.

Without --redis or $REDIS_URL it starts a throw-away redis-server from PATH.
--procs N spreads the workers over N child processes (this executable
re-run with --child). --weights A-B makes each acquire take a random number
of slots in [A, B] (variants with AcquireN, and local).

--family TOTAL runs the family workload instead (fair, unfair): a keyed
family of members of --limit slots each and TOTAL in all
(FamilyOptions.Total), a hot tenant with all the workers but two and a cold
tenant with two; it reports how much of the total was used, each tenant's
holds and mean wait, and the cost of a hold (acquire + release, one at a
time) next to the same run's family without a total.

--suite runs the whole set behind docs/benchmarks.md (quick benchmark,
contended comparison, sweeps), prints Markdown tables and, with --svg,
writes the charts.`

// Main runs "redsem bench" with args (after the command's name) and returns
// the exit code: 0 ok, 1 a run failed, 2 usage error. With --child it is one
// worker process of a --procs run and prints its Trace as JSON on stdout.
func Main(args []string, stdout, stderr io.Writer) int {
	c := cli.New("bench", "[flags]", about, stdout, stderr)
	c.OwnServerByDefault("a throw-away redis-server from PATH")
	var f flags
	fs := c.FS
	fs.StringVar(&f.variants, "variant", "fair", "fair | unfair | local | naive-counter | naive-zset | floor, or a comma list")
	fs.IntVar(&f.limit, "limit", 5, "slots")
	fs.IntVar(&f.workers, "workers", 50, "workers in total (spread over --procs processes)")
	fs.IntVar(&f.procs, "procs", 1, "OS processes to spread the workers over")
	fs.StringVar(&f.hold, "hold", "2ms", "hold time: fixed (2ms), exp:MEAN or uniform:MIN-MAX")
	fs.StringVar(&f.weights, "weights", "1-1", "slots per acquire: a random whole number in A-B (or one number)")
	fs.StringVar(&f.rate, "rate", "", "fair and unfair: also bound grants to `LIMIT/PER` (Options.Rate, e.g. 100/1s) and report the grants per window against it")
	fs.DurationVar(&f.duration, "duration", 5*time.Second, "length of each run")
	fs.DurationVar(&f.naiveRetry, "naive-retry", 100*time.Millisecond, "retry interval of the naive baselines and the floor")
	fs.BoolVar(&f.jsonOut, "json", false, "print one JSON object per run instead of a table")
	fs.StringVar(&f.svgDir, "svg", "", "write SVG charts to this directory")
	fs.BoolVar(&f.suite, "suite", false, "run the docs/benchmarks.md suite")
	fs.IntVar(&f.family, "family", 0, "run the family workload with this `TOTAL` (FamilyOptions.Total): a hot and a cold tenant of --limit each")
	fs.IntVar(&f.repeat, "repeat", 1, "--suite: run each contended workload this many times and show the median")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the hold and weight draws")
	fs.BoolVar(&f.goSleep, "go-sleep", false, "holds of 1 ms or more sleep with time.Sleep (the Go runtime's timers: a millisecond's grain under network load) instead of a timerfd (Linux)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write this process's CPU profile (all runs, the client side only) to `FILE`, for go tool pprof")
	fs.BoolVar(&f.child, "child", false, "internal: run as a worker process of --procs")
	fs.StringVar(&f.name, "name", "", "internal: semaphore name (child)")
	fs.IntVar(&f.workerBase, "worker-base", 0, "internal: first worker index (child)")
	fs.Int64Var(&f.startNs, "start-ns", 0, "internal: start, Unix ns (child)")
	fs.Int64Var(&f.endNs, "end-ns", 0, "internal: end, Unix ns (child)")
	if _, code, stop := c.Parse(args, 0, "no arguments"); stop {
		return code
	}
	f.redis, f.prefix = c.Redis, c.Prefix
	if err := f.validate(); err != nil {
		return c.UsageError("%v", err)
	}
	if f.child {
		if err := runChild(f, stdout); err != nil {
			return c.Fail(fmt.Errorf("child: %w", err))
		}
		return cli.ExitOK
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return c.Fail(err)
		}
		defer stop()
	}
	_, given := c.RedisGiven()
	b, err := newBencher(f, given, stdout, stderr)
	if err != nil {
		var u usageErr
		if errors.As(err, &u) {
			return c.UsageError("%v", u.err)
		}
		return c.Fail(err)
	}
	defer b.close()
	switch {
	case f.family > 0:
		err = b.familyRuns()
	case f.suite:
		err = b.suite()
	default:
		err = b.runAll()
	}
	if err != nil {
		return c.Fail(err)
	}
	return cli.ExitOK
}

// startCPUProfile starts the CPU profile into path and returns what stops it.
func startCPUProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

// usageErr marks an error in what the user asked for (reported with exit
// code 2), as opposed to a failure while running.
type usageErr struct{ err error }

// Error is the wrapped error's text.
func (u usageErr) Error() string { return u.err.Error() }

// validate checks the flags' values against each other.
func (f *flags) validate() error {
	switch {
	case f.limit < 1:
		return fmt.Errorf("--limit %d: want >= 1", f.limit)
	case f.workers < 1:
		return fmt.Errorf("--workers %d: want >= 1", f.workers)
	case f.procs < 1 || f.procs > f.workers:
		return fmt.Errorf("--procs %d: want 1..workers", f.procs)
	case f.repeat < 1:
		return fmt.Errorf("--repeat %d: want >= 1", f.repeat)
	case f.duration <= 0:
		return fmt.Errorf("--duration %v: want > 0", f.duration)
	case f.family < 0:
		return fmt.Errorf("--family %d: want a total >= 1", f.family)
	case f.family > 0 && (f.suite || f.procs > 1 || f.workers < 2):
		return errors.New("--family runs in one process, not with --suite, and needs --workers >= 2")
	}
	if f.family > 0 {
		for _, v := range strings.Split(f.variants, ",") {
			if v != "fair" && v != "unfair" {
				return fmt.Errorf("--family: variant %s has no families (fair and unfair do)", v)
			}
		}
	}
	if _, err := ParseHold(f.hold); err != nil {
		return err
	}
	w, err := ParseWeights(f.weights)
	if err != nil {
		return err
	}
	if w.Max > f.limit {
		return fmt.Errorf("--weights %s: more than --limit %d slots", f.weights, f.limit)
	}
	for _, v := range strings.Split(f.variants, ",") {
		if !knownVariant(v) {
			return fmt.Errorf("--variant %q: want one of %s", v, strings.Join(Variants, ", "))
		}
		if v == "local" && f.procs > 1 && !f.suite {
			return errors.New("--variant local runs in one process: use --procs 1")
		}
		if w.Weighted() && !Weighable(v) {
			return fmt.Errorf("--weights %s: variant %s cannot acquire more than one slot at once (it has no AcquireN)", f.weights, v)
		}
	}
	if f.suite && w.Weighted() {
		return errors.New("--weights does not apply to --suite")
	}
	rate, err := f.parsedRate()
	if err != nil {
		return err
	}
	if !rate.IsZero() {
		if f.suite {
			return errors.New("--rate does not apply to --suite")
		}
		for _, v := range strings.Split(f.variants, ",") {
			if v != "fair" && v != "unfair" {
				return fmt.Errorf("--rate: variant %s has no rate (fair and unfair do)", v)
			}
		}
		if w.Max > rate.Limit {
			return fmt.Errorf("--weights %s: more than the rate's %d slots per window", f.weights, rate.Limit)
		}
	}
	return nil
}

// parsedRate is --rate, validated and with its period rounded as the
// semaphores round it.
func (f *flags) parsedRate() (redsem.Rate, error) {
	r, err := redsem.ParseRate(f.rate)
	if err != nil {
		return r, fmt.Errorf("--rate: %w", err)
	}
	return core.CheckRate("--rate", r)
}

func knownVariant(v string) bool {
	for _, k := range Variants {
		if k == v {
			return true
		}
	}
	return false
}

// Weights is how many slots each acquire takes: a whole number drawn
// uniformly from [Min, Max].
type Weights struct{ Min, Max int }

// ParseWeights parses "A-B" (1 <= A <= B) or "A" (always A).
func ParseWeights(s string) (Weights, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, errA := strconv.Atoi(strings.TrimSpace(lo))
	b, errB := strconv.Atoi(strings.TrimSpace(hi))
	if errA != nil || errB != nil || a < 1 || b < a {
		return Weights{}, fmt.Errorf("bench: bad weights %q: want A-B with 1 <= A <= B, e.g. 1-3", s)
	}
	return Weights{Min: a, Max: b}, nil
}

// Weighted reports whether an acquire may take more than one slot.
func (w Weights) Weighted() bool { return w.Max > 1 }

// Sample draws one weight; the zero Weights draws 1.
func (w Weights) Sample(r *rand.Rand) int {
	if w.Max <= w.Min {
		return max(w.Min, 1)
	}
	return w.Min + r.IntN(w.Max-w.Min+1)
}

// String is the form ParseWeights reads.
func (w Weights) String() string { return fmt.Sprintf("%d-%d", w.Min, w.Max) }

// runChild is one worker process of a --procs run: it prints its trace as JSON.
func runChild(f flags, stdout io.Writer) error {
	hold, err := ParseHold(f.hold)
	if err != nil {
		return err
	}
	weights, err := ParseWeights(f.weights)
	if err != nil {
		return err
	}
	count := &redisinfo.CommandCounter{}
	var client redisClient
	if f.variants != "local" {
		t, err := cli.ParseTarget(f.redis)
		if err != nil {
			return err
		}
		client = newClient(t, count)
		defer client.Close()
	}
	rate, err := f.parsedRate()
	if err != nil {
		return err
	}
	sem, err := NewSem(f.variants, client, f.name, f.limit, SemOptions{NaiveRetry: f.naiveRetry, KeyPrefix: f.prefix, Rate: rate})
	if err != nil {
		return err
	}
	defer sem.Close()
	tr := RunWorkers(Workload{Sem: sem, Workers: f.workers, WorkerBase: f.workerBase, Hold: hold, Weights: weights,
		Start: time.Unix(0, f.startNs), End: time.Unix(0, f.endNs), Seed: f.seed, GoSleep: f.goSleep})
	tr.Commands = count.N()
	return jsonLine(stdout, tr)
}
