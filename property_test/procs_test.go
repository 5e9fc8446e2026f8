package property_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
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
//
// One run in two uses a keyed family with a total instead (issue 43): three
// members, one hot; each member is checked as the semaphore is (limit,
// slots, tokens, rate), and the family as a whole: the leases held at once
// in all members never weigh more than a total in force when the last of
// them was granted (checkTotal), with one child's SetTotal calls recorded
// and a copy of the first delivered late (it must change nothing), crashed
// holders' grants re-sent by id, and, in a quiet stretch, the members
// nobody streams in idle until their keys expire. While it runs, the
// total's layout (redistest.TotalLayout.Check) and each member's are read
// and checked.

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
	// Family: the semaphore is a keyed family with a total (fair.NewFamily
	// or unfair.NewFamily, FamilyOptions{Total: Total}) of members
	// totalTenants, each of limit Limit; every hold picks a member (the
	// first, "hot", one time in two) and its records name it. One time in
	// famRawOdds a worker takes a lease that no client renews through
	// acquire.lua directly (a crashed holder's, famRawTTL) and re-sends the
	// same request (go-redis re-sends a command whose reply was lost) after
	// 0 to famRawTTL+60 ms, or just after the lease expired: before, it
	// gets the same lease; after, a new grant of the same id or a refusal.
	Family bool `json:"family,omitempty"`
	Total  int  `json:"total,omitempty"`
	// Setter (one child of a family run whose TotalAt > 0): TotalAt ms
	// into the run it sets the total to TotalFirst by settotal.lua directly
	// with a call id, TotalGap ms later to TotalLater by Family.SetTotal,
	// and TotalLate ms after that runs the first call again with its id (a
	// copy delivered late): the copy must change nothing.
	Setter     bool `json:"setter,omitempty"`
	TotalAt    int  `json:"total_at_ms,omitempty"`
	TotalGap   int  `json:"total_gap_ms,omitempty"`
	TotalLate  int  `json:"total_late_ms,omitempty"`
	TotalFirst int  `json:"total_first,omitempty"`
	TotalLater int  `json:"total_later,omitempty"`
}

const (
	famRawOdds = 12                     // one hold in famRawOdds is a crashed holder's, re-sent (Family)
	famRawTTL  = 150 * time.Millisecond // its lease's TTL
	// famQuiet is a family's quiet stretch: longer than the horizon of
	// the keys of a member whose last lease was renewed just before (lease
	// TTL + 2 s, lib_records.lua's extend), with 700 ms for the calls in
	// flight when it starts to end, so the members nobody streams in idle
	// until their keys expire.
	famQuiet = procLease + 2*time.Second + 700*time.Millisecond
)

// member picks the member of a hold: "" for a single semaphore, else
// totalTenants[0] one time in two, another one otherwise.
func (p helperParams) member(rng *rand.Rand) string {
	if !p.Family {
		return ""
	}
	if rng.IntN(2) == 0 {
		return totalTenants[0]
	}
	return totalTenants[1+rng.IntN(len(totalTenants)-1)]
}

// clientArg is ARGV[3] of a member's script call, as core's limitArg makes
// it: the limit, the rate, the client's total and the variant.
func (p helperParams) clientArg() string {
	s := strconv.Itoa(p.Limit)
	if p.RateLimit > 0 {
		s += fmt.Sprintf(":%d:%d", p.RateLimit, p.RatePerMs)
	}
	v := ":u"
	if p.Fair {
		v = ":f"
	}
	return s + "+" + strconv.Itoa(p.Total) + v
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
//	heavy: AcquireN(Weight), called at Start, returned ErrWeight at T
//	     (Family: the total in force was below Weight).
//	raw: acquire.lua run directly (Family), called at Start, granted at T
//	     a lease of famRawTTL that nobody renews or releases: Deadline
//	     is the earliest it may expire (Start + famRawTTL, in whole ms).
//	tcall, tdone: the Setter's call ID ("first", "later", "copy") with
//	     total Weight is sent at T; it returned at T.
type record struct {
	Ev       string `json:"ev"`
	ID       string `json:"id"`
	Member   string `json:"member,omitempty"` // Family: the member
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
	// get returns the semaphore of a member ("": the semaphore).
	var get func(member string) redsem.Semaphore
	var setTotal func(ctx context.Context, total int) error
	var status func(ctx context.Context) (redsem.FamilyStatus, error)
	switch {
	case p.Family && p.Fair:
		f, err := fair.NewFamily(rdb, p.Name, p.Limit, fair.FamilyOptions{Total: p.Total,
			Options: fair.Options{LeaseTTL: procLease, QueueTTL: procQueue, Observer: observe, Rate: p.rate()}})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		get, setTotal, status = func(m string) redsem.Semaphore { return mustGet(f.Get(m)) }, f.SetTotal, f.Status
	case p.Family:
		f, err := unfair.NewFamily(rdb, p.Name, p.Limit, unfair.FamilyOptions{Total: p.Total,
			Options: unfair.Options{LeaseTTL: procLease, Observer: observe, Rate: p.rate()}})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		get, setTotal, status = func(m string) redsem.Semaphore { return mustGet(f.Get(m)) }, f.SetTotal, f.Status
	default:
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
		get = func(string) redsem.Semaphore { return sem }
	}
	begin := time.Now()
	quietFrom := begin.Add(time.Duration(p.QuietAt) * time.Millisecond)
	quietTo := quietFrom.Add(time.Duration(p.Quiet) * time.Millisecond)
	end := time.Now().Add(time.Duration(p.RunMs) * time.Millisecond)
	var wg sync.WaitGroup
	if p.Setter {
		wg.Go(func() { setTotals(rdb, p, begin, setTotal, status, emit) })
	}
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
					resumeHandedLease(get, id[1], rng, p.HoldMax, emit)
				}
			}
			for time.Now().Before(end) {
				if now := time.Now(); p.Quiet > 0 && !now.Before(quietFrom) && now.Before(quietTo) {
					if !p.Streamer || w != 0 {
						time.Sleep(time.Until(quietTo))
						continue
					}
					// The stream: a slot taken and returned at once (in
					// a family, in its first member: the others idle).
					member := ""
					if p.Family {
						member = totalTenants[0]
					}
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					start := time.Now().UnixNano()
					l, err := get(member).Acquire(ctx)
					cancel()
					if err != nil {
						emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "stream: " + err.Error()})
						continue
					}
					emit(record{Ev: "acq", ID: l.ID(), Member: member, Weight: 1, Slots: l.Slots(), Token: l.Token(), Start: start,
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
						resumeHandedLease(get, id, rng, p.HoldMax, emit)
						continue
					}
				}
				member := p.member(rng)
				sem := get(member)
				if p.Family && rng.IntN(famRawOdds) == 0 {
					rawResent(rdb, p, member, rng, emit)
					continue
				}
				if rng.IntN(4) == 0 {
					doHold(sem, member, rng, p.HoldMax, p.RateLimit > 0, emit)
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
				if err != nil && p.Family && errors.Is(err, redsem.ErrWeight) {
					emit(record{Ev: "heavy", Member: member, Weight: n, Start: start, T: time.Now().UnixNano(), Err: err.Error()})
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
					continue
				}
				if err != nil {
					emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf("AcquireN(%d) of %q: %v", n, member, err)})
					continue
				}
				emit(record{Ev: "acq", ID: l.ID(), Member: member, Weight: n, Slots: l.Slots(), Token: l.Token(), Start: start,
					T: time.Now().UnixNano(), Deadline: l.Deadline().UnixNano()})
				time.Sleep(time.Duration(rng.IntN(p.HoldMax*1000+1)) * time.Microsecond)
				if p.Handoff && rng.IntN(3) == 0 && offerLease(rdb, p.Name, member, l, rng, emit) {
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

// mustGet is a family's Get, which cannot fail for the members' names
// (or the child reports it as a failure).
func mustGet[S redsem.Semaphore](s S, err error) redsem.Semaphore {
	if err != nil {
		panic(err)
	}
	return s
}

// setTotals is the Setter's sequence (helperParams.Setter): SetTotal by
// settotal.lua with a call id, Family.SetTotal, then the first call again,
// late, with its id; then Family.Status must still say the second total.
// Each call is recorded before it is sent (tcall) and when it returned
// (tdone).
func setTotals(rdb *redis.Client, p helperParams, begin time.Time, set func(context.Context, int) error,
	status func(context.Context) (redsem.FamilyStatus, error), emit func(record)) {
	at := begin.Add(time.Duration(p.TotalAt) * time.Millisecond)
	id := uuid.NewString()
	fam := core.FamilyKeys(core.DefaultPrefix, p.Name)
	base := strings.TrimSuffix(fam[core.FamTot], "tot")
	rawSet := func(ctx context.Context) error {
		keys := append(slices.Clone(fam), base+"sessions")
		return core.Script(lua.SetTotal).Run(ctx, rdb, keys, base+"ch", "PUBLISH", p.clientArg(), p.TotalFirst, id).Err()
	}
	calls := []struct {
		name  string
		total int
		wait  int // ms after the previous call returned
		run   func(context.Context) error
	}{
		{"first", p.TotalFirst, 0, rawSet},
		{"later", p.TotalLater, p.TotalGap, func(ctx context.Context) error { return set(ctx, p.TotalLater) }},
		{"copy", p.TotalFirst, p.TotalLate, rawSet},
	}
	for _, c := range calls {
		time.Sleep(time.Until(at.Add(time.Duration(c.wait) * time.Millisecond)))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		emit(record{Ev: "tcall", ID: c.name, Weight: c.total, T: time.Now().UnixNano()})
		err := c.run(ctx)
		cancel()
		if err != nil {
			emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf("SetTotal (%s, %d): %v", c.name, c.total, err)})
			return
		}
		at = time.Now()
		emit(record{Ev: "tdone", ID: c.name, Weight: c.total, T: at.UnixNano()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := status(ctx)
	switch {
	case err != nil:
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "Family.Status after the late copy: " + err.Error()})
	case st.Total != p.TotalLater:
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf(
			"a copy of SetTotal(%d) delivered after SetTotal(%d) returned changed the total: Status says %d", p.TotalFirst, p.TotalLater, st.Total)})
	}
}

// rawResent is a crashed holder's acquire of n slots of member, run
// directly (acquire.lua, mode try, lease famRawTTL) and run again with the
// same id after 0 to famRawTTL+60 ms, or just after the first lease
// expired, as go-redis re-sends a command whose reply was lost. Each grant
// is recorded (raw) unless the second one is the first lease again (the
// same token).
func rawResent(rdb *redis.Client, p helperParams, member string, rng *rand.Rand, emit func(record)) {
	k := core.KeysForMember(core.DefaultPrefix, p.Name, member)
	keys := append(slices.Clone(k.List), core.FamilyKeys(core.DefaultPrefix, p.Name)...)
	id := uuid.NewString()
	n := 1 + rng.IntN(p.Limit)
	var first int64 // the first grant's token
	var granted time.Time
	for try := 0; try < 2; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now().UnixNano()
		v, err := core.Script(lua.Acquire).Run(ctx, rdb, keys, k.Chan, "PUBLISH", p.clientArg(),
			id, n, famRawTTL.Milliseconds(), "try", "-", 1000, "crashed", 0, 0).Slice()
		cancel()
		if err != nil || len(v) < 1 {
			emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf("acquire.lua of %q: %v %v", member, v, err)})
			return
		}
		switch v[0] {
		case int64(1):
			if len(v) != 4+n {
				emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf("acquire.lua of %q granted %d slots with %v", member, n, v)})
				return
			}
			token := v[2].(int64)
			var slots []int
			for _, s := range v[4:] {
				slots = append(slots, int(s.(int64)))
			}
			if try == 1 && token == first {
				break // the first lease, still held
			}
			first, granted = token, time.Now()
			emit(record{Ev: "raw", ID: id, Member: member, Weight: n, Slots: slots, Token: token, Start: start, T: granted.UnixNano(),
				Deadline: (start/1e6)*1e6 + famRawTTL.Nanoseconds()})
		case int64(0), int64(-3): // no room; too heavy for the total
		default:
			emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: fmt.Sprintf("acquire.lua of %q: %v", member, v)})
			return
		}
		if try == 0 {
			if first != 0 && rng.IntN(2) == 0 {
				// Just after the lease expired: before any other call
				// on the family drops it.
				time.Sleep(time.Until(granted.Add(famRawTTL + time.Duration(1+rng.IntN(3))*time.Millisecond)))
			} else {
				time.Sleep(time.Duration(rng.IntN(int(famRawTTL.Milliseconds())+61)) * time.Millisecond)
			}
		}
	}
}

// doHold holds a slot through redsem.Do, the entry point users call: fn
// records the grant (acq), works for up to holdMax ms or until its context
// ends, and records the end (rel) before Do releases; a loss is recorded
// (lost), and fn's context must have ended by the lease's Deadline() (plus
// a timer's lateness) when the lease was lost: else a "fail" record.
func doHold(sem redsem.Semaphore, member string, rng *rand.Rand, holdMax int, rated bool, emit func(record)) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now().UnixNano()
	var id string
	hold := time.Duration(rng.IntN(holdMax*1000+1)) * time.Microsecond
	err := redsem.Do(ctx, sem, func(fctx context.Context, l redsem.Lease) error {
		id = l.ID()
		emit(record{Ev: "acq", ID: l.ID(), Member: member, Weight: 1, Slots: l.Slots(), Token: l.Token(), Start: start,
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

// offerLease offers l, of member, on the handoff list for 0-5 ms and
// reports whether another worker took it (it is then no longer this
// worker's to release). An offer is "member|id" ("|id" for a single
// semaphore).
func offerLease(rdb *redis.Client, name, member string, l redsem.Lease, rng *rand.Rand, emit func(record)) bool {
	ctx := context.Background()
	offer := member + "|" + l.ID()
	if err := rdb.LPush(ctx, handoffKey(name), offer).Err(); err != nil {
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "offer: " + err.Error()})
		return false
	}
	time.Sleep(time.Duration(rng.IntN(5001)) * time.Microsecond)
	n, err := rdb.LRem(ctx, handoffKey(name), 1, offer).Result()
	if err != nil {
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "withdraw the offer: " + err.Error()})
		return true // maybe taken: its handle ends by itself, or the end releases it
	}
	return n == 0
}

// resumeHandedLease resumes the lease that another worker handed on
// (offer: "member|id"), holds it and releases it.
func resumeHandedLease(get func(string) redsem.Semaphore, offer string, rng *rand.Rand, holdMax int, emit func(record)) {
	member, id, _ := strings.Cut(offer, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	l, err := get(member).Resume(ctx, id)
	cancel()
	switch {
	case errors.Is(err, redsem.ErrLeaseLost):
		emit(record{Ev: "resfail", ID: id, T: time.Now().UnixNano(), Err: err.Error()})
		return
	case err != nil:
		emit(record{Ev: "fail", T: time.Now().UnixNano(), Err: "resume: " + err.Error()})
		return
	}
	emit(record{Ev: "res", ID: l.ID(), Member: member, Weight: len(l.Slots()), Slots: l.Slots(), Token: l.Token(),
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
	deadline   int64  // the lease's Deadline() when Acquire returned
	killed     int64  // when its process was killed; 0 if it was not
	resumers   []int  // the processes that resumed it (Handoff)
	released   bool   // a Release of one of its handles was called (to)
	relProc    int    // the process that called it; -1 none
	member     string // Family: its member
	crashed    bool   // a crashed holder's (raw): to is the earliest it may expire
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
		if rapid.Bool().Draw(rt, "family") {
			// A family with a total that binds (up to two members' limits).
			p.Family = true
			p.Total = rapid.IntRange(1, 2*p.Limit).Draw(rt, "total")
		}
		if rapid.Bool().Draw(rt, "quiet") {
			// A quiet stretch longer than twice the queue TTL in which one
			// process streams uncontended grants, then everyone at once;
			// in a family, long enough that the members nobody streams in
			// idle until their keys expire.
			p.QuietAt, p.Quiet = 200, int(2*procQueue.Milliseconds())+100
			if p.Family {
				p.Quiet = int(famQuiet.Milliseconds())
			}
			p.RunMs += p.Quiet
		}
		if p.Family && rapid.Bool().Draw(rt, "set_total") {
			// One child sets the total twice, then a copy of its first
			// call comes late (0: no bound).
			p.TotalFirst = rapid.IntRange(0, 2*p.Limit).Draw(rt, "total_first")
			p.TotalLater = rapid.IntRange(0, 2*p.Limit).Draw(rt, "total_later")
			if p.TotalLater == p.TotalFirst {
				p.TotalLater = (p.TotalFirst + 1) % (2*p.Limit + 1)
			}
			p.TotalAt = rapid.IntRange(50, p.RunMs-800).Draw(rt, "total_at_ms")
			p.TotalGap = rapid.IntRange(0, 200).Draw(rt, "total_gap_ms")
			p.TotalLate = rapid.IntRange(20, 400).Draw(rt, "total_late_ms")
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
		trace("%s: fair %v limit %d rate %v processes %d workers %d quiet %d ms, kills %v, faults %v, handoff %v, family %v total %d, set total at %d ms: %d then %d",
			t.Name(), p.Fair, p.Limit, p.rate(), nproc, p.Workers, p.Quiet, kills, p.Faults, p.Handoff, p.Family, p.Total, p.TotalAt, p.TotalFirst, p.TotalLater)
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
	launch := time.Now() // before any child's start: its run begins later
	for i := range children {
		q := p
		q.Seed = uint64(i)*7919 + uint64(time.Now().UnixNano())
		q.Streamer = p.Quiet > 0 && i == 0
		q.Setter = p.TotalAt > 0 && i == nproc-1
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
	if p.Family {
		// Until the Setter may have sent its first call, the total is
		// the one the clients were built with; after, at most the
		// highest it sets (0: unbounded, not checked).
		firstSet := launch.Add(time.Duration(p.TotalAt) * time.Millisecond)
		hi := p.Total
		if p.TotalFirst == 0 || p.TotalLater == 0 {
			hi = 0
		} else {
			hi = max(hi, p.TotalFirst, p.TotalLater)
		}
		bound := func(t time.Time) int {
			if p.TotalAt == 0 || t.Before(firstSet) {
				return p.Total
			}
			return hi
		}
		go pollFamily(rdb, p.Name, p.Limit, bound, stopPoll, polled)
	} else {
		go pollLayout(rdb, core.KeysFor(core.DefaultPrefix, p.Name).List, p.Limit, stopPoll, polled)
	}
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
	handed, raws := 0, 0
	var heavy []record                                         // ErrWeight (Family)
	tcalls, tdones := map[string]record{}, map[string]record{} // the Setter's calls
	for _, pr := range all {
		i, r := pr.proc, pr.r
		c := children[i]
		switch r.Ev {
		case "acq":
			iv := &interval{proc: i, id: r.ID, weight: r.Weight, slots: r.Slots, token: r.Token, start: r.Start, from: r.T, to: -1,
				deadline: r.Deadline, killed: c.killed, relProc: -1, member: r.Member}
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
			if r.Token != iv.token || !slices.Equal(r.Slots, iv.slots) || r.Member != iv.member {
				fatalf(rt, "process %d resumed %s of %q with slots %v token %d: the grant's were %v and %d of %q", i, r.ID, r.Member, r.Slots, r.Token, iv.slots, iv.token, iv.member)
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
		case "raw":
			// A crashed holder's lease: held from the reply until at least
			// its earliest expiry; the server's deadline is at most its
			// TTL after the reply.
			ivs = append(ivs, interval{proc: i, id: r.ID, member: r.Member, weight: r.Weight, slots: r.Slots, token: r.Token,
				start: r.Start, from: r.T, to: max(r.T, r.Deadline), deadline: r.Deadline, crashed: true, relProc: -1})
			lastDeadline = max(lastDeadline, r.T+famRawTTL.Nanoseconds())
			raws++
		case "heavy":
			heavy = append(heavy, r)
		case "tcall":
			tcalls[r.ID] = r
		case "tdone":
			tdones[r.ID] = r
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
		if p.Family {
			rt.Logf("members' keys found expired (idle) %d times", lp.expired)
			trace("members' keys found expired (idle) %d times", lp.expired)
		}
	}
	if len(ivs) == 0 {
		fatalf(rt, "no lease was granted at all")
	}
	// Each member (the semaphore, outside a family) on its own: limit,
	// slots, tokens, rate.
	byMember := map[string][]interval{}
	for _, iv := range ivs {
		byMember[iv.member] = append(byMember[iv.member], iv)
	}
	for _, m := range slices.Sorted(maps.Keys(byMember)) {
		if err := checkIntervals(byMember[m], p.Limit); err != nil {
			fatalf(rt, "member %q: %v", m, err)
		}
		if err := checkRateTokens(byMember[m], p.rate()); err != nil {
			fatalf(rt, "member %q: %v", m, err)
		}
	}
	tl := totalTimeline{initial: p.Total}
	if p.Family {
		// The total in force: the clients' until the Setter's first
		// call, then each call's total from its return (both while it
		// runs, and for good if its process died with it in flight). The
		// late copy changes nothing.
		for _, call := range []string{"first", "later"} {
			c, ok := tcalls[call]
			if !ok {
				break
			}
			to := int64(math.MaxInt64)
			if d, ok := tdones[call]; ok {
				to = d.T
			}
			tl.changes = append(tl.changes, totalChange{from: c.T, to: to, value: c.Weight})
			if to == math.MaxInt64 {
				break
			}
		}
		if err := checkTotal(ivs, tl); err != nil {
			fatalf(rt, "%v", err)
		}
		for _, r := range heavy {
			if lo, _ := tl.span(r.Start, r.T); r.Weight <= lo {
				fatalf(rt, "AcquireN(%d) of %q returned ErrWeight while the total in force was at least %d", r.Weight, r.Member, lo)
			}
		}
		rt.Logf("family: total %d, %d members, %d heavier than the total, %d crashed holders' grants; SetTotal: %v",
			p.Total, len(byMember), len(heavy), raws, tl.changes)
		trace("family: total %d, %d heavier than the total, %d crashed holders' grants; SetTotal: %v", p.Total, len(heavy), raws, tl.changes)
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
	members := []string{""}
	get := func(string) redsem.Semaphore { return mustNew(rdb, p) }
	if p.Family {
		f := newProcFamily(rdb, p)
		defer f.Close()
		members, get = totalTenants, func(m string) redsem.Semaphore { return mustGet(f.Get(m)) }
		fst, err := f.Status(ctx)
		if err != nil {
			fatalf(rt, "family status: %v", err)
		}
		lo, hi := tl.span(time.Now().UnixNano(), time.Now().UnixNano())
		if lo == hi && fst.Total != totalOf(lo) {
			fatalf(rt, "the family's total is %d after the SetTotal calls %v (and the late copy of the first): want %d", fst.Total, tl.changes, totalOf(lo))
		}
		if fst.Held != 0 {
			fatalf(rt, "after every process ended and every deadline passed, the family's total counts %d slots held", fst.Held)
		}
	}
	for _, m := range members {
		st, err := get(m).Status(ctx)
		if err != nil {
			fatalf(rt, "status of %q: %v", m, err)
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
			fatalf(rt, "after every process ended and every deadline passed (last %d, now %d): %q has holders %v, %d waiters",
				lastDeadline, time.Now().UnixNano(), m, who, len(st.Waiters))
		}
	}
}

// totalOf is a total as Family.Status reports it: 0 for none.
func totalOf(t int) int {
	if t == math.MaxInt {
		return 0
	}
	return t
}

// totalChange is a SetTotal call to value (0: none), sent at from,
// returned at to (math.MaxInt64: its process died with it in flight).
type totalChange struct {
	from, to int64
	value    int
}

// totalTimeline is what the checker knows of a family's total in force:
// initial (the clients') until the first change is sent, then each
// change's value once it returned, and both the old and the new value
// while it runs.
type totalTimeline struct {
	initial int
	changes []totalChange // in order, one after another
}

func (c totalChange) String() string {
	return fmt.Sprintf("%d in [%d, %d]", c.value, c.from, c.to)
}

// span returns the lowest and the highest total that may have been in
// force at some instant in [a, b], no bound counting as math.MaxInt.
func (tl totalTimeline) span(a, b int64) (lo, hi int) {
	lo, hi = math.MaxInt, 0
	add := func(v int) {
		if v == 0 {
			v = math.MaxInt
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	cur, after := tl.initial, int64(math.MinInt64) // cur is in force in (after, next change's from)
	for _, c := range tl.changes {
		if after <= b && a <= c.from {
			add(cur)
		}
		if c.from <= b && a <= c.to {
			add(cur)
			add(c.value)
		}
		cur, after = c.value, c.to
		if after == math.MaxInt64 {
			return lo, hi
		}
	}
	if after <= b {
		add(cur)
	}
	return lo, hi
}

// checkTotal proves, over the recorded leases of every member of a
// family, that the leases certainly held at once never weigh more than the
// total allowed: the last of them to be granted was granted while all the
// others were held, and needed room for all of them in the total then in
// force (lowering the total takes nothing back). That grant came during
// its Acquire call and after every other call began: at some instant in
// [start, from] of one of them, after the latest start. So at every
// instant, the overlapping leases weigh at most the highest total
// possibly in force at such an instant.
func checkTotal(ivs []interval, tl totalTimeline) error {
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
		if c := cmpInt(a.t, b.t); c != 0 || a.open == b.open {
			return c
		}
		if !a.open {
			return -1
		}
		return 1
	})
	live := map[int]bool{}
	sum := 0
	for _, e := range evs {
		if !e.open {
			delete(live, e.i)
			sum -= ivs[e.i].weight
			continue
		}
		live[e.i] = true
		sum += ivs[e.i].weight
		var latest int64 // the latest Acquire call's start
		for j := range live {
			latest = max(latest, ivs[j].start)
		}
		b := 0
		for j := range live {
			if iv := ivs[j]; iv.from >= latest {
				_, hi := tl.span(max(iv.start, latest), iv.from)
				b = max(b, hi)
			}
		}
		if sum > b {
			var s []string
			for j := range live {
				s = append(s, fmt.Sprintf("%s (asked at %d)", fmtIv(ivs[j]), ivs[j].start))
			}
			slices.Sort(s)
			return fmt.Errorf("%d leases of %d slots in all held at once in the family at %d, the highest total possibly in force when the last of them was granted %d (SetTotal calls %v):\n  %s",
				len(live), sum, e.t, b, tl.changes, strings.Join(s, "\n  "))
		}
	}
	return nil
}

// layoutPoll is what pollLayout found: the first problems, or the first
// error, and how many snapshots it checked.
type layoutPoll struct {
	problems redistest.LayoutProblems
	err      error
	reads    int
	expired  int // pollFamily: times a member's keys were gone after they had been seen
}

// pollFamily is pollLayout for a family with a total: every few ms it
// reads the total's layout with its members' (redistest.ReadTotal) and
// checks it (TotalLayout.Check, with the highest total that may have been
// in force, bound(the time the read returned), and the limit), then each
// member's keys (ReadLayout, Layout.Check). A member's sessions key is its
// shard's, which every member shares: only the sessions its own waiters
// name are checked against its horizon (a member's keys outlive the
// sessions of its waiters), and one of them that a call on another
// member pruned once it died counts as dead, not missing; its queue's arrival numbers are the family's,
// checked against f:tot's _seq.
func pollFamily(rdb *redis.Client, name string, limit int, bound func(time.Time) int, stop <-chan struct{}, out chan<- layoutPoll) {
	var r layoutPoll
	defer func() { out <- r }()
	members := map[string][]string{}
	for _, m := range totalTenants {
		members[m] = core.KeysForMember(core.DefaultPrefix, name, m).List
	}
	fam := core.FamilyKeys(core.DefaultPrefix, name)
	seen := map[string]bool{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tl, err := redistest.ReadTotal(ctx, rdb, fam, members)
		cancel()
		if err != nil {
			r.err = err
			return
		}
		r.reads++
		if p := tl.Check(bound(time.Now()), limit); !p.OK() {
			r.problems = p
			return
		}
		for _, m := range totalTenants {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l, err := redistest.ReadLayout(ctx, rdb, members[m])
			var seq string
			if err == nil {
				// A member's queue is ordered by the family's arrival
				// numbers (f:tot's _seq, read after the member's keys).
				seq, err = rdb.HGet(ctx, fam[core.FamTot], "_seq").Result()
				if errors.Is(err, redis.Nil) {
					seq, err = "0", nil
				}
			}
			cancel()
			if err != nil {
				r.err = err
				return
			}
			switch _, live := l.Meta["_hz"]; {
			case live:
				l.Meta["_seq"] = seq
				seen[m] = true
			case seen[m]:
				seen[m] = false
				r.expired++
			}
			named := map[string]bool{}
			for _, z := range l.Queue {
				if sid, _, ok := parseWaiter(l.Meta[z.Member.(string)]); ok {
					named[sid] = true
				}
			}
			l.Sessions = slices.DeleteFunc(l.Sessions, func(z redis.Z) bool {
				if !named[z.Member.(string)] {
					return true
				}
				delete(named, z.Member.(string))
				return false
			})
			for sid := range named {
				// Pruned from the shared set by a call on another member
				// once it died (lib_prune.lua): this member's waiters of
				// it go at its next call. Listed here as long dead.
				l.Sessions = append(l.Sessions, redis.Z{Member: sid})
			}
			if p := l.Check(limit); !p.OK() {
				r.problems = p
				return
			}
		}
	}
}

// parseWaiter returns the session of a waiter record "W|session|n|...".
func parseWaiter(rec string) (session string, n int, ok bool) {
	f := strings.Split(rec, "|")
	if len(f) < 3 || f[0] != "W" {
		return "", 0, false
	}
	n, err := strconv.Atoi(f[2])
	return f[1], n, err == nil
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

// procFamily is a family as the children build it, for its Status.
type procFamily interface {
	Get(key string) (redsem.Semaphore, error)
	Status(ctx context.Context) (redsem.FamilyStatus, error)
	Close() error
}

type fairProcFamily struct{ *fair.Family }

func (f fairProcFamily) Get(key string) (redsem.Semaphore, error) { return f.Family.Get(key) }

type unfairProcFamily struct{ *unfair.Family }

func (f unfairProcFamily) Get(key string) (redsem.Semaphore, error) { return f.Family.Get(key) }

// newProcFamily builds the family of p with its total, as the children do.
func newProcFamily(rdb *redis.Client, p helperParams) procFamily {
	if p.Fair {
		f, _ := fair.NewFamily(rdb, p.Name, p.Limit, fair.FamilyOptions{Total: p.Total, Options: fair.Options{Rate: p.rate()}})
		return fairProcFamily{f}
	}
	f, _ := unfair.NewFamily(rdb, p.Name, p.Limit, unfair.FamilyOptions{Total: p.Total, Options: unfair.Options{Rate: p.rate()}})
	return unfairProcFamily{f}
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
			if a.killedOpen || a.lost || a.crashed {
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
	if iv.member != "" {
		s = fmt.Sprintf("%q: %s", iv.member, s)
	}
	if iv.crashed {
		s += " (a crashed holder's: held until it expired)"
	}
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

// TestCheckTotal: the process checker's family check rejects leases held
// at once above the total in force during their Acquire calls, accepts
// what a lowering left held, and knows which totals a SetTotal in flight
// or never returned may have put in force (no Redis: made-up intervals).
func TestCheckTotal(t *testing.T) {
	iv := func(member string, weight int, start, from, to int64) interval {
		return interval{member: member, weight: weight, start: start, from: from, to: to}
	}
	// 3 until a SetTotal(1) sent at 100 returns at 110; then SetTotal(0)
	// (none) sent at 200 never returns.
	tl := totalTimeline{initial: 3, changes: []totalChange{{100, 110, 1}, {200, math.MaxInt64, 0}}}
	spans := []struct {
		a, b   int64
		lo, hi int
	}{
		{0, 50, 3, 3}, {0, 100, 1, 3}, {105, 105, 1, 3}, {111, 150, 1, 1}, {150, 250, 1, math.MaxInt}, {300, 300, 1, math.MaxInt},
	}
	for _, c := range spans {
		if lo, hi := tl.span(c.a, c.b); lo != c.lo || hi != c.hi {
			t.Errorf("span(%d, %d) = %d, %d; want %d, %d", c.a, c.b, lo, hi, c.lo, c.hi)
		}
	}
	cases := []struct {
		name string
		ivs  []interval
		bad  bool
	}{
		{"fit across members", []interval{iv("hot", 2, 0, 10, 90), iv("a", 1, 0, 20, 90)}, false},
		{"over the total across members", []interval{iv("hot", 2, 0, 10, 90), iv("a", 2, 0, 20, 90)}, true},
		{"held across a lowering", []interval{iv("hot", 2, 0, 10, 150), iv("a", 1, 0, 20, 150)}, false},
		{"granted after the lowering returned", []interval{iv("hot", 1, 0, 10, 150), iv("a", 1, 120, 130, 150)}, true},
		{"asked while the lowering ran", []interval{iv("hot", 2, 0, 10, 150), iv("a", 1, 90, 105, 150)}, false},
		{"one after another", []interval{iv("hot", 1, 120, 130, 140), iv("a", 1, 120, 140, 150)}, false},
		{"maybe unbounded", []interval{iv("hot", 1, 120, 130, 300), iv("a", 5, 250, 260, 300)}, false},
	}
	for _, c := range cases {
		if err := checkTotal(c.ivs, tl); (err != nil) != c.bad {
			t.Errorf("%s: %v, want an error: %v", c.name, err, c.bad)
		}
	}
}
