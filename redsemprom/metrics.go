package redsemprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redsem/redsem"
)

// Results of redsem_acquire_total.
const (
	ResultOK       = "ok"       // a lease was granted
	ResultTimeout  = "timeout"  // Acquire's context ended first
	ResultError    = "error"    // a Redis error
	ResultMismatch = "mismatch" // the client's limit disagrees with the established one
	// ResultUnavailable: Redis could not be reached (redsem.ErrUnavailable),
	// told apart from a timeout on a healthy but busy semaphore.
	ResultUnavailable = "unavailable"
)

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
// Observer. It is safe for concurrent use and may serve many semaphores.
type Metrics struct {
	holders  *prometheus.GaugeVec
	acquires *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	hold     *prometheus.HistogramVec
	lost     *prometheus.CounterVec
	evicted  *prometheus.CounterVec
	policy   *prometheus.GaugeVec

	seen sync.Map // semaphore name -> struct{}: its series exist
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
			"Acquire and granted TryAcquire calls by result: ok, timeout, unavailable, error, mismatch.", "result"),
		wait: histogram("wait_seconds", "Time from the call of Acquire to the grant, for granted acquires.", wb),
		hold: histogram("hold_seconds", "Time from the grant to the Release call, or to the loss of the lease.", hb),
		lost: counter("leases_lost_total", "Leases that expired or were removed before their release."),
		evicted: counter("waiters_evicted_total",
			"Fair waiters that found their queue entry evicted (and queued again)."),
		policy: gauge("eviction_policy_unsafe",
			"1 when the Redis maxmemory-policy may evict the semaphore's keys (noeviction is recommended).", "policy"),
	}
}

// Observe records one event. Pass it as the Observer of a semaphore:
// fair.Options{Observer: m.Observe}. It never blocks.
func (m *Metrics) Observe(ev redsem.Event) {
	m.ensureSeries(ev.Name)
	switch ev.Kind {
	case redsem.EventAcquired:
		m.acquires.WithLabelValues(ev.Name, ResultOK).Inc()
		m.wait.WithLabelValues(ev.Name).Observe(ev.Wait.Seconds())
		m.holders.WithLabelValues(ev.Name).Inc()
	case redsem.EventResumed:
		m.holders.WithLabelValues(ev.Name).Inc() // a lease of this process now: its end decrements
	case redsem.EventReleased:
		m.hold.WithLabelValues(ev.Name).Observe(ev.Hold.Seconds())
		m.holders.WithLabelValues(ev.Name).Dec()
	case redsem.EventLeaseLost:
		m.hold.WithLabelValues(ev.Name).Observe(ev.Hold.Seconds())
		m.holders.WithLabelValues(ev.Name).Dec()
		m.lost.WithLabelValues(ev.Name).Inc()
	case redsem.EventWaiterEvicted:
		m.evicted.WithLabelValues(ev.Name).Inc()
	case redsem.EventAcquireTimedOut:
		m.acquires.WithLabelValues(ev.Name, ResultTimeout).Inc()
	case redsem.EventAcquireFailed:
		m.acquires.WithLabelValues(ev.Name, ResultError).Inc()
	case redsem.EventUnavailable:
		m.acquires.WithLabelValues(ev.Name, ResultUnavailable).Inc()
	case redsem.EventLimitMismatch:
		m.acquires.WithLabelValues(ev.Name, ResultMismatch).Inc()
	case redsem.EventEvictionPolicy:
		if ev.Policy != "" { // "": the server would not tell (Err)
			m.policy.WithLabelValues(ev.Name, ev.Policy).Set(1)
		}
	}
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
	for _, r := range []string{ResultOK, ResultTimeout, ResultUnavailable, ResultError, ResultMismatch} {
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
