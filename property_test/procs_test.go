package property_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
	"pgregory.net/rapid"
)

// The concurrent property: several OS processes (this test binary run again
// as TestHelperProcess) with many goroutines each acquire (AcquireN, a
// random weight in [1, limit]) and release one semaphore with random holds, while the parent kills some of them with
// SIGKILL; one run in two has a quiet stretch in which one process alone
// takes and returns a slot at once for over twice the queue TTL, then
// everyone goes on at once (issue 19: a running process must never see
// its waiters evicted). Every lease is recorded by its process as JSON lines on stdout,
// with time.Now().UnixNano(): the wall clock, which all processes on one
// machine share (a clock step during a run would make the check unsound).

const (
	helperEnv   = "REDSEM_PROPERTY_HELPER" // set in a child: its parameters, as JSON
	procLease   = 400 * time.Millisecond
	procQueue   = 400 * time.Millisecond
	procRun     = 1500 * time.Millisecond
	procChecks  = 3  // checks per CI run
	procSoakRun = 20 // checks with REDSEM_SOAK=1
)

// helperParams is what the parent tells a child.
type helperParams struct {
	Addr    string `json:"addr"`
	Name    string `json:"name"`
	Fair    bool   `json:"fair"`
	Limit   int    `json:"limit"`
	Workers int    `json:"workers"`
	HoldMax int    `json:"hold_max_ms"`
	RunMs   int    `json:"run_ms"`
	Seed    uint64 `json:"seed"`
	// A quiet stretch [QuietAt, QuietAt+Quiet) ms into the run: nobody
	// calls, but worker 0 of the Streamer takes and returns a slot at once
	// every procQueue/10; then every worker goes on at once (a burst).
	QuietAt  int  `json:"quiet_at_ms,omitempty"`
	Quiet    int  `json:"quiet_ms,omitempty"`
	Streamer bool `json:"streamer,omitempty"`
	// A rate (Options.Rate) on top of the limit: at most RateLimit slots
	// granted per RatePerMs; zero: none. An Acquire that the rate keeps
	// waiting past its 3 s context is then a "timeout", not a failure.
	RateLimit int `json:"rate_limit,omitempty"`
	RatePerMs int `json:"rate_per_ms,omitempty"`
	// Faults: the child's client holds script replies and pub/sub messages
	// back at random (procDelay), with generator seed Seed.
	Faults bool `json:"faults,omitempty"`
	// Handoff: leases change process (Resume). A worker done with its
	// lease offers it, one time in three, on a list in Redis
	// (handoffKey) for 0-5 ms; taken, it is no longer that worker's to
	// release (its process's handle keeps renewing it until it learns of
	// the release elsewhere); else it releases it. The last worker of a
	// process of several only takes offered leases (it resumes one, holds
	// it and releases it); the others, one time in two before they
	// acquire, take one if there is one.
	Handoff bool `json:"handoff,omitempty"`
}

// handoffKey is the list on which the children of a run offer leases.
func handoffKey(name string) string { return "handoff:" + name }

// procDelay is the fault layer of a child whose Faults is set.
func procDelay(seed uint64) redistest.DelayConfig {
	return redistest.DelayConfig{Seed: seed, Replies: redistest.MatchScripts(), ReplyOdds: 0.2, ReadOdds: 0.3,
		SlowConnOdds: 0.2, Max: 20 * time.Millisecond}
}

// rate is p's Options.Rate.
func (p helperParams) rate() redsem.Rate {
	return redsem.Rate{Limit: p.RateLimit, Per: time.Duration(p.RatePerMs) * time.Millisecond}
}

// record is one line a child prints.
//
//	acq: AcquireN(Weight) was called at Start and returned at T the lease ID
//	     with its slots, token and early deadline estimate (ns).
//	rel: Release was called at T (printed before the call).
//	lost: Release of ID returned ErrLeaseLost.
//	evict: the process saw its waiter ID evicted (EventWaiterEvicted).
//	res: Resume of ID (taken from the handoff list) returned at T the
//	     lease with its slots, token and early deadline estimate.
//	resfail: Resume of ID returned ErrLeaseLost.
//	handlost: the process's handle of ID, which it handed on, ended with
//	     ErrLeaseLost (it must end quietly once the lease is released).
type record struct {
	Ev       string `json:"ev"`
	ID       string `json:"id"`
	Weight   int    `json:"weight,omitempty"`
	Slots    []int  `json:"slots,omitempty"`
	Token    int64  `json:"token,omitempty"`
	Start    int64  `json:"start,omitempty"`
	T        int64  `json:"t"`
	Deadline int64  `json:"deadline,omitempty"`
	Err      string `json:"err,omitempty"`
}

// TestHelperProcess is a child of TestConcurrentProcesses; it does nothing
// in a normal run.
func TestHelperProcess(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		t.Skip("run by TestConcurrentProcesses only")
	}
	var p helperParams
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatal(err)
	}
	opt := &redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true}
	rdb := redis.NewClient(opt)
	if p.Faults {
		rdb = redistest.NewDelayer(procDelay(p.Seed)).NewClient(opt)
	}
	defer rdb.Close()
	var mu sync.Mutex
	emit := func(r record) {
		b, _ := json.Marshal(r)
		mu.Lock()
		_, _ = os.Stdout.Write(append(b, '\n')) // one write: whole lines or nothing
		mu.Unlock()
	}
	observe := func(ev redsem.Event) {
		if ev.Kind == redsem.EventWaiterEvicted {
			emit(record{Ev: "evict", ID: ev.LeaseID, T: time.Now().UnixNano()})
		}
	}
	var sem redsem.Semaphore
	var err error
	if p.Fair {
		sem, err = fair.New(rdb, p.Name, p.Limit, fair.Options{LeaseTTL: procLease, QueueTTL: procQueue, Observer: observe, Rate: p.rate()})
	} else {
		sem, err = unfair.New(rdb, p.Name, p.Limit, unfair.Options{LeaseTTL: procLease, Observer: observe, Rate: p.rate()})
	}
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	quietFrom := begin.Add(time.Duration(p.QuietAt) * time.Millisecond)
	quietTo := quietFrom.Add(time.Duration(p.Quiet) * time.Millisecond)
	end := time.Now().Add(time.Duration(p.RunMs) * time.Millisecond)
	var wg sync.WaitGroup
	var handedMu sync.Mutex
	var handed []redsem.Lease // leases handed on (Handoff) by this process's workers
	for w := 0; w < p.Workers; w++ {
		rng := rand.New(rand.NewPCG(p.Seed, uint64(w)))
		taker := p.Handoff && p.Workers > 1 && w == p.Workers-1
		wg.Go(func() {
			for taker && time.Now().Before(end) {
				// This worker only takes the leases others offer.
				id, err := rdb.BRPop(context.Background(), 20*time.Millisecond, handoffKey(p.Name)).Result()
				if err == nil && len(id) == 2 {
					resumeHandedLease(sem, id[1], rng, p.HoldMax, emit)
				}
			}
			for time.Now().Before(end) {
				if now := time.Now(); p.Quiet > 0 && !now.Before(quietFrom) && now.Before(quietTo) {
					if !p.Streamer || w != 0 {
						time.Sleep(time.Until(quietTo))
						continue
					}
					// The stream: a slot taken and returned at once.
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					start := time.Now().UnixNano()
					l, err := sem.Acquire(ctx)
					cancel()
					if err != nil {
						emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "stream: " + err.Error()})
						continue
					}
					emit(record{Ev: "acq", ID: l.ID(), Weight: 1, Slots: l.Slots(), Token: l.Token(), Start: start,
						T: time.Now().UnixNano(), Deadline: l.Deadline().UnixNano()})
					emit(record{Ev: "rel", ID: l.ID(), T: time.Now().UnixNano()})
					if err := l.Release(context.Background()); err != nil {
						emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "stream release: " + err.Error()})
					}
					time.Sleep(procQueue / 10)
					continue
				}
				if p.Handoff && rng.IntN(2) == 0 {
					if id, err := rdb.RPop(context.Background(), handoffKey(p.Name)).Result(); err == nil {
						resumeHandedLease(sem, id, rng, p.HoldMax, emit)
						continue
					}
				}
				if rng.IntN(4) == 0 {
					doHold(sem, rng, p.HoldMax, p.RateLimit > 0, emit)
					continue
				}
				n := 1 + rng.IntN(p.Limit)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				start := time.Now().UnixNano()
				l, err := sem.AcquireN(ctx, n)
				cancel()
				if err != nil && p.RateLimit > 0 && errors.Is(err, context.DeadlineExceeded) {
					emit(record{Ev: "timeout", T: time.Now().UnixNano(), Err: err.Error()})
					continue
				}
				if err != nil {
					emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: err.Error()})
					continue
				}
				emit(record{Ev: "acq", ID: l.ID(), Weight: n, Slots: l.Slots(), Token: l.Token(), Start: start,
					T: time.Now().UnixNano(), Deadline: l.Deadline().UnixNano()})
				time.Sleep(time.Duration(rng.IntN(p.HoldMax*1000+1)) * time.Microsecond)
				if p.Handoff && rng.IntN(3) == 0 && offerLease(rdb, p.Name, l, rng, emit) {
					handedMu.Lock()
					handed = append(handed, l)
					handedMu.Unlock()
				} else {
					releaseRecorded(l, emit)
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	// The leases this process handed on: each ends by itself, released
	// (quietly) once the process that took it releases it; one still open
	// after three lease TTLs (whoever took it was killed) is released here.
	until := time.Now().Add(3 * procLease)
	for _, l := range handed {
		select {
		case <-l.Done():
		case <-time.After(time.Until(until)):
		}
		select {
		case <-l.Done():
			if err := l.Err(); err != nil {
				emit(record{Ev: "handlost", ID: l.ID(), T: time.Now().UnixNano(), Err: err.Error()})
			}
		default:
			releaseRecorded(l, emit)
		}
	}
}

// doHold holds a slot through redsem.Do, the entry point users call: fn
// records the grant (acq), works for up to holdMax ms or until its context
// ends, and records the end (rel) before Do releases; a loss is recorded
// (lost), and fn's context must have ended by the lease's Deadline() (plus
// a timer's lateness) when the lease was lost: else a "fail" record.
func doHold(sem redsem.Semaphore, rng *rand.Rand, holdMax int, rated bool, emit func(record)) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now().UnixNano()
	var id string
	hold := time.Duration(rng.IntN(holdMax*1000+1)) * time.Microsecond
	err := redsem.Do(ctx, sem, func(fctx context.Context, l redsem.Lease) error {
		id = l.ID()
		emit(record{Ev: "acq", ID: l.ID(), Weight: 1, Slots: l.Slots(), Token: l.Token(), Start: start,
			T: time.Now().UnixNano(), Deadline: l.Deadline().UnixNano()})
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-t.C:
		case <-fctx.Done():
			if errors.Is(context.Cause(fctx), redsem.ErrLeaseLost) {
				if late := time.Since(l.Deadline()); l.Err() == nil || late > 150*time.Millisecond {
					emit(record{Ev: "fail", T: time.Now().UnixNano(),
						Err: fmt.Sprintf("Do: fn's context ended (lost) %v after Deadline(), Err %v", late, l.Err())})
				}
			}
		}
		emit(record{Ev: "rel", ID: l.ID(), T: time.Now().UnixNano()})
		return nil
	})
	switch {
	case err == nil:
	case errors.Is(err, redsem.ErrLeaseLost) && id != "":
		emit(record{Ev: "lost", ID: id, T: time.Now().UnixNano()})
	case id == "" && rated && errors.Is(err, context.DeadlineExceeded):
		emit(record{Ev: "timeout", T: time.Now().UnixNano(), Err: err.Error()})
	default:
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "Do: " + err.Error()})
	}
}

// releaseRecorded releases l, recording the call (rel) and a loss (lost).
func releaseRecorded(l redsem.Lease, emit func(record)) {
	emit(record{Ev: "rel", ID: l.ID(), T: time.Now().UnixNano()})
	if err := l.Release(context.Background()); errors.Is(err, redsem.ErrLeaseLost) {
		emit(record{Ev: "lost", ID: l.ID(), T: time.Now().UnixNano()})
	} else if err != nil {
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "release: " + err.Error()})
	}
}

// offerLease offers l on the handoff list for 0-5 ms and reports whether
// another worker took it (it is then no longer this worker's to release).
func offerLease(rdb *redis.Client, name string, l redsem.Lease, rng *rand.Rand, emit func(record)) bool {
	ctx := context.Background()
	if err := rdb.LPush(ctx, handoffKey(name), l.ID()).Err(); err != nil {
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "offer: " + err.Error()})
		return false
	}
	time.Sleep(time.Duration(rng.IntN(5001)) * time.Microsecond)
	n, err := rdb.LRem(ctx, handoffKey(name), 1, l.ID()).Result()
	if err != nil {
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "withdraw the offer: " + err.Error()})
		return true // maybe taken: its handle ends by itself, or the end releases it
	}
	return n == 0
}

// resumeHandedLease resumes the lease id that another worker handed on,
// holds it and releases it.
func resumeHandedLease(sem redsem.Semaphore, id string, rng *rand.Rand, holdMax int, emit func(record)) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	l, err := sem.Resume(ctx, id)
	cancel()
	switch {
	case errors.Is(err, redsem.ErrLeaseLost):
		emit(record{Ev: "resfail", ID: id, T: time.Now().UnixNano(), Err: err.Error()})
		return
	case err != nil:
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "resume: " + err.Error()})
		return
	}
	emit(record{Ev: "res", ID: l.ID(), Weight: len(l.Slots()), Slots: l.Slots(), Token: l.Token(),
		T: time.Now().UnixNano(), Deadline: l.Deadline().UnixNano()})
	time.Sleep(time.Duration(rng.IntN(holdMax*1000+1)) * time.Microsecond)
	releaseRecorded(l, emit)
}

// interval is one lease as the checker sees it.
type interval struct {
	proc       int
	id         string
	weight     int
	slots      []int
	token      int64
	start      int64 // Acquire called
	from, to   int64 // [Acquire returned, Release called) or, for a killed holder, its deadline
	killedOpen bool
	lost       bool
	deadline   int64 // the lease's Deadline() when Acquire returned
	killed     int64 // when its process was killed; 0 if it was not
	resumers   []int // the processes that resumed it (Handoff)
	released   bool  // a Release of one of its handles was called (to)
	relProc    int   // the process that called it; -1 none
}

func TestConcurrentProcesses(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("child")
	}
	if !userChecks {
		old := flag.Lookup("rapid.checks").Value.String()
		n := procChecks
		if soak() {
			n = procSoakRun
		}
		_ = flag.Set("rapid.checks", strconv.Itoa(n))
		defer func() { _ = flag.Set("rapid.checks", old) }()
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rapid.Check(t, func(rt *rapid.T) {
		p := helperParams{
			Addr:    srv.Addr,
			Name:    redistest.Name(t),
			Fair:    rapid.Bool().Draw(rt, "fair"),
			Limit:   rapid.IntRange(1, 4).Draw(rt, "limit"),
			Workers: rapid.IntRange(1, 6).Draw(rt, "workers"),
			HoldMax: rapid.IntRange(1, 15).Draw(rt, "hold_max_ms"),
			RunMs:   int(procRun.Milliseconds()),
		}
		nproc := rapid.IntRange(2, 4).Draw(rt, "processes")
		if rapid.Bool().Draw(rt, "quiet") {
			// A quiet stretch longer than twice the queue TTL in which one
			// process streams uncontended grants, then everyone at once.
			p.QuietAt, p.Quiet = 200, int(2*procQueue.Milliseconds())+100
			p.RunMs += p.Quiet
		}
		if rapid.Bool().Draw(rt, "rate") {
			// Tight enough to hold grants back, loose enough that a 3 s
			// Acquire is granted more often than not.
			p.RateLimit = rapid.IntRange(p.Limit, 3*p.Limit).Draw(rt, "rate_limit")
			p.RatePerMs = rapid.IntRange(50, 200).Draw(rt, "rate_per_ms")
		}
		p.Faults = rapid.Bool().Draw(rt, "faults")
		p.Handoff = rapid.Bool().Draw(rt, "handoff")
		nkill := rapid.IntRange(0, nproc-1).Draw(rt, "kills")
		kills := make([]time.Duration, nkill)
		for i := range kills {
			kills[i] = time.Duration(rapid.IntRange(50, int(procRun.Milliseconds())-100).Draw(rt, "kill_at_ms")) * time.Millisecond
		}
		slices.Sort(kills)
		trace("%s: fair %v limit %d rate %v processes %d workers %d quiet %d ms, kills %v, faults %v, handoff %v", t.Name(), p.Fair, p.Limit, p.rate(), nproc, p.Workers, p.Quiet, kills, p.Faults, p.Handoff)
		runProcesses(t, rt, rdb, p, nproc, kills)
	})
}

// runProcesses starts the children, kills some, collects the records and checks them.
func runProcesses(t *testing.T, rt *rapid.T, rdb *redis.Client, p helperParams, nproc int, kills []time.Duration) {
	type child struct {
		cmd    *exec.Cmd
		recs   []record
		done   chan struct{}
		killed int64 // ns before SIGKILL was sent; 0 if not killed
		stderr strings.Builder
	}
	children := make([]*child, nproc)
	for i := range children {
		q := p
		q.Seed = uint64(i)*7919 + uint64(time.Now().UnixNano())
		q.Streamer = p.Quiet > 0 && i == 0
		raw, _ := json.Marshal(q)
		c := &child{done: make(chan struct{})}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		c.cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
		c.cmd.Stderr = &c.stderr
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			fatalf(rt, "pipe: %v", err)
		}
		if err := c.cmd.Start(); err != nil {
			fatalf(rt, "start child: %v", err)
		}
		go func() {
			defer close(c.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var r record
				if json.Unmarshal(sc.Bytes(), &r) == nil && r.Ev != "" {
					c.recs = append(c.recs, r)
				}
			}
		}()
		children[i] = c
	}
	defer func() { // after a failure: no child outlives the check
		for _, c := range children {
			_ = c.cmd.Process.Kill()
		}
	}()
	// While the children run, the keys are read and checked against
	// the Lua library's layout every few ms (the first problem found is reported
	// once they are done).
	stopPoll := make(chan struct{})
	polled := make(chan layoutPoll, 1)
	go pollLayout(rdb, core.KeysFor(core.DefaultPrefix, p.Name).List, p.Limit, stopPoll, polled)
	pollDone := false
	stopPolling := func() layoutPoll {
		if pollDone {
			return layoutPoll{}
		}
		pollDone = true
		close(stopPoll)
		return <-polled
	}
	defer stopPolling()
	begin := time.Now()
	order := rand.Perm(nproc)
	for i, at := range kills {
		time.Sleep(time.Until(begin.Add(at)))
		c := children[order[i]]
		c.killed = time.Now().UnixNano()
		_ = c.cmd.Process.Kill()
		rt.Logf("killed process %d at %v", order[i], at)
	}
	var ivs []interval
	var lastDeadline int64
	type procRecord struct {
		proc int
		r    record
	}
	var all []procRecord
	for i, c := range children {
		select {
		case <-c.done:
		case <-time.After(time.Duration(p.RunMs)*time.Millisecond + 20*time.Second):
			fatalf(rt, "process %d did not finish", i)
		}
		err := c.cmd.Wait()
		if c.killed == 0 && err != nil {
			fatalf(rt, "process %d: %v\n%s", i, err, c.stderr.String())
		}
		if c.killed != 0 {
			// Its leases were renewed until the kill.
			lastDeadline = max(lastDeadline, c.killed+procLease.Nanoseconds())
		}
		for _, r := range c.recs {
			all = append(all, procRecord{i, r})
		}
	}
	// One history: the processes share the wall clock, so the records of a
	// lease acquired in one process and resumed and released in another
	// (Handoff) come in their order.
	slices.SortStableFunc(all, func(a, b procRecord) int { return cmpInt(a.r.T, b.r.T) })
	open := map[string]*interval{}
	handed := 0
	for _, pr := range all {
		i, r := pr.proc, pr.r
		c := children[i]
		switch r.Ev {
		case "acq":
			iv := &interval{proc: i, id: r.ID, weight: r.Weight, slots: r.Slots, token: r.Token, start: r.Start, from: r.T, to: -1,
				deadline: r.Deadline, killed: c.killed, relProc: -1}
			open[r.ID] = iv
			lastDeadline = max(lastDeadline, r.Deadline)
			if c.killed != 0 {
				// Until a rel record says otherwise, it holds the slot at
				// least until the kill and until its deadline estimate.
				iv.to, iv.killedOpen = max(c.killed, r.Deadline), true
			}
			ivs = append(ivs, *iv)
		case "res":
			iv := open[r.ID]
			if iv == nil {
				fatalf(rt, "process %d resumed lease %s, which no process was granted", i, r.ID)
			}
			if r.Token != iv.token || !slices.Equal(r.Slots, iv.slots) {
				fatalf(rt, "process %d resumed %s with slots %v token %d: the grant's were %v and %d", i, r.ID, r.Slots, r.Token, iv.slots, iv.token)
			}
			handed++
			iv.resumers = append(iv.resumers, i)
			lastDeadline = max(lastDeadline, r.Deadline)
			if c.killed != 0 && !iv.released {
				// Resumed by a process killed later: held at least until
				// that kill and that deadline estimate, unless released.
				iv.to, iv.killedOpen = max(iv.to, c.killed, r.Deadline), true
				setInterval(ivs, *iv)
			}
		case "resfail":
			// A lease is offered only while its process holds it, and that
			// process keeps renewing it until it learns of its release:
			// only its death may end it before the Resume.
			if iv := open[r.ID]; iv == nil || children[iv.proc].killed == 0 {
				fatalf(rt, "process %d: Resume of lease %s, handed on by a live process, failed: %s", i, r.ID, r.Err)
			}
		case "rel":
			if iv := open[r.ID]; iv != nil && !iv.released {
				// The first Release of any of its handles ends it.
				iv.to, iv.killedOpen, iv.released, iv.relProc = r.T, false, true, i
				setInterval(ivs, *iv)
			}
		case "lost":
			if iv := open[r.ID]; iv != nil && iv.relProc == i {
				// It ended at some unknown time before Release: count nothing.
				iv.to, iv.lost = iv.from, true
				setInterval(ivs, *iv)
			}
		case "handlost":
			iv := open[r.ID]
			if iv == nil {
				fatalf(rt, "process %d: handlost of unknown lease %s", i, r.ID)
			}
			if iv.released && iv.relProc != i && !iv.lost {
				fatalf(rt, "process %d's handle of lease %s, which process %d resumed and released, ended with %s: it must end quietly", i, r.ID, iv.relProc, r.Err)
			}
			if !iv.released {
				iv.to, iv.lost = iv.from, true // lost before anyone released it
				setInterval(ivs, *iv)
			}
		case "fail":
			fatalf(rt, "process %d: %s", i, r.Err)
		case "timeout":
			// Only with a rate: the window kept it waiting.
		case "evict":
			// Only a process that stopped (paused, cut off) for
			// QueueTTL may lose its place; these never stop.
			fatalf(rt, "process %d saw its waiter %s evicted (EventWaiterEvicted) while it was running (quiet stretch: %v)", i, r.ID, p.Quiet > 0)
		}
	}
	for _, iv := range open {
		if iv.to < 0 {
			fatalf(rt, "lease %s of process %d (resumed by %v), no holder of which was killed, was never released", iv.id, iv.proc, iv.resumers)
		}
	}
	if p.Handoff {
		rt.Logf("%d leases were resumed by another worker", handed)
		trace("%d leases were resumed by another worker", handed)
	}
	if lp := stopPolling(); lp.err != nil {
		fatalf(rt, "reading the keys during the run: %v", lp.err)
	} else if !lp.problems.OK() {
		layoutFail(rt, "the keys broke the Lua library's layout during the run: ", lp.problems)
	} else {
		rt.Logf("the keys were read and checked %d times during the run", lp.reads)
		trace("the keys were read and checked %d times during the run", lp.reads)
	}
	if len(ivs) == 0 {
		fatalf(rt, "no lease was granted at all")
	}
	if err := checkIntervals(ivs, p.Limit); err != nil {
		fatalf(rt, "%v", err)
	}
	if err := checkRateTokens(ivs, p.rate()); err != nil {
		fatalf(rt, "%v", err)
	}
	lost, killedOpen := 0, 0
	for _, iv := range ivs {
		if iv.lost {
			lost++
		}
		if iv.killedOpen {
			killedOpen++
		}
	}
	rt.Logf("%d leases checked (%d held by killed processes, %d lost)", len(ivs), killedOpen, lost)

	// Nothing left once the dead processes' leases and sessions end.
	time.Sleep(time.Until(time.Unix(0, lastDeadline).Add(procQueue + 50*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := mustNew(rdb, p).Status(ctx)
	if err != nil {
		fatalf(rt, "status: %v", err)
	}
	if len(st.Holders)+len(st.Waiters) != 0 {
		var who []string
		for _, h := range st.Holders {
			w := "unrecorded"
			for _, iv := range ivs {
				if iv.id == h.ID {
					w = fmtIv(iv)
				}
			}
			who = append(who, fmt.Sprintf("%s (deadline %d): %s", h.ID, h.Deadline.UnixNano(), w))
		}
		fatalf(rt, "after every process ended and every deadline passed (last %d, now %d): holders %v, %d waiters",
			lastDeadline, time.Now().UnixNano(), who, len(st.Waiters))
	}
}

// layoutPoll is what pollLayout found: the first problems, or the first
// error, and how many snapshots it checked.
type layoutPoll struct {
	problems redistest.LayoutProblems
	err      error
	reads    int
}

// pollLayout reads the keys and checks them (redistest.Layout.Check) every
// few ms until stop is closed or a check fails, then sends what it found.
func pollLayout(rdb *redis.Client, keys []string, limit int, stop <-chan struct{}, out chan<- layoutPoll) {
	var r layoutPoll
	defer func() { out <- r }()
	for {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := redistest.ReadLayout(ctx, rdb, keys)
		cancel()
		if err != nil {
			r.err = err
			return
		}
		r.reads++
		if p := l.Check(limit); !p.OK() {
			r.problems = p
			return
		}
	}
}

// checkRateTokens proves that no window of length rate.Per holds grants of
// more than rate.Limit slots, on the grants' tokens (the server's clock in
// µs at the grant, or just above: the times the rate is enforced on). A
// grant a killed process never printed is missing: that can only hide a
// violation, never make one.
func checkRateTokens(ivs []interval, rate redsem.Rate) error {
	if rate.IsZero() {
		return nil
	}
	per := rate.Per.Microseconds()
	byToken := slices.Clone(ivs)
	slices.SortFunc(byToken, func(a, b interval) int { return cmpInt(a.token, b.token) })
	sum := 0
	for i, j := 0, 0; j < len(byToken); j++ {
		sum += byToken[j].weight
		for byToken[i].token <= byToken[j].token-per {
			sum -= byToken[i].weight
			i++
		}
		if sum > rate.Limit {
			var s []string
			for _, iv := range byToken[i : j+1] {
				s = append(s, fmtIv(iv))
			}
			return fmt.Errorf("%d slots granted within %v of tokens (rate %v):\n  %s", sum, rate.Per, rate, strings.Join(s, "\n  "))
		}
	}
	return nil
}

func setInterval(ivs []interval, iv interval) {
	for i := len(ivs) - 1; i >= 0; i-- {
		if ivs[i].id == iv.id {
			ivs[i] = iv
			return
		}
	}
}

func mustNew(rdb *redis.Client, p helperParams) redsem.Semaphore {
	if p.Fair {
		s, _ := fair.New(rdb, p.Name, p.Limit, fair.Options{})
		return s
	}
	s, _ := unfair.New(rdb, p.Name, p.Limit, unfair.Options{})
	return s
}

// checkIntervals proves, over the recorded intervals, that every lease holds
// as many slots as its weight, ascending, in [0, limit), that at no instant
// the weights of the overlapping leases sum to more than limit, that
// overlapping leases hold disjoint slots, and that a lease released before
// another's Acquire was called has the smaller token.
func checkIntervals(ivs []interval, limit int) error {
	for _, iv := range ivs {
		if len(iv.slots) != iv.weight {
			return fmt.Errorf("%d slots granted for weight %d: %s", len(iv.slots), iv.weight, fmtIv(iv))
		}
		for k, s := range iv.slots {
			if s < 0 || s >= limit || (k > 0 && iv.slots[k-1] >= s) {
				return fmt.Errorf("slots not ascending in [0, %d): %s", limit, fmtIv(iv))
			}
		}
	}
	type ev struct {
		t    int64
		open bool
		i    int
	}
	var evs []ev
	for i, iv := range ivs {
		if iv.to > iv.from {
			evs = append(evs, ev{iv.from, true, i}, ev{iv.to, false, i})
		}
	}
	// Intervals are half-open: at equal times ends come first.
	slices.SortFunc(evs, func(a, b ev) int {
		if a.t != b.t {
			if a.t < b.t {
				return -1
			}
			return 1
		}
		if a.open == b.open {
			return 0
		}
		if !a.open {
			return -1
		}
		return 1
	})
	live := map[int]bool{} // interval indexes
	sum := 0               // their weights
	for _, e := range evs {
		if !e.open {
			delete(live, e.i)
			sum -= ivs[e.i].weight
			continue
		}
		iv := ivs[e.i]
		for j := range live {
			for _, s := range iv.slots {
				if slices.Contains(ivs[j].slots, s) {
					return fmt.Errorf("slot %d held twice at once: %s and %s", s, fmtIv(ivs[j]), fmtIv(iv))
				}
			}
		}
		live[e.i] = true
		sum += iv.weight
		if sum > limit {
			var s []string
			for j := range live {
				s = append(s, fmtIv(ivs[j]))
			}
			slices.Sort(s)
			return fmt.Errorf("%d leases of %d slots in all overlap at %d (limit %d):\n  %s", len(live), sum, e.t, limit, strings.Join(s, "\n  "))
		}
	}
	// Tokens: if A's Release was called before B's Acquire was called, A's
	// grant came before B's, so A's token is smaller.
	byRel := slices.Clone(ivs)
	slices.SortFunc(byRel, func(a, b interval) int { return cmpInt(a.to, b.to) })
	byStart := slices.Clone(ivs)
	slices.SortFunc(byStart, func(a, b interval) int { return cmpInt(a.start, b.start) })
	var maxTok int64
	var maxIv interval
	k := 0
	for _, b := range byStart {
		for ; k < len(byRel) && byRel[k].to < b.start; k++ {
			a := byRel[k]
			if a.killedOpen || a.lost {
				continue // its end is an estimate
			}
			if a.token > maxTok {
				maxTok, maxIv = a.token, a
			}
		}
		if b.token <= maxTok {
			return fmt.Errorf("token order: %s was released before %s was requested, but its token is not smaller", fmtIv(maxIv), fmtIv(b))
		}
	}
	return nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func fmtIv(iv interval) string {
	s := fmt.Sprintf("proc %d slots %v token %d [%d, %d)", iv.proc, iv.slots, iv.token, iv.from, iv.to)
	if iv.killedOpen {
		s += fmt.Sprintf(" (killed while held: killed at %d, deadline %d)", iv.killed, iv.deadline)
	}
	return s
}

// TestCheckIntervalsWeights: the process checker rejects what it must,
// weights included (no Redis: recorded intervals made up by hand).
func TestCheckIntervalsWeights(t *testing.T) {
	iv := func(slots []int, weight int, token, from, to int64) interval {
		return interval{slots: slots, weight: weight, token: token, start: from, from: from, to: to}
	}
	cases := []struct {
		name string
		ivs  []interval
		bad  string // "" if it must pass
	}{
		{"fit", []interval{iv([]int{0, 1}, 2, 1, 0, 10), iv([]int{2}, 1, 2, 5, 15)}, ""},
		{"weights over the limit (so a slot shared)", []interval{iv([]int{0, 1}, 2, 1, 0, 10), iv([]int{1, 2}, 2, 2, 5, 15)}, "held twice"},
		{"shared slot", []interval{iv([]int{0, 1}, 2, 1, 0, 10), iv([]int{1}, 1, 2, 5, 15)}, "held twice"},
		{"one slot short", []interval{iv([]int{0}, 2, 1, 0, 10)}, "for weight 2"},
		{"not ascending", []interval{iv([]int{1, 0}, 2, 1, 0, 10)}, "not ascending"},
		{"above the limit", []interval{iv([]int{3}, 1, 1, 0, 10)}, "not ascending in [0, 3)"},
		{"one after another", []interval{iv([]int{0, 1, 2}, 3, 1, 0, 10), iv([]int{0, 1, 2}, 3, 2, 10, 20)}, ""},
	}
	for _, c := range cases {
		err := checkIntervals(c.ivs, 3)
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.bad)
		}
	}
}

// TestCheckRateTokens: the process checker's rate check rejects a window of
// tokens over the rate (weights counted) and accepts grants exactly one
// period apart (a window is half-open).
func TestCheckRateTokens(t *testing.T) {
	iv := func(weight int, token int64) interval { return interval{weight: weight, token: token} }
	rate := redsem.Rate{Limit: 3, Per: time.Second} // 1 000 000 µs
	cases := []struct {
		name string
		ivs  []interval
		bad  bool
	}{
		{"fit", []interval{iv(2, 1_000_000), iv(1, 1_500_000), iv(2, 2_000_000)}, false},
		{"one period apart", []interval{iv(3, 1_000_000), iv(3, 2_000_000)}, false},
		{"one µs short of a period", []interval{iv(3, 1_000_000), iv(1, 1_999_999)}, true},
		{"weights", []interval{iv(1, 10), iv(1, 20), iv(2, 30)}, true},
		{"out of order", []interval{iv(2, 1_500_000), iv(2, 1_000_000)}, true},
	}
	for _, c := range cases {
		err := checkRateTokens(c.ivs, rate)
		if (err != nil) != c.bad {
			t.Errorf("%s: %v, want an error: %v", c.name, err, c.bad)
		}
	}
	if err := checkRateTokens([]interval{iv(9, 1), iv(9, 2)}, redsem.Rate{}); err != nil {
		t.Errorf("no rate: %v", err)
	}
}
