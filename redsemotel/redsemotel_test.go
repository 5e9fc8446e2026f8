package redsemotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// setup wraps a real semaphore (limit 2) with providers that record
// everything in memory.
type setup struct {
	sem    redsem.Semaphore
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func newSetup(t *testing.T, variant string, opts ...func(*unfair.Options, *fair.Options)) *setup {
	t.Helper()
	var uo unfair.Options
	var fo fair.Options
	for _, o := range opts {
		o(&uo, &fo)
	}
	var base redsem.Semaphore
	var err error
	if variant == "fair" {
		base, err = fair.New(redistest.Client(t), redistest.Name(t), 2, fo)
	} else {
		base, err = unfair.New(redistest.Client(t), redistest.Name(t), 2, uo)
	}
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	sem := redsemotel.Wrap(base, redsemotel.WithTracerProvider(tp), redsemotel.WithMeterProvider(mp))
	t.Cleanup(func() { _ = sem.Close() })
	return &setup{sem: sem, spans: spans, reader: reader, tp: tp}
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// ended returns the ended spans called name.
func (s *setup) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s.spans.Ended() {
		if sp.Name() == name {
			out = append(out, sp)
		}
	}
	return out
}

// waitHolds waits until n hold spans have ended (they end on the lease's
// own goroutine, just after Release returns).
func (s *setup) waitHolds(t *testing.T, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	var got []sdktrace.ReadOnlySpan
	redistest.WaitFor(t, 5*time.Second, fmt.Sprintf("%d hold spans ended", n), func() (bool, error) {
		got = s.ended("redsem.hold")
		return len(got) >= n, nil
	})
	return got
}

// Spans: names, parent and child, attributes, and every outcome.
func TestSpans(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant)
			ctx := redistest.Ctx(t, 20*time.Second)
			pctx, parent := s.tp.Tracer("test").Start(ctx, "request")

			a, err := s.sem.AcquireN(pctx, 2) // granted
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.sem.TryAcquire(pctx); !errors.Is(err, redsem.ErrNoSlot) { // no_slot
				t.Fatalf("TryAcquire on a full semaphore: %v", err)
			}
			tctx, cancel := context.WithTimeout(pctx, 50*time.Millisecond)
			_, err = s.sem.Acquire(tctx) // timeout
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire past its deadline: %v", err)
			}
			cctx, cancel := context.WithCancel(pctx)
			go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			if _, err := s.sem.Acquire(cctx); !errors.Is(err, context.Canceled) { // canceled
				t.Fatalf("cancelled Acquire: %v", err)
			}
			if _, err := s.sem.AcquireN(pctx, 3); err == nil { // error: above the limit
				t.Fatal("AcquireN(3) under a limit of 2 succeeded")
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			parent.End()
			if err := s.sem.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrClosed) { // closed
				t.Fatalf("TryAcquire after Close: %v", err)
			}

			acq := s.ended("redsem.acquire")
			want := []string{"granted", "no_slot", "timeout", "canceled", "error", "closed"}
			if len(acq) != len(want) {
				t.Fatalf("%d acquire spans, want %d", len(acq), len(want))
			}
			for i, sp := range acq {
				at := attrs(sp.Attributes())
				if got := at["redsem.outcome"].AsString(); got != want[i] {
					t.Errorf("acquire span %d: outcome %q, want %q", i, got, want[i])
				}
				if at["redsem.semaphore"].AsString() != s.sem.Name() {
					t.Errorf("acquire span %d: redsem.semaphore %v", i, at["redsem.semaphore"])
				}
				if i < 5 && sp.Parent().SpanID() != parent.SpanContext().SpanID() {
					t.Errorf("acquire span %d is not a child of the caller's span", i)
				}
				wantStatus := codes.Unset
				if want[i] == "error" {
					wantStatus = codes.Error
				}
				if sp.Status().Code != wantStatus {
					t.Errorf("acquire span %d (%s): status %v, want %v", i, want[i], sp.Status().Code, wantStatus)
				}
			}
			g := attrs(acq[0].Attributes())
			if g["redsem.weight"].AsInt64() != 2 || g["redsem.token"].AsInt64() != a.Token() ||
				fmt.Sprint(g["redsem.slots"].AsInt64Slice()) != fmt.Sprint([]int64{int64(a.Slots()[0]), int64(a.Slots()[1])}) {
				t.Errorf("granted span attributes %v; lease token %d, slots %v", acq[0].Attributes(), a.Token(), a.Slots())
			}
			if _, ok := attrs(acq[1].Attributes())["redsem.token"]; ok {
				t.Error("a refused acquire's span has a token")
			}

			holds := s.waitHolds(t, 1)
			h := holds[0]
			ha := attrs(h.Attributes())
			if ha["redsem.outcome"].AsString() != "released" || ha["redsem.weight"].AsInt64() != 2 || h.Status().Code != codes.Unset {
				t.Errorf("hold span: %v, status %v", h.Attributes(), h.Status())
			}
			if h.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Error("the hold span is not a child of the caller's span")
			}
			if !h.StartTime().Before(h.EndTime()) || h.StartTime().Before(acq[0].StartTime()) {
				t.Errorf("hold span from %v to %v, acquire span from %v", h.StartTime(), h.EndTime(), acq[0].StartTime())
			}
		})
	}
}

// A lease lost (its keys deleted; renewed every 100 ms) ends its hold span
// with outcome lost and status Error, and counts in redsem.leases.lost.
func TestLostLease(t *testing.T) {
	s := newSetup(t, "unfair", func(u *unfair.Options, _ *fair.Options) { u.LeaseTTL = 300 * time.Millisecond })
	ctx := redistest.Ctx(t, 20*time.Second)
	l, err := s.sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := redistest.Client(t)
	keys, err := c.Keys(ctx, "redsem:{"+s.sem.Name()+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if err := c.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the lease was not found lost")
	}
	h := s.waitHolds(t, 1)[0]
	if attrs(h.Attributes())["redsem.outcome"].AsString() != "lost" || h.Status().Code != codes.Error {
		t.Fatalf("hold span of a lost lease: %v, status %v", h.Attributes(), h.Status())
	}
	m := collect(t, s)
	if got := sumOf(m, "redsem.leases.lost", nil); got != 1 {
		t.Fatalf("redsem.leases.lost = %v, want 1", got)
	}
	if got := histCount(m, "redsem.hold.duration", "lost"); got != 1 {
		t.Fatalf("hold durations with outcome lost: %d, want 1", got)
	}
}

// Metrics after a known workload: counts by outcome, and the gauges back
// to zero once every call returned and every lease ended.
func TestMetrics(t *testing.T) {
	s := newSetup(t, "fair")
	ctx := redistest.Ctx(t, 20*time.Second)
	var leases []redsem.Lease
	for i := 0; i < 2; i++ {
		l, err := s.sem.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	for i := 0; i < 3; i++ {
		if _, err := s.sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatal(err)
		}
	}
	// One waiter, in flight while we look, then granted.
	got := make(chan redsem.Lease, 1)
	go func() {
		l, err := s.sem.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	redistest.WaitFor(t, 5*time.Second, "the waiter counted", func() (bool, error) {
		return sumOf(collect(t, s), "redsem.acquire.waiting", nil) == 1, nil
	})
	m := collect(t, s)
	if held := sumOf(m, "redsem.slots.held", nil); held != 2 {
		t.Fatalf("redsem.slots.held = %v with two leases, want 2", held)
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := (<-got).Release(ctx); err != nil {
		t.Fatal(err)
	}
	s.waitHolds(t, 3)
	m = collect(t, s)
	for name, want := range map[string]float64{"redsem.slots.held": 0, "redsem.acquire.waiting": 0} {
		if got := sumOf(m, name, nil); got != want {
			t.Errorf("%s = %v after the workload, want %v", name, got, want)
		}
	}
	if n := histCount(m, "redsem.acquire.duration", "granted"); n != 3 {
		t.Errorf("granted acquire durations: %d, want 3", n)
	}
	if n := histCount(m, "redsem.acquire.duration", "no_slot"); n != 3 {
		t.Errorf("no_slot acquire durations: %d, want 3", n)
	}
	if n := histCount(m, "redsem.hold.duration", "released"); n != 3 {
		t.Errorf("released hold durations: %d, want 3", n)
	}
	if got := sumOf(m, "redsem.leases.lost", nil); got != 0 {
		t.Errorf("redsem.leases.lost = %v, want 0", got)
	}
	for _, sm := range m.ScopeMetrics {
		if sm.Scope.Name != redsemotel.Scope {
			t.Errorf("scope %q, want %q", sm.Scope.Name, redsemotel.Scope)
		}
		for _, mt := range sm.Metrics {
			want := map[string]string{"redsem.acquire.duration": "s", "redsem.hold.duration": "s", "redsem.slots.held": "{slot}",
				"redsem.acquire.waiting": "{call}", "redsem.leases.lost": "{lease}"}[mt.Name]
			if mt.Unit != want {
				t.Errorf("%s: unit %q, want %q", mt.Name, mt.Unit, want)
			}
		}
	}
}

// Unwrap reaches the semaphore behind the wrapper; the rest passes through.
func TestPassThrough(t *testing.T) {
	s := newSetup(t, "unfair")
	ctx := redistest.Ctx(t, 10*time.Second)
	u, ok := s.sem.(interface{ Unwrap() redsem.Semaphore })
	if !ok || u.Unwrap() == nil || u.Unwrap().Name() != s.sem.Name() {
		t.Fatal("the wrapper has no Unwrap to the semaphore it wraps")
	}
	if err := s.sem.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st, err := s.sem.Status(ctx)
	if err != nil || st.Limit != 3 {
		t.Fatalf("Status after SetLimit(3): %+v, %v", st, err)
	}
	if len(s.spans.Ended()) != 0 {
		t.Fatalf("Status and SetLimit made %d spans, want none", len(s.spans.Ended()))
	}
}

func collect(t *testing.T, s *setup) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// sumOf adds up the data points of the sum metric name.
func sumOf(rm metricdata.ResourceMetrics, name string, _ []attribute.KeyValue) float64 {
	var total float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					total += float64(p.Value)
				}
			}
		}
	}
	return total
}

// histCount returns how many values the histogram name recorded with
// redsem.outcome outcome.
func histCount(rm metricdata.ResourceMetrics, name, outcome string) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, p := range d.DataPoints {
					if v, ok := p.Attributes.Value("redsem.outcome"); ok && v.AsString() == outcome {
						n += p.Count
					}
				}
			}
		}
	}
	return n
}
