package redsemprom

import (
	"context"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redsem/redsem"
)

// StatusOptions configures a StatusCollector. The zero value is valid.
type StatusOptions struct {
	// Namespace prefixes every metric name; zero: "redsem".
	Namespace string
	// ConstLabels are added to every series.
	ConstLabels prometheus.Labels
	// Timeout bounds the Status read of each semaphore per scrape; zero: 2s.
	Timeout time.Duration
}

// StatusCollector reads the live state of semaphores from Redis on every
// scrape. Every process that runs one reports the same global numbers, so
// aggregate with max, not sum (or run it in one place only).
type StatusCollector struct {
	sems    []redsem.Semaphore
	timeout time.Duration

	holders, queue, limit, up          *prometheus.Desc
	ownerSlots, ownerWaiters           *prometheus.Desc
	rateLimit, ratePeriod, rateGranted *prometheus.Desc
}

var _ prometheus.Collector = (*StatusCollector)(nil)

// NewStatusCollector returns a collector of the semaphores' Status,
// labelled by each one's Name. Give it semaphores of their own: a keyed
// family's member is named by its key, which would make a series per key.
func NewStatusCollector(opts StatusOptions, sems ...redsem.Semaphore) *StatusCollector {
	ns := opts.Namespace
	if ns == "" {
		ns = "redsem"
	}
	d := opts.Timeout
	if d <= 0 {
		d = bounds.StatusRead
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "status", name), help, []string{"name"}, opts.ConstLabels)
	}
	return &StatusCollector{
		sems: append([]redsem.Semaphore(nil), sems...), timeout: d,
		holders: desc("holders", "Live holders in Redis, read on scrape."),
		queue:   desc("queue_length", "Live waiters in the fair queue in Redis, read on scrape (always 0 for unfair)."),
		limit:   desc("limit", "Limit in force (set-limit's, else the established one), read on scrape."),
		up:      desc("up", "1 if the last Status read from Redis worked, else 0."),
		ownerSlots: prometheus.NewDesc(prometheus.BuildFQName(ns, "status", "owner_slots"),
			"Slots held in Redis per Options.Owner of the acquiring process, read on scrape.", []string{"name", "owner"}, opts.ConstLabels),
		ownerWaiters: prometheus.NewDesc(prometheus.BuildFQName(ns, "status", "owner_waiters"),
			"Live fair waiters in Redis per Options.Owner of the queuing process, read on scrape.", []string{"name", "owner"}, opts.ConstLabels),
		rateLimit:   desc("rate_limit", "Slots that the rate in force lets be granted per window (Rate.Limit), read on scrape; absent: no rate."),
		ratePeriod:  desc("rate_period_seconds", "The rate's window (Rate.Per), read on scrape; absent: no rate."),
		rateGranted: desc("rate_granted", "Slots granted in the rate's window ending now, read on scrape; absent: no rate."),
	}
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.holders
	ch <- c.queue
	ch <- c.limit
	ch <- c.up
	ch <- c.ownerSlots
	ch <- c.ownerWaiters
	ch <- c.rateLimit
	ch <- c.ratePeriod
	ch <- c.rateGranted
}

// Collect implements prometheus.Collector: it reads every semaphore's
// Status, concurrently, each bounded by the timeout. A semaphore whose read
// fails reports only redsem_status_up 0; one without a rate reports no
// redsem_status_rate_* series.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	var wg sync.WaitGroup
	for _, s := range c.sems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			st, err := s.Status(ctx)
			name := s.Name()
			if err != nil {
				ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0, name)
				return
			}
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1, name)
			ch <- prometheus.MustNewConstMetric(c.holders, prometheus.GaugeValue, float64(len(st.Holders)), name)
			ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(len(st.Waiters)), name)
			ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(st.Limit), name)
			if !st.Rate.IsZero() {
				ch <- prometheus.MustNewConstMetric(c.rateLimit, prometheus.GaugeValue, float64(st.Rate.Limit), name)
				ch <- prometheus.MustNewConstMetric(c.ratePeriod, prometheus.GaugeValue, st.Rate.Per.Seconds(), name)
				ch <- prometheus.MustNewConstMetric(c.rateGranted, prometheus.GaugeValue, float64(st.RateGranted), name)
			}
			slots, waiters := map[string]int{}, map[string]int{}
			for _, h := range st.Holders {
				slots[h.Owner] += max(len(h.Slots), 1)
			}
			for _, w := range st.Waiters {
				waiters[w.Owner]++
			}
			for owner, n := range slots {
				ch <- prometheus.MustNewConstMetric(c.ownerSlots, prometheus.GaugeValue, float64(n), name, owner)
			}
			for owner, n := range waiters {
				ch <- prometheus.MustNewConstMetric(c.ownerWaiters, prometheus.GaugeValue, float64(n), name, owner)
			}
		}()
	}
	wg.Wait()
}
