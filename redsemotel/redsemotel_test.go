package redsemotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel"
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
	mp     *sdkmetric.MeterProvider
}

var variants = []string{"unfair", "fair"}

// newSetup builds a semaphore of the variant (limit 2, LeaseTTL ttl; zero:
// the default) wrapped with in-memory providers; it is closed when the
// test ends.
func newSetup(t *testing.T, variant string, ttl time.Duration) *setup {
	t.Helper()
	var base redsem.Semaphore
	var err error
	if variant == "fair" {
		base, err = fair.New(redistest.Client(t), redistest.Name(t), 2, fair.Options{LeaseTTL: ttl})
	} else {
		base, err = unfair.New(redistest.Client(t), redistest.Name(t), 2, unfair.Options{LeaseTTL: ttl})
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
	return &setup{sem: sem, spans: spans, reader: reader, tp: tp, mp: mp}
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

// waitHolds waits until n hold spans have ended (a lease lost without a
// Release ends its span from its own goroutine).
func (s *setup) waitHolds(t *testing.T, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	var got []sdktrace.ReadOnlySpan
	redistest.WaitFor(t, 5*time.Second, fmt.Sprintf("%d hold spans ended", n), func() (bool, error) {
		got = s.ended("redsem.hold")
		return len(got) >= n, nil
	})
	return got
}

// loseKeys deletes every key of the semaphore in Redis: its leases are
// lost (found at their next renewal or Release).
func (s *setup) loseKeys(t *testing.T, ctx context.Context) {
	t.Helper()
	c := redistest.Client(t)
	keys, err := c.Keys(ctx, "redsem:{"+s.sem.Name()+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if err := c.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

func int64s(xs []int) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// Spans: names, parent and child, attributes, and every acquire error.type.
func TestSpans(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant, 0)
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
			if _, err := s.sem.AcquireN(pctx, 3); !errors.Is(err, redsem.ErrWeight) { // error: above the limit
				t.Fatalf("AcquireN(3) under a limit of 2: %v, want ErrWeight", err)
			}
			if len(s.ended("redsem.hold")) != 0 {
				t.Fatal("a hold span ended while its lease is held")
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// Release ended the hold span before it returned: no wait.
			holds := s.ended("redsem.hold")
			if len(holds) != 1 {
				t.Fatalf("%d hold spans ended when Release returned, want 1", len(holds))
			}
			parent.End()
			if err := s.sem.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.sem.TryAcquire(pctx); !errors.Is(err, redsem.ErrClosed) { // closed
				t.Fatalf("TryAcquire after Close: %v", err)
			}

			acq := s.ended("redsem.acquire")
			want := []string{"", "no_slot", "timeout", "canceled", "_OTHER", "closed"} // error.type
			weights := []int64{2, 1, 1, 1, 3, 1}
			if len(acq) != len(want) {
				t.Fatalf("%d acquire spans, want %d", len(acq), len(want))
			}
			for i, sp := range acq {
				at := attrs(sp.Attributes())
				if et, ok := at[redsemotel.AttrErrorType]; ok != (want[i] != "") || et.AsString() != want[i] {
					t.Errorf("acquire span %d: error.type %q (set: %v), want %q", i, et.AsString(), ok, want[i])
				}
				if len(sp.Events()) != 0 {
					t.Errorf("acquire span %d: events %v, want none (no RecordError)", i, sp.Events())
				}
				if _, ok := at[redsemotel.AttrOutcome]; ok {
					t.Errorf("acquire span %d has the old redsem.outcome", i)
				}
				if at[redsemotel.AttrSemaphoreVariant].AsString() != variant {
					t.Errorf("acquire span %d: redsem.semaphore.variant %v, want %s", i, at[redsemotel.AttrSemaphoreVariant], variant)
				}
				if at[redsemotel.AttrSemaphoreName].AsString() != s.sem.Name() {
					t.Errorf("acquire span %d: redsem.semaphore %v", i, at[redsemotel.AttrSemaphoreName])
				}
				if at[redsemotel.AttrAcquireWeight].AsInt64() != weights[i] {
					t.Errorf("acquire span %d: redsem.weight %v, want %d", i, at[redsemotel.AttrAcquireWeight], weights[i])
				}
				if sp.Parent().SpanID() != parent.SpanContext().SpanID() || sp.SpanContext().TraceID() != parent.SpanContext().TraceID() {
					t.Errorf("acquire span %d is not a child of the caller's span", i)
				}
				wantStatus := codes.Unset
				if want[i] == "_OTHER" {
					wantStatus = codes.Error
				}
				if sp.Status().Code != wantStatus {
					t.Errorf("acquire span %d (%s): status %v, want %v", i, want[i], sp.Status().Code, wantStatus)
				}
				if _, ok := at[redsemotel.AttrLeaseToken]; ok != (i == 0) {
					t.Errorf("acquire span %d (%s): has a token: %v", i, want[i], ok)
				}
				if sp.EndTime().Before(sp.StartTime()) || sp.EndTime().IsZero() {
					t.Errorf("acquire span %d: from %v to %v", i, sp.StartTime(), sp.EndTime())
				}
			}
			g := attrs(acq[0].Attributes())
			if g[redsemotel.AttrLeaseToken].AsInt64() != a.Token() ||
				fmt.Sprint(g[redsemotel.AttrLeaseSlots].AsInt64Slice()) != fmt.Sprint(int64s(a.Slots())) {
				t.Errorf("granted span attributes %v; lease token %d, slots %v", acq[0].Attributes(), a.Token(), a.Slots())
			}

			h := holds[0]
			ha := attrs(h.Attributes())
			if _, ok := ha[redsemotel.AttrErrorType]; ok || ha[redsemotel.AttrAcquireWeight].AsInt64() != 2 ||
				ha[redsemotel.AttrSemaphoreName].AsString() != s.sem.Name() || ha[redsemotel.AttrLeaseToken].AsInt64() != a.Token() ||
				fmt.Sprint(ha[redsemotel.AttrLeaseSlots].AsInt64Slice()) != fmt.Sprint(int64s(a.Slots())) || h.Status().Code != codes.Unset {
				t.Errorf("hold span: %v, status %v", h.Attributes(), h.Status())
			}
			if h.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Error("the hold span is not a child of the caller's span")
			}
			if !h.StartTime().Before(h.EndTime()) || h.StartTime().Before(acq[0].EndTime()) || !h.EndTime().After(acq[4].EndTime()) {
				t.Errorf("hold span from %v to %v, acquire span from %v to %v", h.StartTime(), h.EndTime(), acq[0].StartTime(), acq[0].EndTime())
			}
		})
	}
}

// A lease lost without a Release (its keys deleted; renewed every 100 ms)
// ends its hold span with error.type lease_lost and status Error, once, and counts
// in redsem.client.lease.lost; the Release that follows changes nothing.
func TestLostLease(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant, 300*time.Millisecond)
			ctx := redistest.Ctx(t, 20*time.Second)
			l, err := s.sem.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.loseKeys(t, ctx)
			select {
			case <-l.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the lease was not found lost")
			}
			if !errors.Is(l.Err(), redsem.ErrLeaseLost) || !errors.Is(context.Cause(l.Context()), redsem.ErrLeaseLost) {
				t.Fatalf("lost lease: Err %v, Context cause %v", l.Err(), context.Cause(l.Context()))
			}
			h := s.waitHolds(t, 1)[0]
			if attrs(h.Attributes())[redsemotel.AttrErrorType].AsString() != "lease_lost" || h.Status().Code != codes.Error || len(h.Events()) != 0 {
				t.Fatalf("hold span of a lost lease: %v, status %v", h.Attributes(), h.Status())
			}
			if err := l.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("Release of a lost lease: %v, want ErrLeaseLost", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("second Release of a lost lease: %v, want nil", err)
			}
			if n := len(s.ended("redsem.hold")); n != 1 {
				t.Fatalf("%d hold spans, want 1", n)
			}
			m := collect(t, s)
			if got := sumOf(m, "redsem.client.lease.lost"); got != 1 {
				t.Errorf("redsem.client.lease.lost = %v, want 1", got)
			}
			if got := sumOf(m, "redsem.client.slot.usage"); got != 0 {
				t.Errorf("redsem.client.slot.usage = %v, want 0", got)
			}
			if got := histCount(m, holdDuration, "lease_lost"); got != 1 {
				t.Errorf("hold durations with error.type lease_lost: %d, want 1", got)
			}
			if got := histCount(m, holdDuration, ""); got != 0 {
				t.Errorf("hold durations without error.type: %d, want 0", got)
			}
		})
	}
}

// A Release that finds its lease gone (ErrLeaseLost) ends the hold with
// error.type lease_lost, before it returns.
func TestReleaseFindsLeaseLost(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant, 0) // 30 s: no renewal sees the loss first
			ctx := redistest.Ctx(t, 20*time.Second)
			l, err := s.sem.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			s.loseKeys(t, ctx)
			if err := l.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("Release after the keys were deleted: %v, want ErrLeaseLost", err)
			}
			holds := s.ended("redsem.hold")
			if len(holds) != 1 || attrs(holds[0].Attributes())[redsemotel.AttrErrorType].AsString() != "lease_lost" ||
				holds[0].Status().Code != codes.Error {
				t.Fatalf("hold spans when Release returned: %v", holds)
			}
			m := collect(t, s)
			if got := sumOf(m, "redsem.client.lease.lost"); got != 1 {
				t.Errorf("redsem.client.lease.lost = %v, want 1", got)
			}
			if got := sumOf(m, "redsem.client.slot.usage"); got != 0 {
				t.Errorf("redsem.client.slot.usage = %v, want 0", got)
			}
		})
	}
}

// The wrapped lease behaves as the semaphore's own: every method answers
// the same, before and after Release; a lease ended by Release is not
// lost, and its hold ends once.
func TestLeaseMethods(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant, 0)
			ctx := redistest.Ctx(t, 20*time.Second)
			l, err := s.sem.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			u, ok := l.(interface{ Unwrap() redsem.Lease })
			if !ok {
				t.Fatal("the lease has no Unwrap")
			}
			in := u.Unwrap()
			if l.ID() != in.ID() || l.Slot() != in.Slot() || fmt.Sprint(l.Slots()) != fmt.Sprint(in.Slots()) ||
				l.Token() != in.Token() || !l.Deadline().Equal(in.Deadline()) || l.Done() != in.Done() ||
				l.Context() != in.Context() || l.Err() != nil || len(l.Slots()) != 2 || l.Slot() != l.Slots()[0] {
				t.Fatalf("wrapped lease %s %v %d differs from its own %s %v %d", l.ID(), l.Slots(), l.Token(), in.ID(), in.Slots(), in.Token())
			}
			before := l.Deadline()
			time.Sleep(2 * time.Millisecond)
			if err := l.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			if !l.Deadline().After(before) {
				t.Errorf("Renew did not move the deadline: %v, then %v", before, l.Deadline())
			}
			select {
			case <-l.Done():
				t.Fatal("Done closed while held")
			default:
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Done():
			default:
				t.Fatal("Done still open after Release")
			}
			if l.Err() != nil || !errors.Is(context.Cause(l.Context()), context.Canceled) {
				t.Errorf("after Release: Err %v, Context cause %v", l.Err(), context.Cause(l.Context()))
			}
			if err := l.Renew(ctx); !errors.Is(err, redsem.ErrReleased) {
				t.Errorf("Renew after Release: %v, want ErrReleased", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("second Release: %v, want nil", err)
			}
			st, err := s.sem.Status(ctx)
			if err != nil || len(st.Holders) != 0 {
				t.Fatalf("Status after Release: %+v, %v", st, err)
			}
			if n := len(s.ended("redsem.hold")); n != 1 {
				t.Errorf("%d hold spans after two Releases, want 1", n)
			}
			m := collect(t, s)
			if got := sumOf(m, "redsem.client.lease.lost"); got != 0 {
				t.Errorf("redsem.client.lease.lost = %v after a Release, want 0", got)
			}
			if got := histCount(m, holdDuration, ""); got != 1 {
				t.Errorf("released hold durations: %d, want 1", got)
			}
		})
	}
}

// Metrics after a known workload: counts by error.type, the gauges back to
// zero once every call returned and every lease ended, one lease lost.
func TestMetrics(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			s := newSetup(t, variant, 300*time.Millisecond)
			ctx := redistest.Ctx(t, 20*time.Second)
			var leases []redsem.Lease
			for i := 0; i < 2; i++ { // 2 granted
				l, err := s.sem.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, l)
			}
			for i := 0; i < 3; i++ { // 3 no_slot
				if _, err := s.sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatal(err)
				}
			}
			tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond) // 1 timeout
			if _, err := s.sem.Acquire(tctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatal(err)
			}
			cancel()
			if _, err := s.sem.TryAcquireN(ctx, 0); !errors.Is(err, redsem.ErrWeight) { // 1 error
				t.Fatal(err)
			}
			// One waiter, in flight while we look, then granted (3rd granted).
			got := make(chan redsem.Lease, 1)
			go func() {
				l, err := s.sem.Acquire(ctx)
				if err != nil {
					t.Error(err)
				}
				got <- l
			}()
			redistest.WaitFor(t, 5*time.Second, "the waiter counted", func() (bool, error) {
				return sumOf(collect(t, s), "redsem.client.acquire.pending") == 1, nil
			})
			if held := sumOf(collect(t, s), "redsem.client.slot.usage"); held != 2 {
				t.Fatalf("redsem.client.slot.usage = %v with two leases, want 2", held)
			}
			for _, l := range leases { // 2 released
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			w := <-got
			if w == nil {
				t.FailNow()
			}
			if held := sumOf(collect(t, s), "redsem.client.slot.usage"); held != 1 {
				t.Fatalf("redsem.client.slot.usage = %v with the waiter's lease, want 1", held)
			}
			s.loseKeys(t, ctx) // 1 lost
			<-w.Done()
			s.waitHolds(t, 3)

			m := collect(t, s)
			for name, want := range map[string]float64{"redsem.client.slot.usage": 0, "redsem.client.acquire.pending": 0, "redsem.client.lease.lost": 1} {
				if got := sumOf(m, name); got != want {
					t.Errorf("%s = %v after the workload, want %v", name, got, want)
				}
			}
			for outcome, want := range map[string]uint64{"": 3, "no_slot": 3, "timeout": 1, "canceled": 0, "_OTHER": 1, "closed": 0} {
				if n := histCount(m, acquireDuration, outcome); n != want {
					t.Errorf("%s acquire durations: %d, want %d", outcome, n, want)
				}
			}
			for outcome, want := range map[string]uint64{"": 2, "lease_lost": 1} {
				if n := histCount(m, holdDuration, outcome); n != want {
					t.Errorf("%s hold durations: %d, want %d", outcome, n, want)
				}
			}
			wantUnits := map[string]string{acquireDuration: "s", holdDuration: "s",
				"redsem.client.slot.usage": "{slot}", "redsem.client.acquire.pending": "{request}", "redsem.client.lease.lost": "{lease}"}
			seen := 0
			for _, sm := range m.ScopeMetrics {
				if sm.Scope.Name != redsemotel.ScopeName || redsemotel.ScopeName != "github.com/redsem/redsem/redsemotel" ||
					sm.Scope.Version != redsemotel.Version() || sm.Scope.Version == "" {
					t.Errorf("scope %q version %q, want version %q", sm.Scope.Name, sm.Scope.Version, redsemotel.Version())
				}
				for _, mt := range sm.Metrics {
					seen++
					if mt.Unit != wantUnits[mt.Name] {
						t.Errorf("%s: unit %q, want %q", mt.Name, mt.Unit, wantUnits[mt.Name])
					}
					checkInstrument(t, mt, s.sem.Name(), variant)
				}
			}
			if seen != len(wantUnits) {
				t.Errorf("%d metrics, want %d", seen, len(wantUnits))
			}
		})
	}
}

// checkInstrument checks the kind of the metric's instrument and that each
// of its points has redsem.semaphore.name and .variant, and nothing else
// but (on the histograms, on failure) error.type.
func checkInstrument(t *testing.T, mt metricdata.Metrics, name, variant string) {
	t.Helper()
	var sets []attribute.Set
	switch d := mt.Data.(type) {
	case metricdata.Histogram[float64]:
		if mt.Name != acquireDuration && mt.Name != holdDuration {
			t.Errorf("%s is a histogram", mt.Name)
		}
		for _, p := range d.DataPoints {
			if p.Attributes.Len() != 2 && (p.Attributes.Len() != 3 || !p.Attributes.HasValue(redsemotel.AttrErrorType)) {
				t.Errorf("%s: point attributes %v", mt.Name, p.Attributes.ToSlice())
			}
			sets = append(sets, p.Attributes)
		}
	case metricdata.Sum[int64]:
		wantMonotonic := mt.Name == "redsem.client.lease.lost"
		if d.IsMonotonic != wantMonotonic || (!wantMonotonic && mt.Name != "redsem.client.slot.usage" && mt.Name != "redsem.client.acquire.pending") {
			t.Errorf("%s: monotonic %v", mt.Name, d.IsMonotonic)
		}
		for _, p := range d.DataPoints {
			if p.Attributes.Len() != 2 {
				t.Errorf("%s: point attributes %v", mt.Name, p.Attributes.ToSlice())
			}
			sets = append(sets, p.Attributes)
		}
	default:
		t.Errorf("%s: data %T", mt.Name, mt.Data)
	}
	for _, set := range sets {
		if v, ok := set.Value(redsemotel.AttrSemaphoreName); !ok || v.AsString() != name {
			t.Errorf("%s: redsem.semaphore.name %v", mt.Name, v)
		}
		if v, ok := set.Value(redsemotel.AttrSemaphoreVariant); !ok || v.AsString() != variant {
			t.Errorf("%s: redsem.semaphore.variant %v", mt.Name, v)
		}
	}
}

// Many goroutines at once (the race detector watches): a span per call,
// one hold per grant, and the gauges back to zero.
func TestConcurrent(t *testing.T) {
	s := newSetup(t, "unfair", 0)
	ctx := redistest.Ctx(t, 30*time.Second)
	const workers, rounds = 8, 15
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				l, err := s.sem.Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := len(s.ended("redsem.acquire")); n != workers*rounds {
		t.Errorf("%d acquire spans, want %d", n, workers*rounds)
	}
	if n := len(s.ended("redsem.hold")); n != workers*rounds {
		t.Errorf("%d hold spans, want %d", n, workers*rounds)
	}
	m := collect(t, s)
	if got := sumOf(m, "redsem.client.slot.usage") + sumOf(m, "redsem.client.acquire.pending") + sumOf(m, "redsem.client.lease.lost"); got != 0 {
		t.Errorf("held + waiting + lost = %v, want 0", got)
	}
}

// Without options, Wrap uses the global providers.
func TestGlobalProviders(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	oldTP, oldMP := otel.GetTracerProvider(), otel.GetMeterProvider()
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTracerProvider(oldTP)
		otel.SetMeterProvider(oldMP)
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	base, err := unfair.New(redistest.Client(t), redistest.Name(t), 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base)
	defer sem.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	l, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(spans.Ended()); n != 2 {
		t.Errorf("%d spans in the global provider, want 2", n)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if len(rm.ScopeMetrics) != 1 || rm.ScopeMetrics[0].Scope.Name != redsemotel.ScopeName {
		t.Errorf("global meter provider: %+v", rm.ScopeMetrics)
	}
}

// Outcome names each error as the spans do.
func TestOutcome(t *testing.T) {
	for err, want := range map[error]string{
		nil:                                   "granted",
		redsem.ErrNoSlot:                      "no_slot",
		fmt.Errorf("x: %w", redsem.ErrNoSlot): "no_slot",
		context.DeadlineExceeded:              "timeout",
		context.Canceled:                      "canceled",
		redsem.ErrClosed:                      "closed",
		redsem.ErrWeight:                      "error",
		errors.New("redis down"):              "error",
	} {
		if got := redsemotel.Outcome(err); got != want {
			t.Errorf("Outcome(%v) = %q, want %q", err, got, want)
		}
	}
}

// Unwrap reaches the semaphore behind the wrapper; the rest passes through.
func TestPassThrough(t *testing.T) {
	s := newSetup(t, "unfair", 0)
	ctx := redistest.Ctx(t, 10*time.Second)
	u, ok := s.sem.(interface{ Unwrap() redsem.Semaphore })
	if !ok || u.Unwrap() == nil || u.Unwrap().Name() != s.sem.Name() {
		t.Fatal("the wrapper has no Unwrap to the semaphore it wraps")
	}
	if _, ok := u.Unwrap().(*unfair.Semaphore); !ok {
		t.Fatalf("Unwrap returned a %T", u.Unwrap())
	}
	// redsemsql reaches the engine through it (and through a wrapper of
	// the wrapper).
	if core.EngineOf(s.sem) == nil || core.EngineOf(redsemotel.Wrap(s.sem)) == nil {
		t.Fatal("core.EngineOf does not see through the wrapper")
	}
	if err := s.sem.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st, err := s.sem.Status(ctx)
	if err != nil || st.Limit != 3 {
		t.Fatalf("Status after SetLimit(3): %+v, %v", st, err)
	}
	if err := s.sem.SetRate(ctx, redsem.Rate{Limit: 7, Per: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.sem.Status(ctx); err != nil || st.Rate != (redsem.Rate{Limit: 7, Per: time.Minute}) {
		t.Fatalf("Status after SetRate(7/1m): %+v, %v", st, err)
	}
	if len(s.spans.Ended()) != 0 {
		t.Fatalf("Status, SetLimit and SetRate made %d spans, want none", len(s.spans.Ended()))
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
func sumOf(rm metricdata.ResourceMetrics, name string) float64 {
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
// error.type et ("": without error.type).
func histCount(rm metricdata.ResourceMetrics, name, et string) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value("error.type"); v.AsString() == et {
						n += p.Count
					}
				}
			}
		}
	}
	return n
}

// panicking is a semaphore whose Acquire panics (a bug in a wrapped
// implementation); the rest is a real semaphore's.
type panicking struct{ redsem.Semaphore }

func (panicking) Acquire(context.Context) (redsem.Lease, error) { panic("boom") }

// A panic in the wrapped Acquire goes on to the caller, but leaves no call
// counted as waiting and no acquire span open.
func TestPanicInAcquire(t *testing.T) {
	s := newSetup(t, "unfair", 0)
	sem := redsemotel.Wrap(panicking{s.sem.(interface{ Unwrap() redsem.Semaphore }).Unwrap()},
		redsemotel.WithTracerProvider(s.tp), redsemotel.WithMeterProvider(s.mp))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the wrapped Acquire's panic", r)
			}
		}()
		_, _ = sem.Acquire(context.Background())
	}()
	if got := sumOf(collect(t, s), "redsem.client.acquire.pending"); got != 0 {
		t.Fatalf("redsem.client.acquire.pending = %v after a panicking Acquire, want 0", got)
	}
	acq := s.ended("redsem.acquire")
	if len(acq) != 1 || acq[0].Status().Code != codes.Error {
		t.Fatalf("%d ended acquire spans (%v), want one with status Error", len(acq), acq)
	}
}
