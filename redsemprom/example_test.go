package redsemprom_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/redsemprom"
)

// Wire the metrics into a semaphore: its events become metrics.
func Example() {
	m := redsemprom.New(redsemprom.Options{})
	prometheus.MustRegister(m)

	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	sem, err := fair.New(client, "legacy-db", 10, fair.Options{Observer: m.Observe})
	if err != nil {
		panic(err)
	}
	// The global view from Redis, read on each scrape.
	prometheus.MustRegister(redsemprom.NewStatusCollector(redsemprom.StatusOptions{}, sem))
	// ... serve promhttp.Handler() and use sem.
}

// A keyed family's members are counted under the family's name: one
// series per metric for every tenant, never one per key.
func Example_family() {
	m := redsemprom.New(redsemprom.Options{})
	prometheus.MustRegister(m)

	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	tenants, err := fair.NewFamily(client, "tenants", 4, fair.FamilyOptions{Options: fair.Options{Observer: m.Observe}})
	if err != nil {
		panic(err)
	}
	sem, err := tenants.Get("acme") // its events carry Family "tenants": name="tenants"
	if err != nil {
		panic(err)
	}
	_ = sem // ... acquire and release as usual.
}

// What the metrics hold after a few events (fed by hand here; a semaphore
// feeds them through its Observer). Every series of a name exists from its
// first event, at zero.
func ExampleMetrics_Observe() {
	m := redsemprom.New(redsemprom.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)

	m.Observe(redsem.Event{Kind: redsem.EventAcquired, Name: "db", Wait: 20 * time.Millisecond})
	m.Observe(redsem.Event{Kind: redsem.EventAcquired, Name: "db", Wait: 5 * time.Millisecond})
	m.Observe(redsem.Event{Kind: redsem.EventReleased, Name: "db", Hold: time.Second})
	m.Observe(redsem.Event{Kind: redsem.EventAcquireTimedOut, Name: "db", Wait: 10 * time.Second})

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			var labels []string
			for _, l := range x.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case x.Counter != nil:
				fmt.Println(series, x.GetCounter().GetValue())
			case x.Gauge != nil:
				fmt.Println(series, x.GetGauge().GetValue())
			case x.Histogram != nil:
				fmt.Println(series, "count", x.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// redsem_acquire_total{name="db",result="canceled"} 0
	// redsem_acquire_total{name="db",result="error"} 0
	// redsem_acquire_total{name="db",result="mismatch"} 0
	// redsem_acquire_total{name="db",result="ok"} 2
	// redsem_acquire_total{name="db",result="timeout"} 1
	// redsem_acquire_total{name="db",result="unavailable"} 0
	// redsem_hold_seconds{name="db"} count 1
	// redsem_holders{name="db"} 1
	// redsem_leases_lost_total{name="db"} 0
	// redsem_wait_seconds{name="db"} count 2
	// redsem_waiters_evicted_total{name="db"} 0
}
