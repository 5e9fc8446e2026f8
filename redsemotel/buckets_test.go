package redsemotel_test

import (
	"math"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/testkit/redistest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Names of the duration histograms (the revised names).
const (
	acquireDuration = "redsem.client.acquire.duration"
	holdDuration    = "redsem.client.hold.duration"
)

// histPoints returns the data points of the histogram name.
func histPoints(rm metricdata.ResourceMetrics, name string) []metricdata.HistogramDataPoint[float64] {
	var out []metricdata.HistogramDataPoint[float64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				out = append(out, h.DataPoints...)
			}
		}
	}
	return out
}

// buckets returns the bounds (lo, hi] of each non-empty bucket of p (hi is
// +Inf for the last).
func buckets(p metricdata.HistogramDataPoint[float64]) [][2]float64 {
	var out [][2]float64
	for i, c := range p.BucketCounts {
		if c == 0 {
			continue
		}
		lo, hi := 0.0, math.Inf(1)
		if i > 0 {
			lo = p.Bounds[i-1]
		}
		if i < len(p.Bounds) {
			hi = p.Bounds[i]
		}
		out = append(out, [2]float64{lo, hi})
	}
	return out
}

// The durations are in seconds and their buckets too: a wait of ~150 ms
// and a hold of ~300 ms each land in a bucket between 50 ms and 1 s (with
// the SDK's default boundaries, meant for milliseconds, both land in the
// first bucket, (0, 5]), and the boundaries reach 10 s for waits and hours
// for holds.
func TestDurationBuckets(t *testing.T) {
	s := newSetup(t, "unfair", 0)
	ctx := redistest.Ctx(t, 20*time.Second)
	first, err := s.sem.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := s.sem.Acquire(ctx) // waits ~150 ms, then holds ~300 ms
		if err == nil {
			time.Sleep(300 * time.Millisecond)
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(150 * time.Millisecond)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	m := collect(t, s)
	acq := histPoints(m, acquireDuration)
	if len(acq) != 1 || acq[0].Count != 2 {
		t.Fatalf("%s: %+v, want one point of 2 values", acquireDuration, acq)
	}
	// The wait: the larger of the two; find its bucket by the sum.
	var waitBucket int = -1
	for i := len(acq[0].BucketCounts) - 1; i >= 0; i-- {
		if acq[0].BucketCounts[i] > 0 {
			waitBucket = i
			break
		}
	}
	if waitBucket <= 0 || waitBucket >= len(acq[0].Bounds) ||
		acq[0].Bounds[waitBucket-1] < 0.05 || acq[0].Bounds[waitBucket] > 1 {
		t.Errorf("%s: a wait of ~150 ms (sum %v s) is in bucket %d of bounds %v", acquireDuration, acq[0].Sum, waitBucket, acq[0].Bounds)
	}
	if b := acq[0].Bounds; len(b) == 0 || b[0] > 0.005 || b[len(b)-1] < 10 {
		t.Errorf("%s: bounds %v, want from at most 5 ms to at least 10 s", acquireDuration, b)
	}
	holds := histPoints(m, holdDuration) // the first lease's ~150 ms and the waiter's ~300 ms
	if len(holds) != 1 || holds[0].Count != 2 {
		t.Fatalf("%s: %+v, want one point of 2 values", holdDuration, holds)
	}
	hold := holds[0]
	for _, b := range buckets(hold) {
		if b[0] < 0.05 || b[1] > 1 {
			t.Errorf("%s: holds of ~150 and ~300 ms (sum %v s) are in buckets %v of bounds %v", holdDuration, hold.Sum, buckets(hold), hold.Bounds)
			break
		}
	}
	if b := hold.Bounds; len(b) == 0 || b[len(b)-1] < 3600 {
		t.Errorf("%s: bounds %v, want up to at least an hour", holdDuration, b)
	}
}
