package redsemprom

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redsem/redsem"
)

// Results of redsem_acquire_total.
const (
	ResultOK = "ok" // a lease was granted
	// ResultTimeout: Acquire's context's deadline passed first
	// (context.DeadlineExceeded).
	ResultTimeout = "timeout"
	// ResultCanceled: Acquire's context was cancelled first
	// (context.Canceled: the caller gave up, e.g. its client went away),
	// told apart from a timeout, which says the wait was too long.
	ResultCanceled = "canceled"
	ResultError    = "error"    // a Redis error
	ResultMismatch = "mismatch" // the client's limit disagrees with the established one
	// ResultUnavailable: Redis could not be reached (redsem.ErrUnavailable),
	// told apart from a timeout on a healthy but busy semaphore.
	ResultUnavailable = "unavailable"
)

// results are the values of redsem_acquire_total's result label, in the
// order its help lists them.
var results = []string{ResultOK, ResultTimeout, ResultCanceled, ResultUnavailable, ResultError, ResultMismatch}

// DefaultBuckets returns the default histogram buckets, in seconds: from a
// millisecond (a handoff on a quiet loopback) to ten minutes (a long hold
// with renewal).
func DefaultBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
}

// Options configures Metrics. The zero value is valid.
type Options struct {
	// Namespace prefixes every metric name; zero: "redsem".
	Namespace string
	// ConstLabels are added to every series (e.g. the service's name).
	ConstLabels prometheus.Labels
	// WaitBuckets and HoldBuckets are the histograms' upper bounds in
	// seconds; nil: DefaultBuckets().
	WaitBuckets []float64
	HoldBuckets []float64
}

// Metrics turns semaphore events into Prometheus metrics. Register it with
// a prometheus.Registerer and pass its Observe method as the semaphores'
// Observer. It is safe for concurrent use and may serve many semaphores
// and families: a family's members are counted under the family's name
// (redsem.Event.Family), never under their keys.
type Metrics struct {
	holders  *prometheus.GaugeVec
	acquires *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	hold     *prometheus.HistogramVec
	lost     *prometheus.CounterVec
	evicted  *prometheus.CounterVec
	policy   *prometheus.GaugeVec

	seen sync.Map // name label -> struct{}: its series exist
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns Metrics configured by opts.
func New(opts Options) *Metrics {
	ns := opts.Namespace
	if ns == "" {
		ns = "redsem"
	}
	wb, hb := opts.WaitBuckets, opts.HoldBuckets
	if wb == nil {
		wb = DefaultBuckets()
	}
	if hb == nil {
		hb = DefaultBuckets()
	}
	// Every series has the label name (the semaphore's), then labels.
	opt := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: ns, Name: name, Help: help, ConstLabels: opts.ConstLabels}
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts(opt(name, help)), append([]string{"name"}, labels...))
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts(opt(name, help)), append([]string{"name"}, labels...))
	}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help,
			ConstLabels: opts.ConstLabels, Buckets: buckets}, []string{"name"})
	}
	return &Metrics{
		holders: gauge("holders",
			"Leases this process holds now (acquired minus released and lost); sum over processes for the global count."),
		acquires: counter("acquire_total",
			"Acquire and granted TryAcquire calls by result: ok, timeout, canceled, unavailable, error, mismatch.", "result"),
		wait: histogram("wait_seconds", "Time from the call of Acquire to the grant, for granted acquires.", wb),
		hold: histogram("hold_seconds", "Time from the grant to the Release call, or to the loss of the lease.", hb),
		lost: counter("leases_lost_total", "Leases that expired or were removed before their release."),
		evicted: counter("waiters_evicted_total",
			"Fair waiters that found their queue entry evicted (and queued again)."),
		policy: gauge("eviction_policy_unsafe",
			"1 when the Redis maxmemory-policy may evict the semaphore's keys (noeviction is recommended).", "policy"),
	}
}

// Observe records one event. Pass it as the Observer of a semaphore, or of
// a family (every member's events): fair.Options{Observer: m.Observe},
// fair.FamilyOptions{Options: fair.Options{Observer: m.Observe}}. An
// event of a family's member (Event.Family set) counts under the family's
// name, so a family of any number of keys makes one series per metric and
// result, as redsemotel.WrapFamily's metrics do. It never blocks.
func (m *Metrics) Observe(ev redsem.Event) {
	name := ev.Name
	if ev.Family != "" {
		name = ev.Family // never a member's key: the keys are unbounded
	}
	m.ensureSeries(name)
	switch ev.Kind {
	case redsem.EventAcquired:
		m.acquires.WithLabelValues(name, ResultOK).Inc()
		m.wait.WithLabelValues(name).Observe(ev.Wait.Seconds())
		m.holders.WithLabelValues(name).Inc()
	case redsem.EventResumed:
		m.holders.WithLabelValues(name).Inc() // a lease of this process now: its end decrements
	case redsem.EventReleased:
		m.hold.WithLabelValues(name).Observe(ev.Hold.Seconds())
		m.holders.WithLabelValues(name).Dec()
	case redsem.EventLeaseLost:
		m.hold.WithLabelValues(name).Observe(ev.Hold.Seconds())
		m.holders.WithLabelValues(name).Dec()
		m.lost.WithLabelValues(name).Inc()
	case redsem.EventWaiterEvicted:
		m.evicted.WithLabelValues(name).Inc()
	case redsem.EventAcquireTimedOut:
		m.acquires.WithLabelValues(name, endedResult(ev.Err)).Inc()
	case redsem.EventAcquireFailed:
		m.acquires.WithLabelValues(name, ResultError).Inc()
	case redsem.EventUnavailable:
		m.acquires.WithLabelValues(name, ResultUnavailable).Inc()
	case redsem.EventLimitMismatch:
		m.acquires.WithLabelValues(name, ResultMismatch).Inc()
	case redsem.EventEvictionPolicy:
		if ev.Policy != "" { // "": the server would not tell (Err)
			m.policy.WithLabelValues(name, ev.Policy).Set(1)
		}
	}
}

// endedResult is the result of an acquire whose context ended
// (EventAcquireTimedOut, whose Err matches the context's error): canceled
// for a cancelled context, else timeout (a deadline, or an error that says
// neither).
func endedResult(err error) string {
	if !errors.Is(err, context.DeadlineExceeded) && errors.Is(err, context.Canceled) {
		return ResultCanceled
	}
	return ResultTimeout
}

// ensureSeries creates a semaphore's series at zero on its first event, so that
// rate() and alerts see a 0 before the first timeout or loss.
func (m *Metrics) ensureSeries(name string) {
	if _, ok := m.seen.Load(name); ok {
		return
	}
	if _, loaded := m.seen.LoadOrStore(name, struct{}{}); loaded {
		return
	}
	for _, r := range results {
		m.acquires.WithLabelValues(name, r)
	}
	m.holders.WithLabelValues(name)
	m.lost.WithLabelValues(name)
	m.evicted.WithLabelValues(name)
	m.wait.WithLabelValues(name)
	m.hold.WithLabelValues(name)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.holders, m.acquires, m.wait, m.hold, m.lost, m.evicted, m.policy}
}
