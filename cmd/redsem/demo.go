package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cmd/redsem/internal/bench"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/redisproc"
	"github.com/redsem/redsem/unfair"
)

// demoConfig is what the demo's flags set.
type demoConfig struct {
	duration       time.Duration
	instances      int
	workers        int
	limit          int
	hold           time.Duration
	refresh        time.Duration
	acquireTimeout time.Duration
}

// worker names worker i of all instances' workers: "i1.w2" is instance 1's
// worker 2.
func (cfg demoConfig) worker(i int) string {
	return fmt.Sprintf("i%d.w%d", i/cfg.workers, i%cfg.workers)
}

const demoAbout = `Runs simulated service instances (goroutines, each with its own Redis client)
that share one global limit, on a fair and an unfair semaphore side by side;
shows live who holds which slot, the queue and the tokens; then reports
utilisation, waits and fairness, and shows a paused holder (a zombie)
rejected by per-slot fencing. It uses --redis or REDIS_URL if given, else
starts a throw-away redis-server from PATH (stopped at the end), else runs
on an in-process miniredis (and says so). It removes its keys when done.`

func runDemo(args []string, stdout, stderr io.Writer) int {
	c := newCommand("demo", "[flags]", demoAbout, stdout, stderr)
	c.OwnServerByDefault("a throw-away redis-server from PATH, else an in-process miniredis")
	var cfg demoConfig
	c.FS.DurationVar(&cfg.duration, "duration", 12*time.Second, "how long the simulated load runs (the fencing part adds ~2s)")
	c.FS.IntVar(&cfg.instances, "instances", 3, "simulated service instances per variant")
	c.FS.IntVar(&cfg.workers, "workers", 4, "workers per instance")
	c.FS.IntVar(&cfg.limit, "limit", 3, "the global limit")
	c.FS.DurationVar(&cfg.hold, "hold", 250*time.Millisecond, "mean time a worker holds a slot")
	c.FS.DurationVar(&cfg.refresh, "refresh", time.Second, "time between live views")
	c.FS.DurationVar(&cfg.acquireTimeout, "acquire-timeout", 5*time.Second, "a worker gives up waiting after this long (counted as a timeout)")
	if _, code, stop := c.Parse(args, 0, "no arguments"); stop {
		return code
	}
	if cfg.duration <= 0 || cfg.instances < 1 || cfg.workers < 1 || cfg.limit < 1 ||
		cfg.hold <= 0 || cfg.refresh <= 0 || cfg.acquireTimeout <= 0 {
		return c.UsageError("--duration, --hold, --refresh, --acquire-timeout, --instances, --workers and --limit must be positive")
	}
	ctx, stopSignals := cli.InterruptContext()
	defer stopSignals()

	t, line, stopRedis, err := pickRedis(ctx, c, redisproc.Start)
	if err != nil {
		if errors.As(err, new(badTarget)) {
			return c.UsageError("%v", err)
		}
		return c.Fail(err)
	}
	defer stopRedis()
	fmt.Fprintln(stdout, line)
	admin := t.Client()
	defer admin.Close()
	pctx, cancel := cli.OpContext(ctx)
	err = admin.Ping(pctx).Err()
	cancel()
	if err != nil {
		return c.Fail(cli.ReachErr(t, err))
	}
	d := &demo{cfg: cfg, t: t, prefix: c.Prefix, out: stdout, admin: admin}
	return d.run(ctx, c)
}

// badTarget is a --redis or REDIS_URL that does not parse: a usage error.
type badTarget struct{ error }

// pickRedis chooses the demo's Redis, in this order: the one --redis or
// $REDIS_URL names; else a throw-away redis-server that start launches from
// PATH; else, when start finds none (redisproc.ErrNotFound), an in-process
// miniredis. It returns the target, the line that tells the user which, and
// the function that stops what it started.
func pickRedis(ctx context.Context, c *command, start func(context.Context) (*redisproc.Proc, error)) (*cli.Target, string, func(), error) {
	if from, given := c.RedisGiven(); given {
		t, err := cli.ParseTarget(c.Redis)
		if err != nil {
			return nil, "", nil, badTarget{err}
		}
		return t, fmt.Sprintf("redis: using %s (from %s)", t.Display, from), func() {}, nil
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	p, err := start(sctx)
	cancel()
	if err == nil {
		t := &cli.Target{URL: &redis.Options{Addr: p.Addr()}, Display: p.Addr()}
		return t, fmt.Sprintf("redis: started redis-server %s (%s) on %s; it stops when the demo ends", p.Version(), p.Path(), p.Addr()), p.Stop, nil
	}
	if !errors.Is(err, redisproc.ErrNotFound) {
		return nil, "", nil, err
	}
	m, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, fmt.Errorf("no --redis, REDIS_URL or redis-server on PATH, and miniredis failed: %w", err)
	}
	t := &cli.Target{URL: &redis.Options{Addr: m.Addr()}, Display: m.Addr()}
	return t, fmt.Sprintf("redis: no --redis, REDIS_URL or redis-server on PATH: running on an in-process miniredis "+
		"(a Redis emulation) on %s; install redis-server for the real thing", m.Addr()), m.Close, nil
}

type demo struct {
	cfg    demoConfig
	t      *cli.Target
	prefix string
	out    io.Writer
	admin  redis.UniversalClient

	mu      sync.Mutex
	clients []redis.UniversalClient
}

// client returns a new client of the demo's Redis, closed at the end.
func (d *demo) client() redis.UniversalClient {
	c := d.t.Client()
	d.mu.Lock()
	d.clients = append(d.clients, c)
	d.mu.Unlock()
	return c
}

func (d *demo) run(ctx context.Context, c *command) int {
	defer func() {
		for _, cl := range d.clients {
			_ = cl.Close()
		}
	}()
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	tag := hex.EncodeToString(suffix[:])
	variants := []*variant{
		{label: "FAIR (FIFO queue)", name: "demo-fair-" + tag, fair: true},
		{label: "UNFAIR (sorted set)", name: "demo-unfair-" + tag},
	}
	zombieName := "demo-zombie-" + tag
	guard, err := fencing.NewRedisGuard(d.admin, fencing.RedisOptions{KeyPrefix: d.prefix + "-fence"})
	if err != nil {
		return c.Fail(err)
	}
	defer d.purge(guard, zombieName, variants[0].name, variants[1].name)

	cfg := d.cfg
	fmt.Fprintf(d.out, "demo: %d instances x %d workers per semaphore, global limit %d, holds of ~%s, for %s\n",
		cfg.instances, cfg.workers, cfg.limit, cfg.hold, cfg.duration)
	fmt.Fprintf(d.out, "      fair %q and unfair %q run side by side on the same load (prefix %q)\n\n",
		variants[0].name, variants[1].name, d.prefix)

	for _, v := range variants {
		if err := d.setup(v); err != nil {
			return c.Fail(err)
		}
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.duration)
	defer stopLoad()
	start := time.Now()
	var wg sync.WaitGroup
	for _, v := range variants {
		for i, sem := range v.sems {
			for w := 0; w < cfg.workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v.work(loadCtx, sem, i*cfg.workers+w, cfg)
				}()
			}
		}
	}
	d.live(loadCtx, variants, start)
	wg.Wait()
	end := time.Now()
	for _, v := range variants {
		for _, s := range v.sems {
			_ = s.Close()
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(d.out, "\ninterrupted")
		return exitError
	}
	d.summary(variants, start, end)
	if err := d.zombie(ctx, guard, zombieName); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(d.out, "\ninterrupted")
			return exitError
		}
		return c.Fail(err)
	}
	fmt.Fprintf(d.out, "\ndone: the demo removed its keys. Next: docs/operations.md, 'redsem status NAME', 'redsem watch NAME'.\n")
	return exitOK
}

// purge deletes the demo's keys (best effort): the semaphores' and the
// zombie's fence record and data.
func (d *demo) purge(guard *fencing.RedisGuard, zombie string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), cli.OpTimeout)
	defer cancel()
	for _, n := range append(names, zombie) {
		if e, err := core.New(core.Config{Client: d.admin, Name: n, Limit: 1, Prefix: d.prefix}); err == nil {
			_ = d.admin.Del(ctx, e.Keys().List...).Err()
		}
	}
	_ = d.admin.Del(ctx, guard.FenceKey(zombie), guard.DataKey(zombie, zombieData)).Err()
}

// variant is one semaphore of the demo and what its workers measured.
type variant struct {
	label string
	name  string
	fair  bool
	sems  []redsem.Semaphore // one per instance, each with its own client; sems[0] reads Status for the live view

	lost atomic.Int64  // EventLeaseLost, through the Observer hook
	m    bench.Metrics // what summary computed from holds

	mu sync.Mutex
	// holds records every grant, as the bench harness does (Rel is 0 while
	// it is held); Worker is the index that demoConfig.worker names.
	holds    []bench.Record
	byLease  map[string]int    // lease id -> its grant's index in holds
	waiting  map[int]time.Time // worker -> when it started waiting
	timeouts int
	errs     int
	lastErr  error
}

func (d *demo) setup(v *variant) error {
	v.byLease, v.waiting = map[string]int{}, map[int]time.Time{}
	observer := func(ev redsem.Event) {
		if ev.Kind == redsem.EventLeaseLost {
			v.lost.Add(1)
		}
	}
	for i := 0; i < d.cfg.instances; i++ {
		var s redsem.Semaphore
		var err error
		if v.fair {
			s, err = fair.New(d.client(), v.name, d.cfg.limit, fair.Options{
				LeaseTTL: 10 * time.Second, QueueTTL: 3 * time.Second, KeyPrefix: d.prefix, Observer: observer})
		} else {
			s, err = unfair.New(d.client(), v.name, d.cfg.limit, unfair.Options{
				LeaseTTL: 10 * time.Second, KeyPrefix: d.prefix, Observer: observer})
		}
		if err != nil {
			return err
		}
		v.sems = append(v.sems, s)
	}
	return nil
}

// work is one worker: acquire, hold for a random time around cfg.hold,
// release, again, until ctx ends.
func (v *variant) work(ctx context.Context, s redsem.Semaphore, me int, cfg demoConfig) {
	for ctx.Err() == nil {
		asked := time.Now()
		v.mu.Lock()
		v.waiting[me] = asked
		v.mu.Unlock()
		actx, cancel := context.WithTimeout(ctx, cfg.acquireTimeout)
		l, err := s.Acquire(actx)
		cancel()
		got := time.Now()
		v.mu.Lock()
		delete(v.waiting, me)
		if err != nil {
			failed := ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) // a Redis error
			if failed {
				v.errs++
				v.lastErr = err
			} else if ctx.Err() == nil {
				v.timeouts++
			}
			v.mu.Unlock()
			if failed {
				time.Sleep(100 * time.Millisecond) // do not spin
			}
			continue
		}
		i := len(v.holds)
		v.holds = append(v.holds, bench.Record{Worker: me, Start: asked.UnixNano(), Got: got.UnixNano()})
		v.byLease[l.ID()] = i
		v.mu.Unlock()

		hold := time.Duration(float64(cfg.hold) * (0.5 + mrand.Float64())) // the simulated work
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		v.mu.Lock()
		v.holds[i].Rel = time.Now().UnixNano()
		v.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.Background(), cli.OpTimeout)
		_ = l.Release(rctx)
		rcancel()
	}
}

// live prints a view of both semaphores every refresh until ctx ends.
func (d *demo) live(ctx context.Context, vs []*variant, start time.Time) {
	tick := time.NewTicker(d.cfg.refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cols := make([][]string, len(vs))
		for i, v := range vs {
			cols[i] = v.frame(ctx, d.cfg)
		}
		if ctx.Err() != nil {
			return
		}
		if cli.IsTerminal(d.out) {
			fmt.Fprint(d.out, "\033[H\033[2J")
		}
		fmt.Fprintf(d.out, "--- t=%.1fs (read from Redis with Status; who = instance.worker) ---\n", time.Since(start).Seconds())
		for _, line := range sideBySide(cols, 50) {
			fmt.Fprintln(d.out, line)
		}
		fmt.Fprintln(d.out)
	}
}

// frame is the live view of one variant, a few lines of at most 48 chars.
func (v *variant) frame(ctx context.Context, cfg demoConfig) []string {
	rctx, cancel := cli.OpContext(ctx)
	st, err := v.sems[0].Status(rctx)
	cancel()
	lines := []string{v.label}
	if err != nil {
		return append(lines, "status: "+cli.OneLine(err.Error()))
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	bySlot := map[int]redsem.Holder{}
	for _, h := range st.Holders {
		bySlot[h.Slot] = h
	}
	for s := 0; s < cfg.limit; s++ {
		h, ok := bySlot[s]
		if !ok {
			lines = append(lines, fmt.Sprintf("slot %d  (free)", s))
			continue
		}
		who, held := h.ID[:6], ""
		if i, ok := v.byLease[h.ID]; ok {
			who = cfg.worker(v.holds[i].Worker)
			if v.holds[i].Rel == 0 {
				held = fmt.Sprintf("%.2fs", time.Since(time.Unix(0, v.holds[i].Got)).Seconds())
			}
		}
		lines = append(lines, fmt.Sprintf("slot %d  %-6s token %d %s", s, who, h.Token, held))
	}
	if v.fair {
		ids := make([]string, 0, 3)
		for i, w := range st.Waiters {
			if i == 3 {
				ids = append(ids, "...")
				break
			}
			ids = append(ids, w.ID[:4])
		}
		lines = append(lines, fmt.Sprintf("queue in Redis: %d  %s", len(st.Waiters), strings.Join(ids, " ")))
	} else {
		lines = append(lines, "queue in Redis: none (unfair waiters retry)")
	}
	longest, since := -1, time.Time{}
	for w, t := range v.waiting {
		if longest < 0 || t.Before(since) {
			longest, since = w, t
		}
	}
	if longest >= 0 {
		lines = append(lines, fmt.Sprintf("waiting: %d, longest %s %.2fs", len(v.waiting), cfg.worker(longest), time.Since(since).Seconds()))
	} else {
		lines = append(lines, "waiting: 0")
	}
	return append(lines, fmt.Sprintf("grants so far: %d", len(v.holds)))
}

// sideBySide lays out columns of lines next to each other.
func sideBySide(cols [][]string, width int) []string {
	n := 0
	for _, c := range cols {
		n = max(n, len(c))
	}
	out := make([]string, n)
	for i := 0; i < n; i++ {
		var b strings.Builder
		for j, c := range cols {
			cell := ""
			if i < len(c) {
				cell = c[i]
			}
			if j < len(cols)-1 {
				fmt.Fprintf(&b, "%-*s", width, cell)
			} else {
				b.WriteString(cell)
			}
		}
		out[i] = strings.TrimRight(b.String(), " ")
	}
	return out
}

// summary reports what the workers measured between start and end, as
// the bench harness analyses it (bench.Analyze).
func (d *demo) summary(vs []*variant, start, end time.Time) {
	cfg := d.cfg
	workers := cfg.instances * cfg.workers
	fmt.Fprintf(d.out, "results over %.1fs (limit %d, %d workers per semaphore; holds and waits measured by the workers):\n",
		end.Sub(start).Seconds(), cfg.limit, workers)
	for _, v := range vs {
		v.m = bench.Analyze(v.holds, cfg.limit, workers, start.UnixNano(), end.UnixNano())
	}
	rows := [][]string{{"", vs[0].label[:strings.IndexByte(vs[0].label, ' ')], vs[1].label[:strings.IndexByte(vs[1].label, ' ')], ""}}
	add := func(name, note string, f func(v *variant) string) {
		rows = append(rows, []string{name, f(vs[0]), f(vs[1]), note})
	}
	add("grants", "", func(v *variant) string { return fmt.Sprint(v.m.Holds) })
	add("utilisation", "sum of holds / (limit x time)", func(v *variant) string { return fmt.Sprintf("%.2f", v.m.Utilisation) })
	add("wait p50", "", func(v *variant) string { return demoMs(v.m.WaitP50Ms) })
	add("wait p99", "", func(v *variant) string { return demoMs(v.m.WaitP99Ms) })
	add("wait max", "", func(v *variant) string { return demoMs(v.m.WaitMaxMs) })
	add("timeouts", fmt.Sprintf("gave up after %s", cfg.acquireTimeout), func(v *variant) string { return fmt.Sprint(v.timeouts) })
	add("errors", "", func(v *variant) string { return fmt.Sprint(v.errs) })
	add("Jain's fairness", "of grants per worker; 1 = all equal", func(v *variant) string { return fmt.Sprintf("%.3f", v.m.Jain) })
	add("grants per worker", "min-max", func(v *variant) string {
		g := bench.PerWorker(v.holds, workers)
		return fmt.Sprintf("%.0f-%.0f", slices.Min(g), slices.Max(g))
	})
	add("most holders at once", fmt.Sprintf("workers' own view; never above %d", cfg.limit), func(v *variant) string { return fmt.Sprint(v.m.MaxHolders) })
	add("leases lost", "from the Observer hook", func(v *variant) string { return fmt.Sprint(v.lost.Load()) })
	for _, r := range rows {
		fmt.Fprintf(d.out, "  %-21s %9s %9s   %s\n", r[0], r[1], r[2], r[3])
	}
	for _, v := range vs {
		if v.lastErr != nil {
			fmt.Fprintf(d.out, "  %s: last error: %s\n", v.name, cli.OneLine(v.lastErr.Error()))
		}
	}
	fmt.Fprintln(d.out, "  fair admits strictly in arrival order, so its waits are even; unfair lets whoever retries first win.")
}

// demoMs shows ms milliseconds: "12ms", or "1.25s" from a second on.
func demoMs(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%dms", int64(ms))
	}
	return fmt.Sprintf("%.2fs", ms/1000)
}

// zombieData names the data key the zombie part writes through the guard.
const zombieData = "report"

// zombie shows a holder that pauses past its lease being refused by a store
// that fences per slot, while a concurrent holder with a lower token (on
// another slot) is accepted.
func (d *demo) zombie(ctx context.Context, guard *fencing.RedisGuard, name string) error {
	const ttl = time.Second
	fmt.Fprintf(d.out, "\nfencing: a paused holder (a zombie) is refused by a store that fences per slot\n")
	fmt.Fprintf(d.out, "  (the store is package fencing's RedisGuard: it keeps the highest token per slot; limit 2, LeaseTTL %s)\n", ttl)
	var sem [3]redsem.Semaphore // A's, B's and C's
	for i := range sem {
		// A will "pause": no watchdog renews its lease.
		o := unfair.Options{LeaseTTL: ttl, KeyPrefix: d.prefix, DisableAutoRenew: i == 0}
		var err error
		if sem[i], err = unfair.New(d.client(), name, 2, o); err != nil {
			return err
		}
	}
	key := guard.DataKey(name, zombieData)
	write := func(l redsem.Lease, value string) string {
		return fenceVerdict(guard.Set(ctx, fencing.Of(name, l), key, value, 0))
	}
	say := func(who, format string, args ...any) {
		fmt.Fprintf(d.out, "  %s  %s\n", who, fmt.Sprintf(format, args...))
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := sem[0].Acquire(actx)
	if err != nil {
		return err
	}
	say("A", "acquired slot %d, token %d; write: %s", a.Slot(), a.Token(), write(a, "from A"))
	b, err := sem[1].Acquire(actx)
	if err != nil {
		return err
	}
	defer b.Release(context.WithoutCancel(ctx))
	say("B", "acquired slot %d, token %d; write: %s", b.Slot(), b.Token(), write(b, "from B"))
	say("A", "pauses (think: a long GC pause) and stops renewing; its lease expires after %s", ttl)
	waited := time.Now()
	cl, err := sem[2].Acquire(actx) // blocks until A's lease expires
	if err != nil {
		return err
	}
	defer cl.Release(context.WithoutCancel(ctx))
	say("C", "acquired slot %d, token %d after waiting %.1fs for A's lease to expire; write: %s",
		cl.Slot(), cl.Token(), time.Since(waited).Seconds(), write(cl, "from C"))
	say("B", "writes again with token %d (lower than C's %d, but slot %d): %s",
		b.Token(), cl.Token(), b.Slot(), write(b, "from B, again"))
	say(" ", "(one \"highest token seen\" for the whole store would have refused B, a legitimate holder)")
	say("A", "wakes up and writes with token %d on slot %d: %s", a.Token(), a.Slot(), write(a, "late, from A"))
	released := "ok"
	if err := a.Release(actx); err != nil {
		released = err.Error()
	}
	say("A", "Release: %s", released)
	return nil
}

// fenceVerdict tells what the guard did with a write.
func fenceVerdict(err error) string {
	var stale *fencing.StaleError
	switch {
	case errors.As(err, &stale):
		return fmt.Sprintf("REFUSED (slot %d has seen token %d, this write has %d)", stale.Fence.Slot, stale.Highest, stale.Fence.Token)
	case err != nil:
		return "FAILED (" + cli.OneLine(err.Error()) + ")"
	}
	return "accepted"
}
