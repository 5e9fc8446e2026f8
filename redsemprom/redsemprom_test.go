package redsemprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemprom"
	"github.com/redsem/redsem/unfair"
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// count returns the sample count of histogram series name{name=sem}.
func count(t *testing.T, reg *prometheus.Registry, metric, sem string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" && l.GetValue() == sem {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// probe gathers the metrics of m through a registry.
type probe struct {
	reg *prometheus.Registry
	m   *redsemprom.Metrics
}

func newProbe(t *testing.T) *probe {
	m := redsemprom.New(redsemprom.Options{})
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	return &probe{reg: reg, m: m}
}

// get returns the value of the counter or gauge metric{labels}.
func (p *probe) get(t *testing.T, metric string, labels ...string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1 // absent
}

func TestEventsFromRealSemaphores(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	client := redistest.Client(t)
	name := redistest.Name(t)
	p := newProbe(t)
	sem, err := unfair.New(client, name, 1, unfair.Options{Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	acq := func(result string) float64 { return p.get(t, "redsem_acquire_total", "name", name, "result", result) }

	l, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if acq("ok") != 1 || p.get(t, "redsem_holders", "name", name) != 1 || count(t, p.reg, "redsem_wait_seconds", name) != 1 {
		t.Fatalf("after one acquire: ok %v, holders %v, waits %d", acq("ok"), p.get(t, "redsem_holders", "name", name),
			count(t, p.reg, "redsem_wait_seconds", name))
	}
	// Series for the other results exist at zero from the first event.
	if acq("timeout") != 0 || acq("error") != 0 || acq("mismatch") != 0 || p.get(t, "redsem_leases_lost_total", "name", name) != 0 {
		t.Fatalf("results not initialised at zero")
	}

	// Full: an Acquire with a short deadline times out.
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = sem.Acquire(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || acq("timeout") != 1 {
		t.Fatalf("timed-out acquire: err %v, timeout count %v", err, acq("timeout"))
	}

	// A client built with another limit while the first holds: mismatch.
	other, err := unfair.New(client, name, 2, unfair.Options{Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) || acq("mismatch") != 1 {
		t.Fatalf("mismatch: err %v, count %v", err, acq("mismatch"))
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p.get(t, "redsem_holders", "name", name) != 0 || count(t, p.reg, "redsem_hold_seconds", name) != 1 {
		t.Fatalf("after release: holders %v, holds %d", p.get(t, "redsem_holders", "name", name), count(t, p.reg, "redsem_hold_seconds", name))
	}

	// A lease that is not renewed expires: lost.
	short, err := unfair.New(client, name, 1, unfair.Options{LeaseTTL: 200 * time.Millisecond, DisableAutoRenew: true, Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	l, err = short.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the lease to expire in Redis", func() bool {
		st, err := short.Status(ctx)
		return err == nil && len(st.Holders) == 0
	})
	if err := l.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
		t.Fatalf("Release of expired lease = %v", err)
	}
	if p.get(t, "redsem_leases_lost_total", "name", name) != 1 || p.get(t, "redsem_holders", "name", name) != 0 ||
		count(t, p.reg, "redsem_hold_seconds", name) != 2 || acq("ok") != 2 {
		t.Fatalf("after loss: lost %v, holders %v, holds %d", p.get(t, "redsem_leases_lost_total", "name", name),
			p.get(t, "redsem_holders", "name", name), count(t, p.reg, "redsem_hold_seconds", name))
	}

	// Redis unreachable: unavailable, not a timeout or an error.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer dead.Close()
	broken, err := unfair.New(dead, name, 1, unfair.Options{Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broken.TryAcquire(ctx); !errors.Is(err, redsem.ErrUnavailable) || acq("unavailable") != 1 {
		t.Fatalf("unreachable Redis: err %v, unavailable count %v", err, acq("unavailable"))
	}
	// A Redis error (a script refused: OOM, a bad stored limit): error.
	if err := client.Set(ctx, "redsem:{"+name+"-bad}:limit", "inf", 0).Err(); err != nil {
		t.Fatal(err)
	}
	badLimit, err := unfair.New(client, name+"-bad", 1, unfair.Options{Observer: func(ev redsem.Event) {
		ev.Name = name // count it under this test's series
		p.m.Observe(ev)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := badLimit.TryAcquire(ctx); err == nil || errors.Is(err, redsem.ErrUnavailable) || acq("error") != 1 {
		t.Fatalf("a stored limit of inf: err %v, error count %v", err, acq("error"))
	}

	// The whole story, as a scrape shows it.
	want := `
# HELP redsem_acquire_total Acquire and granted TryAcquire calls by result: ok, timeout, canceled, unavailable, error, mismatch.
# TYPE redsem_acquire_total counter
redsem_acquire_total{name="NAME",result="canceled"} 0
redsem_acquire_total{name="NAME",result="error"} 1
redsem_acquire_total{name="NAME",result="mismatch"} 1
redsem_acquire_total{name="NAME",result="ok"} 2
redsem_acquire_total{name="NAME",result="timeout"} 1
redsem_acquire_total{name="NAME",result="unavailable"} 1
# HELP redsem_holders Leases this process holds now (acquired minus released and lost); sum over processes for the global count.
# TYPE redsem_holders gauge
redsem_holders{name="NAME"} 0
# HELP redsem_leases_lost_total Leases that expired or were removed before their release.
# TYPE redsem_leases_lost_total counter
redsem_leases_lost_total{name="NAME"} 1
# HELP redsem_waiters_evicted_total Fair waiters that found their queue entry evicted (and queued again).
# TYPE redsem_waiters_evicted_total counter
redsem_waiters_evicted_total{name="NAME"} 0
`
	if err := testutil.GatherAndCompare(p.reg, strings.NewReader(strings.ReplaceAll(want, "NAME", name)),
		"redsem_acquire_total", "redsem_holders", "redsem_leases_lost_total", "redsem_waiters_evicted_total"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(p.m); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func TestWaiterEvicted(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	client := redistest.Client(t)
	name := redistest.Name(t)
	p := newProbe(t)
	sem, err := fair.New(client, name, 1, fair.Options{QueueTTL: 300 * time.Millisecond, Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	l, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l2, err := sem.Acquire(wctx); err == nil {
			l2.Release(context.Background())
		}
	}()
	defer func() { cancel(); <-done }()
	var id string
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		st, err := sem.Status(ctx)
		if err == nil && len(st.Waiters) == 1 {
			id = st.Waiters[0].ID
		}
		return id != ""
	})
	// Remove the entry as an operator would ('redsem release NAME ID'); the
	// waiter learns that its entry is gone and queues again.
	e, err := core.New(core.Config{Client: client, Name: name, Limit: 1, Prefix: core.DefaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if kind, _, err := e.ForceRelease(ctx, id); err != nil || kind != core.ReleasedWaiter {
		t.Fatalf("force release of waiter %s: kind %d, %v", id, kind, err)
	}
	waitFor(t, 10*time.Second, "redsem_waiters_evicted_total to count it", func() bool {
		return p.get(t, "redsem_waiters_evicted_total", "name", name) >= 1
	})
	l.Release(ctx)
}

// A lease resumed from another process (Resume, EventResumed) is held by
// this one: redsem_holders counts it until its release.
func TestResumedLeaseHeld(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	p := newProbe(t)
	other, err := unfair.New(redistest.Client(t), name, 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	sem, err := unfair.New(redistest.Client(t), name, 1, unfair.Options{Observer: p.m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	granted, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sem.Resume(ctx, granted.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := p.get(t, "redsem_holders", "name", name); got != 1 {
		t.Errorf("holders %v with a resumed lease, want 1", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.get(t, "redsem_holders", "name", name); got != 0 {
		t.Errorf("holders %v after its release, want 0", got)
	}
	_ = granted.Release(ctx) // nil: released already, by the other handle
}

func TestStatusCollector(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	client := redistest.Client(t)
	name := redistest.Name(t)
	sem, err := fair.New(client, name, 2, fair.Options{Owner: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	for i := 0; i < 2; i++ {
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l, err := sem.Acquire(wctx); err == nil {
			l.Release(context.Background())
		}
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		st, err := sem.Status(ctx)
		return err == nil && len(st.Waiters) == 1
	})

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer dead.Close()
	down, err := unfair.New(dead, "down", 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := redsemprom.NewStatusCollector(redsemprom.StatusOptions{Timeout: time.Second}, sem, down)
	want := `
# HELP redsem_status_holders Live holders in Redis, read on scrape.
# TYPE redsem_status_holders gauge
redsem_status_holders{name="NAME"} 2
# HELP redsem_status_limit Limit in force (set-limit's, else the established one), read on scrape.
# TYPE redsem_status_limit gauge
redsem_status_limit{name="NAME"} 2
# HELP redsem_status_owner_slots Slots held in Redis per Options.Owner of the acquiring process, read on scrape.
# TYPE redsem_status_owner_slots gauge
redsem_status_owner_slots{name="NAME",owner="worker-1"} 2
# HELP redsem_status_owner_waiters Live fair waiters in Redis per Options.Owner of the queuing process, read on scrape.
# TYPE redsem_status_owner_waiters gauge
redsem_status_owner_waiters{name="NAME",owner="worker-1"} 1
# HELP redsem_status_queue_length Live waiters in the fair queue in Redis, read on scrape (always 0 for unfair).
# TYPE redsem_status_queue_length gauge
redsem_status_queue_length{name="NAME"} 1
# HELP redsem_status_up 1 if the last Status read from Redis worked, else 0.
# TYPE redsem_status_up gauge
redsem_status_up{name="NAME"} 1
redsem_status_up{name="down"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(strings.ReplaceAll(want, "NAME", name))); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// A semaphore with a rate reports it and the slots granted in its window;
// one without reports no rate series (TestStatusCollector).
func TestStatusCollectorRate(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	sem, err := unfair.New(redistest.Client(t), name, 5, unfair.Options{Rate: redsem.Rate{Limit: 3, Per: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	for range 2 {
		l, err := sem.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
	}
	c := redsemprom.NewStatusCollector(redsemprom.StatusOptions{}, sem)
	want := `
# HELP redsem_status_rate_granted Slots granted in the rate's window ending now, read on scrape; absent: no rate.
# TYPE redsem_status_rate_granted gauge
redsem_status_rate_granted{name="NAME"} 2
# HELP redsem_status_rate_limit Slots that the rate in force lets be granted per window (Rate.Limit), read on scrape; absent: no rate.
# TYPE redsem_status_rate_limit gauge
redsem_status_rate_limit{name="NAME"} 3
# HELP redsem_status_rate_period_seconds The rate's window (Rate.Per), read on scrape; absent: no rate.
# TYPE redsem_status_rate_period_seconds gauge
redsem_status_rate_period_seconds{name="NAME"} 60
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(strings.ReplaceAll(want, "NAME", name)),
		"redsem_status_rate_granted", "redsem_status_rate_limit", "redsem_status_rate_period_seconds"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func TestNamespaceAndBuckets(t *testing.T) {
	m := redsemprom.New(redsemprom.Options{Namespace: "svc", ConstLabels: prometheus.Labels{"app": "x"}, WaitBuckets: []float64{1}, HoldBuckets: []float64{2}})
	m.Observe(redsem.Event{Kind: redsem.EventAcquired, Name: "db", Wait: 500 * time.Millisecond})
	want := `
# HELP svc_wait_seconds Time from the call of Acquire to the grant, for granted acquires.
# TYPE svc_wait_seconds histogram
svc_wait_seconds_bucket{app="x",name="db",le="1"} 1
svc_wait_seconds_bucket{app="x",name="db",le="+Inf"} 1
svc_wait_seconds_sum{app="x",name="db"} 0.5
svc_wait_seconds_count{app="x",name="db"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "svc_wait_seconds"); err != nil {
		t.Fatal(err)
	}
}
