package faults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A failover that loses acknowledged grants (docs/reliability.md, "Replicas
// and failover", which quotes the figures these tests log). The primary's
// replicas are stopped (SIGSTOP) and their replication links closed
// (CLIENT KILL TYPE replica on the primary, so that nothing the primary
// writes next reaches them, not even through the kernel's socket buffers);
// clients are granted every slot of each semaphore on the primary (the
// zombies); the primary is killed (SIGKILL), the replicas resumed and one is
// promoted. The new primary does not know the zombies, and admits others
// while the zombies still believe they hold a slot. Measured: how many
// believe at once and for how long, whether a fenced store refuses the
// zombies once the new holder of their slot wrote, the tokens on both sides
// of the promotion, and what MinReplicas changes.

// deadNodeRedial is go-redis's redial of a dead node's address (a pool
// whose dials kept failing dials again once a second, in a goroutine of
// its own, until it succeeds or the pool is closed): after Close it stops
// within a second, later than the leak check looks.
var deadNodeRedial = redistest.IgnoreFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

// lossTTL is the lease TTL of the semaphores watched: longer than the
// failovers take here, so that zombies still believe when the new primary
// admits others.
const lossTTL = 2 * time.Second

// lossLimit is their limit.
const lossLimit = 2

// lossWorld is a primary whose replicas can be made to miss writes, and a
// way to promote one of them.
type lossWorld struct {
	primary  *redistest.Server
	replicas []*redistest.Server
	// promote makes a replica primary (the old one is dead by then) and
	// returns a client of it.
	promote func() *redis.Client
}

// believed is one lease as its holder saw it: from its grant until it saw
// the lease end (Done) or passed its Deadline, or released it.
type believed struct {
	from, to time.Time
	zombie   bool
	byHand   bool // a zombie that renews by hand (never): it stops at its Deadline
	lost     bool // a zombie that stopped on Done (ErrLeaseLost), not at its Deadline
	slot     int
	token    int64
}

// fenceWrite is one write of a holder to the fenced store.
type fenceWrite struct {
	call, ret time.Time
	zombie    bool
	slot      int
	token     int64
	err       error
}

// lossSem is one semaphore watched through the failover.
type lossSem struct {
	label    string
	v        variant
	name     string
	min      int    // MinReplicas
	s        closer // auto-renewing
	byHand   closer // the same semaphore, DisableAutoRenew: a holder that renews by hand (never, here)
	resource string

	mu       sync.Mutex
	leases   []believed
	writes   []fenceWrite
	zombies  []redsem.Lease
	refused  int // grants refused with ErrNotReplicated before the promotion
	errs     map[string]int
	warmMax  int64 // highest token issued before the replicas stopped
	afterTok []int64
	first    time.Time // the first grant after the promotion
}

func (m *lossSem) add(b believed) {
	m.mu.Lock()
	m.leases = append(m.leases, b)
	m.mu.Unlock()
}

// write checks the fence of l in guard and records the outcome.
func (m *lossSem) write(ctx context.Context, guard fencing.Guard, l redsem.Lease, zombie bool) error {
	w := fenceWrite{call: time.Now(), zombie: zombie, slot: l.Slot(), token: l.Token()}
	w.err = guard.Check(ctx, fencing.Of(m.resource, l))
	w.ret = time.Now()
	m.mu.Lock()
	m.writes = append(m.writes, w)
	m.mu.Unlock()
	return w.err
}

// believes reports whether the holder of l may still act: its lease not
// ended, its Deadline not passed.
func believes(l redsem.Lease) bool {
	select {
	case <-l.Done():
		return false
	default:
		return time.Now().Before(l.Deadline())
	}
}

// runLoss drives the scenario on world w for the semaphores sems and checks
// what the design promises; it returns when the new primary has served
// lossTTL plus a margin and every zombie has stopped.
func runLoss(t *testing.T, w lossWorld, sems []*lossSem) {
	ctx := redistest.Ctx(t, 90*time.Second)
	guard, err := fencing.NewRedisGuard(redistest.Start(t).Client(t), fencing.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc := w.primary.Client(t)

	// Every semaphore used once, and its state on every replica.
	for _, m := range sems {
		l, err := m.s.TryAcquire(ctx)
		// With MinReplicas, a replica that is up may still ack after
		// ReplicaTimeout on a loaded machine (seen beside a CPU hog): the
		// warm-up only needs one grant, so it asks again.
		for tries := 1; errors.Is(err, redsem.ErrNotReplicated) && tries < 20; tries++ {
			l, err = m.s.TryAcquire(ctx)
		}
		if err != nil {
			t.Fatalf("%s: warm-up: %v", m.label, err)
		}
		m.warmMax = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	conn := pc.Conn()
	// A key in the semaphores' hash slot, which the primary serves on a
	// cluster too.
	syncKey := strings.SplitAfter(core.KeysFor(core.DefaultPrefix, sems[0].name).List[0], "}")[0] + ":sync"
	if _, err := conn.Set(ctx, syncKey, 1, time.Minute).Result(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, len(w.replicas), 10*time.Second).Result(); err != nil || int(n) != len(w.replicas) {
		t.Fatalf("replicas in sync: %d of %d, %v", n, len(w.replicas), err)
	}
	_ = conn.Close()

	// The replicas stop, and miss everything from here on.
	began := time.Now()
	for _, r := range w.replicas {
		r.Pause(t)
	}
	paused := true
	defer func() {
		if paused {
			for _, r := range w.replicas {
				r.Resume(t)
			}
		}
	}()
	if err := pc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "replication links closed", func() error {
		info, err := pc.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "connected_slaves:0") {
			return errorf("still connected (%v)", err)
		}
		return nil
	})

	// The zombies: every slot of each semaphore without MinReplicas, one
	// lease auto-renewed and one renewed by hand (never). With MinReplicas
	// every grant is refused.
	var wg sync.WaitGroup
	for _, m := range sems {
		if m.min > 0 {
			for range lossLimit {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := m.s.TryAcquire(ctx)
					if !errors.Is(err, redsem.ErrNotReplicated) {
						t.Errorf("%s: TryAcquire with the replicas stopped: %v, want ErrNotReplicated", m.label, err)
						return
					}
					m.mu.Lock()
					m.refused++
					m.mu.Unlock()
				}()
			}
			continue
		}
		for _, s := range []closer{m.s, m.byHand} {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("%s: zombie grant: %v", m.label, err)
			}
			m.zombies = append(m.zombies, l)
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Holders: each zombie writes to the store every few ms while it
	// believes, and once more after; workers acquire, write, hold and
	// release until stop.
	stop := make(chan struct{})
	var work sync.WaitGroup
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		work.Wait()
	}()
	for _, m := range sems {
		for i, z := range m.zombies {
			work.Add(1)
			go func() {
				defer work.Done()
				from := time.Now()
				for believes(z) {
					_ = m.write(ctx, guard, z, true)
					select {
					case <-z.Done():
					case <-time.After(5 * time.Millisecond):
					}
				}
				b := believed{from: from, to: time.Now(), zombie: true, byHand: i == 1, slot: z.Slot(), token: z.Token()}
				select {
				case <-z.Done():
					b.lost = b.to.Before(z.Deadline())
				default:
				}
				if !b.lost {
					b.to = z.Deadline() // stopped by its Deadline, seen up to 5 ms late
				}
				m.add(b)
				_ = m.write(ctx, guard, z, true) // once more, after it stopped: a zombie that does not look
			}()
		}
		for range lossLimit + 1 {
			work.Add(1)
			go func() {
				defer work.Done()
				m.work(ctx, guard, stop)
			}()
		}
	}

	t.Logf("zombies and refusals made; replicas stopped for %v", time.Since(began).Round(time.Millisecond))
	killed := time.Now()
	w.primary.Kill(t)
	for _, r := range w.replicas {
		r.Resume(t)
	}
	paused = false
	nc := w.promote()
	promoted := time.Now()

	// The new primary lost the zombies' grants.
	for _, m := range sems {
		st, err := statusOf(ctx, nc, m.name)
		if err != nil {
			t.Fatalf("%s: status on the new primary: %v", m.label, err)
		}
		for _, h := range st.Holders {
			for _, z := range m.zombies {
				if h.ID == z.ID() {
					t.Fatalf("%s: the new primary holds zombie %s: the replica had the grant, no data was lost", m.label, z.ID())
				}
			}
		}
	}

	t.Logf("promoted %v after the kill", promoted.Sub(killed).Round(time.Millisecond))
	// Run for a lease TTL and a margin after the promotion, until every
	// semaphore granted again (with MinReplicas: once the other replica
	// follows the new primary) and every zombie has ended.
	time.Sleep(time.Until(promoted.Add(lossTTL + 300*time.Millisecond)))
	for _, m := range sems {
		eventually(t, 20*time.Second, m.label+": a grant after the promotion", func() error {
			m.mu.Lock()
			defer m.mu.Unlock()
			if len(m.afterTok) == 0 {
				return errorf("none (errors %v)", m.errs)
			}
			return nil
		})
	}
	for _, m := range sems {
		for _, z := range m.zombies {
			redistest.WaitFor(t, max(time.Until(z.Deadline().Add(2*time.Second)), 0), "the zombie's end", func() (bool, error) {
				return !believes(z) && z.Err() != nil, nil
			})
			if !errors.Is(z.Err(), redsem.ErrLeaseLost) {
				t.Errorf("%s: zombie ended with Err %v, want ErrLeaseLost", m.label, z.Err())
			}
		}
	}
	close(stop)
	work.Wait()
	t.Logf("failover: primary killed, new primary serving %v later", promoted.Sub(killed).Round(time.Millisecond))
	for _, m := range sems {
		m.check(t, killed, promoted)
	}
}

// work is one worker: acquire, write to the store, hold a few ms, release,
// until stop.
func (m *lossSem) work(ctx context.Context, guard fencing.Guard, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		l, err := m.s.Acquire(actx)
		cancel()
		if err != nil {
			m.mu.Lock()
			m.errs[errKind(err)]++
			m.mu.Unlock()
			continue
		}
		from := time.Now()
		m.mu.Lock()
		m.afterTok = append(m.afterTok, l.Token())
		if m.first.IsZero() {
			m.first = from
		}
		m.mu.Unlock()
		_ = m.write(ctx, guard, l, false)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-l.Done():
		}
		to := time.Now()
		if dl := l.Deadline(); dl.Before(to) {
			to = dl
		}
		m.add(believed{from: from, to: to, slot: l.Slot(), token: l.Token()})
		_ = l.Release(ctx)
	}
}

// errKind names an error for the log.
func errKind(err error) string {
	switch {
	case errors.Is(err, redsem.ErrNotReplicated):
		return "ErrNotReplicated"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return err.Error()
}

// overlap sweeps the believed leases: the peak number at once (of all, and
// of those the new primary granted), the total time more than limit
// believed, and when the last such moment ended.
func overlap(leases []believed, limit int) (peak, peakNew int, excess time.Duration, lastExcess time.Time) {
	type edge struct {
		at     time.Time
		d      int
		zombie bool
	}
	var edges []edge
	for _, b := range leases {
		edges = append(edges, edge{b.from, 1, b.zombie}, edge{b.to, -1, b.zombie})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // ends first
	})
	n, nNew := 0, 0
	var since time.Time
	for _, e := range edges {
		if n > limit {
			excess += e.at.Sub(since)
			lastExcess = e.at
		}
		n += e.d
		if !e.zombie {
			nNew += e.d
		}
		peak, peakNew = max(peak, n), max(peakNew, nNew)
		since = e.at
	}
	return peak, peakNew, excess, lastExcess
}

// check asserts what the design promises for m and logs the measurements.
func (m *lossSem) check(t *testing.T, killed, promoted time.Time) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	peak, peakNew, excess, last := overlap(m.leases, lossLimit)
	if peakNew > lossLimit {
		t.Errorf("%s: %d holders granted by the new primary at once, limit %d", m.label, peakNew, lossLimit)
	}
	bound := lossLimit
	if m.min == 0 {
		bound = 2 * lossLimit // the zombies, and the new primary's holders
	}
	if peak > bound {
		t.Errorf("%s: %d holders believed at once, want at most %d", m.label, peak, bound)
	}
	if m.min > 0 && m.refused == 0 {
		t.Errorf("%s: no grant refused while the replicas were stopped", m.label)
	}
	if len(m.afterTok) == 0 {
		t.Errorf("%s: no grant after the promotion (errors %v)", m.label, m.errs)
	}

	// Tokens: above every token the new primary's data knew, and, with one
	// clock for both primaries, above every token the lost grants had.
	var lost []int64
	for _, z := range m.zombies {
		lost = append(lost, z.Token())
	}
	minAfter := slices.Min(append(m.afterTok, 1<<62))
	if minAfter <= m.warmMax {
		t.Errorf("%s: token %d after the promotion, not above %d that the new primary knew", m.label, minAfter, m.warmMax)
	}
	tokens := "no lost grant"
	if len(lost) > 0 {
		maxLost := slices.Max(lost)
		tokens = fmt.Sprintf("lowest after the promotion %d µs above the highest lost one", minAfter-maxLost)
		if minAfter <= maxLost {
			t.Errorf("%s: token %d after the promotion, not above lost token %d (one clock for both primaries)", m.label, minAfter, maxLost)
		}
	}

	// Fencing: no zombie write accepted once a newer holder of its slot
	// wrote; no write of a new holder refused.
	zombieOK, zombieRefused, newRefused := 0, 0, 0
	for _, z := range m.writes {
		switch {
		case !z.zombie && z.err != nil:
			newRefused++
			t.Errorf("%s: a new holder's write (slot %d, token %d) refused: %v", m.label, z.slot, z.token, z.err)
		case z.zombie && z.err == nil:
			zombieOK++
			for _, w := range m.writes {
				if !w.zombie && w.err == nil && w.slot == z.slot && w.token > z.token && w.ret.Before(z.call) {
					t.Errorf("%s: zombie write (slot %d, token %d) accepted %v after the slot's new holder (token %d) wrote",
						m.label, z.slot, z.token, z.call.Sub(w.ret).Round(time.Microsecond), w.token)
				}
			}
		case z.zombie && errors.Is(z.err, fencing.ErrStale):
			zombieRefused++
		case z.zombie:
			t.Errorf("%s: zombie write: %v", m.label, z.err)
		}
	}
	for _, b := range m.leases {
		if !b.zombie {
			continue
		}
		how := "auto-renewed zombie"
		if b.byHand {
			how = "zombie renewed by hand"
		}
		end := "stopped at its Deadline"
		if b.lost {
			end = "learned the loss (Done, ErrLeaseLost) before its Deadline"
		}
		t.Logf("%s: %s believed until %v after the promotion: %s", m.label, how, b.to.Sub(promoted).Round(time.Millisecond), end)
	}
	excessFrom := "none"
	if excess > 0 {
		excessFrom = fmt.Sprintf("%v in all, the last %v after the promotion (%v after the kill)", excess.Round(time.Millisecond),
			last.Sub(promoted).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond))
	}
	t.Logf("%s: peak %d believed holders (new primary's alone %d, limit %d); above the limit: %s; grants refused before the promotion (ErrNotReplicated): %d; "+
		"zombie writes accepted %d, refused as stale %d; new holders' writes refused %d; tokens: %s; %d grants after the promotion, the first %v after it; errors %v",
		m.label, peak, peakNew, lossLimit, excessFrom, m.refused, zombieOK, zombieRefused, newRefused, tokens, len(m.afterTok),
		m.first.Sub(promoted).Round(time.Millisecond), m.errs)
}

// lossSems builds, for each variant, a semaphore without MinReplicas (and
// its twin that renews by hand) and, with minReplicas > 0, one with it;
// name gives each its name from a label.
func lossSems(t *testing.T, c redis.UniversalClient, minReplicas int, name func(label string) string) []*lossSem {
	var sems []*lossSem
	mins := []int{0}
	if minReplicas > 0 {
		mins = append(mins, minReplicas)
	}
	for _, v := range variants {
		for _, min := range mins {
			label := v.name
			if min > 0 {
				label += fmt.Sprintf("/MinReplicas=%d", min)
			}
			n := name(strings.ReplaceAll(label, "/", "-"))
			o := opts{LeaseTTL: lossTTL, QueueTTL: time.Second, Fallback: 100 * time.Millisecond,
				MinReplicas: min, ReplicaTimeout: 300 * time.Millisecond}
			m := &lossSem{label: label, v: v, name: n, min: min, s: v.new(t, c, n, lossLimit, o),
				resource: "res-" + n, errs: map[string]int{}}
			if min == 0 {
				o.NoAutoRenew = true
				m.byHand = v.new(t, c, n, lossLimit, o)
			}
			sems = append(sems, m)
		}
	}
	return sems
}

// Sentinel: a primary with two replicas, both of which miss the zombies'
// grants; SENTINEL FAILOVER promotes one after the primary's SIGKILL and
// turns the other into its replica. The semaphores with MinReplicas 1 are
// refused every grant while the replicas are stopped, and are granted
// again once the remaining replica follows the new primary.
func TestFailoverLosesGrantsSentinel(t *testing.T) {
	skipShort(t)
	redistest.CheckLeaks(t, deadNodeRedial)
	primary := redistest.Start(t)
	replicas := []*redistest.Server{primary.StartReplica(t), primary.StartReplica(t)}
	sen := redistest.StartSentinel(t, primary, 2)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: redistest.SentinelMaster, SentinelAddrs: []string{sen.Addr},
		ContextTimeoutEnabled: true, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { _ = fc.Close() })
	sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
	t.Cleanup(func() { _ = sc.Close() })
	ctx := redistest.Ctx(t, 90*time.Second)
	base := redistest.Name(t)
	sems := lossSems(t, fc, 1, func(label string) string { return base + "-" + label })
	runLoss(t, lossWorld{primary: primary, replicas: replicas, promote: func() *redis.Client {
		// Forced (no quorum of its own needed); retried while Sentinel sees
		// no replica fit to promote yet (one that just resumed).
		eventually(t, 20*time.Second, "SENTINEL FAILOVER accepted", func() error {
			err := sc.Failover(ctx, redistest.SentinelMaster).Err()
			if err != nil && !strings.Contains(err.Error(), "INPROG") {
				return err
			}
			return nil
		})
		var promoted *redistest.Server
		eventually(t, 30*time.Second, "a replica promoted", func() error {
			addr, err := sc.GetMasterAddrByName(ctx, redistest.SentinelMaster).Result()
			if err != nil {
				return err
			}
			for _, r := range replicas {
				if addr[0]+":"+addr[1] == r.Addr {
					promoted = r
				}
			}
			if promoted == nil {
				return errorf("master %v", addr)
			}
			return nil
		})
		return promoted.Client(t)
	}}, sems)
}

// Cluster: the master owning the semaphores' slot, its replica missing the
// zombies' grants, killed; CLUSTER FAILOVER FORCE (TAKEOVER if that does not
// settle) on the replica. No MinReplicas here: the new master has no
// replica left to acknowledge.
func TestFailoverLosesGrantsCluster(t *testing.T) {
	skipShort(t)
	redistest.CheckLeaks(t, deadNodeRedial)
	cl := redistest.StartCluster(t, 3, 1)
	cc := cl.Client(t)
	ctx := redistest.Ctx(t, 90*time.Second)
	// Every semaphore on master 0: names are tried until one's slot is there.
	base := redistest.Name(t)
	sems := lossSems(t, cc, 0, func(label string) string {
		for i := 0; ; i++ {
			name := fmt.Sprintf("%s-%s-%d", base, label, i)
			slot, err := cc.ClusterKeySlot(ctx, core.KeysFor(core.DefaultPrefix, name).List[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot < 16384/int64(len(cl.Primaries)) {
				return name
			}
		}
	})
	runLoss(t, lossWorld{primary: cl.Primaries[0], replicas: cl.Replicas[0], promote: func() *redis.Client {
		return cl.KillPrimary(t, 0).Client(t) // the primary is dead already: only the promotion
	}}, sems)
}
