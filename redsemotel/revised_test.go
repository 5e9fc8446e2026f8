package redsemotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// providers are in-memory providers, shut down when the test ends.
type providers struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
}

func newProviders(t *testing.T) *providers {
	t.Helper()
	p := &providers{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.spans))
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	t.Cleanup(func() { _ = p.tp.Shutdown(context.Background()); _ = p.mp.Shutdown(context.Background()) })
	return p
}

func (p *providers) opts(more ...redsemotel.Option) []redsemotel.Option {
	return append([]redsemotel.Option{redsemotel.WithTracerProvider(p.tp), redsemotel.WithMeterProvider(p.mp)}, more...)
}

func (p *providers) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// points returns the attribute sets of every point of the metric name.
func points(rm metricdata.ResourceMetrics, name string) []attribute.Set {
	var out []attribute.Set
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			}
		}
	}
	return out
}

// gauge returns the value of the int64 gauge name (ok: it has one point).
func gauge(rm metricdata.ResourceMetrics, name string) (v int64, ok bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, isG := m.Data.(metricdata.Gauge[int64]); isG && m.Name == name && len(g.DataPoints) == 1 {
				return g.DataPoints[0].Value, true
			}
		}
	}
	return 0, false
}

// ErrorType names every error the acquire calls return.
func TestErrorType(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{redsem.ErrNoSlot, "no_slot"},
		{fmt.Errorf("x: %w", redsem.ErrNoSlot), "no_slot"},
		{&redsem.RateLimitedError{RetryAfter: time.Second}, "rate_limited"},
		{redsem.ErrQueueFull, "queue_full"},
		{context.DeadlineExceeded, "timeout"},
		{context.Canceled, "canceled"},
		{redsem.ErrClosed, "closed"},
		{errors.Join(redsem.ErrUnavailable, context.DeadlineExceeded), "unavailable"},
		{errors.Join(context.DeadlineExceeded, &redsem.RateLimitedError{RetryAfter: time.Second}), "timeout"},
		{redsem.ErrWeight, "_OTHER"},
		{&redsem.LimitMismatchError{Client: 1, Established: 2}, "_OTHER"},
		{errors.New("boom"), "_OTHER"},
	} {
		if got := redsemotel.ErrorType(c.err); got != c.want {
			t.Errorf("ErrorType(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// failing is a semaphore whose acquire calls all fail with err.
type failing struct {
	redsem.Semaphore
	err error
}

func (f failing) Acquire(context.Context) (redsem.Lease, error)          { return nil, f.err }
func (f failing) TryAcquire(context.Context) (redsem.Lease, error)       { return nil, f.err }
func (f failing) AcquireN(context.Context, int) (redsem.Lease, error)    { return nil, f.err }
func (f failing) TryAcquireN(context.Context, int) (redsem.Lease, error) { return nil, f.err }

// A failed acquire sets error.type on its span and its duration, with no
// RecordError event; status Error only for unavailable and _OTHER. A rate
// refusal is rate_limited.
func TestErrorTypeOnSpansAndMetrics(t *testing.T) {
	p := newProviders(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	base, err := unfair.New(redistest.Client(t), redistest.Name(t), 2, unfair.Options{Rate: redsem.Rate{Limit: 1, Per: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base, p.opts()...)
	t.Cleanup(func() { _ = sem.Close() })
	l, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrRateLimited) {
		t.Fatalf("second TryAcquire under a rate of 1/min: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	down := redsemotel.Wrap(failing{base, fmt.Errorf("dial: %w", redsem.ErrUnavailable)}, p.opts()...)
	if _, err := down.Acquire(ctx); !errors.Is(err, redsem.ErrUnavailable) {
		t.Fatal(err)
	}

	var got []string
	for _, sp := range p.spans.Ended() {
		if sp.Name() != "redsem.acquire" {
			continue
		}
		et, ok := attrs(sp.Attributes())[redsemotel.AttrErrorType]
		got = append(got, fmt.Sprintf("%s/%v/%v", et.AsString(), ok, sp.Status().Code))
		if len(sp.Events()) != 0 {
			t.Errorf("span with error.type %q has events %v (RecordError)", et.AsString(), sp.Events())
		}
	}
	want := []string{"/false/Unset", "rate_limited/true/Unset", "unavailable/true/Error"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("acquire spans (error.type/set/status) %v, want %v", got, want)
	}
	m := p.collect(t)
	for et, want := range map[string]uint64{"": 1, "rate_limited": 1, "unavailable": 1} {
		if n := histCount(m, acquireDuration, et); n != want {
			t.Errorf("acquire durations with error.type %q: %d, want %d", et, n, want)
		}
	}
	for _, set := range points(m, holdDuration) {
		if set.HasValue(redsemotel.AttrErrorType) {
			t.Errorf("a released hold's duration has error.type: %v", set.ToSlice())
		}
	}
}

// WrapFamily labels metrics by the family's name, not by key (the key is on
// the spans only), unless WithKeyAttribute; both variants.
func TestWrapFamily(t *testing.T) {
	type family interface {
		Get(string) (redsem.Semaphore, error)
		Name() string
		Close() error
	}
	for _, variant := range variants {
		for _, withKey := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/key=%v", variant, withKey), func(t *testing.T) {
				p := newProviders(t)
				ctx := redistest.Ctx(t, 20*time.Second)
				name := redistest.Name(t)
				opts := p.opts()
				if withKey {
					opts = append(opts, redsemotel.WithKeyAttribute())
				}
				var fam family
				if variant == "fair" {
					f, err := fair.NewFamily(redistest.Client(t), name, 1, fair.FamilyOptions{})
					if err != nil {
						t.Fatal(err)
					}
					fam = redsemotel.WrapFamily(f, opts...)
				} else {
					f, err := unfair.NewFamily(redistest.Client(t), name, 1, unfair.FamilyOptions{})
					if err != nil {
						t.Fatal(err)
					}
					fam = redsemotel.WrapFamily(f, opts...)
				}
				t.Cleanup(func() { _ = fam.Close() })
				if fam.Name() != name {
					t.Fatalf("Name %q, want %q", fam.Name(), name)
				}
				keys := []string{"tenant-a", "tenant-b", "tenant-c"}
				for _, k := range keys {
					sem, err := fam.Get(k)
					if err != nil {
						t.Fatal(err)
					}
					if sem.Name() != k {
						t.Errorf("member Name %q, want %q", sem.Name(), k)
					}
					l, err := sem.TryAcquire(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
						t.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := fam.Get(""); err == nil {
					t.Error("Get(\"\") did not pass the family's error on")
				}
				var spanKeys []string
				for _, sp := range p.spans.Ended() {
					at := attrs(sp.Attributes())
					if at[redsemotel.AttrSemaphoreName].AsString() != name || at[redsemotel.AttrSemaphoreVariant].AsString() != variant {
						t.Errorf("span %s: %v", sp.Name(), sp.Attributes())
					}
					spanKeys = append(spanKeys, at[redsemotel.AttrSemaphoreKey].AsString())
				}
				// granted, no_slot, hold: per key
				want := []string{"tenant-a", "tenant-a", "tenant-a", "tenant-b", "tenant-b", "tenant-b", "tenant-c", "tenant-c", "tenant-c"}
				if fmt.Sprint(spanKeys) != fmt.Sprint(want) {
					t.Errorf("span keys %v, want %v", spanKeys, want)
				}
				m := p.collect(t)
				for _, metricName := range []string{acquireDuration, holdDuration, "redsem.client.slot.usage", "redsem.client.acquire.pending"} {
					sets := points(m, metricName)
					keyed := map[string]bool{}
					for _, set := range sets {
						v, _ := set.Value(redsemotel.AttrSemaphoreName)
						vv, _ := set.Value(redsemotel.AttrSemaphoreVariant)
						if v.AsString() != name || vv.AsString() != variant {
							t.Errorf("%s: point %v", metricName, set.ToSlice())
						}
						k, ok := set.Value(redsemotel.AttrSemaphoreKey)
						if ok != withKey {
							t.Errorf("%s: point %v: key present %v, want %v", metricName, set.ToSlice(), ok, withKey)
						}
						keyed[k.AsString()] = true
					}
					if withKey && len(keyed) != len(keys) {
						t.Errorf("%s: keys %v on the metrics, want %v", metricName, keyed, keys)
					}
					if !withKey && metricName != acquireDuration && len(sets) != 1 {
						t.Errorf("%s: %d points for %d keys, want 1", metricName, len(sets), len(keys))
					}
				}
				if n := histCount(m, acquireDuration, ""); n != 3 {
					t.Errorf("granted acquire durations %d, want 3", n)
				}
			})
		}
	}
}

// WithoutHoldSpans leaves out the hold spans; the hold's metrics stay.
func TestWithoutHoldSpans(t *testing.T) {
	p := newProviders(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	base, err := fair.New(redistest.Client(t), redistest.Name(t), 2, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base, p.opts(redsemotel.WithoutHoldSpans())...)
	t.Cleanup(func() { _ = sem.Close() })
	l, err := sem.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := sumOf(p.collect(t), "redsem.client.slot.usage"); got != 2 {
		t.Errorf("slot usage %v while held, want 2", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range p.spans.Ended() {
		names = append(names, sp.Name())
	}
	if fmt.Sprint(names) != "[redsem.acquire]" {
		t.Errorf("spans %v, want only redsem.acquire", names)
	}
	m := p.collect(t)
	if n := histCount(m, holdDuration, ""); n != 1 {
		t.Errorf("hold durations %d, want 1", n)
	}
	if got := sumOf(m, "redsem.client.slot.usage"); got != 0 {
		t.Errorf("slot usage %v after Release, want 0", got)
	}
}

// WithAttributes puts static attributes on every span and metric point.
func TestWithAttributes(t *testing.T) {
	p := newProviders(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	base, err := unfair.New(redistest.Client(t), redistest.Name(t), 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base, p.opts(redsemotel.WithAttributes(attribute.String("pool", "gpu")),
		redsemotel.WithAttributes(attribute.Int("shard", 3)))...)
	t.Cleanup(func() { _ = sem.Close() })
	l, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(p.spans.Ended()); n != 3 {
		t.Fatalf("%d spans, want 3", n)
	}
	for _, sp := range p.spans.Ended() {
		at := attrs(sp.Attributes())
		if at["pool"].AsString() != "gpu" || at["shard"].AsInt64() != 3 {
			t.Errorf("span %s: %v", sp.Name(), sp.Attributes())
		}
	}
	m := p.collect(t)
	n := 0
	for _, name := range []string{acquireDuration, holdDuration, "redsem.client.slot.usage", "redsem.client.acquire.pending"} {
		for _, set := range points(m, name) {
			n++
			pool, _ := set.Value("pool")
			shard, _ := set.Value("shard")
			if pool.AsString() != "gpu" || shard.AsInt64() != 3 {
				t.Errorf("%s: point %v", name, set.ToSlice())
			}
		}
	}
	if n < 5 {
		t.Errorf("%d points, want at least 5", n)
	}
}

// WithStatusMetrics reports the limit, the usage of every process and the
// queue, read from Status on collection; without it there are none, and
// after Close they stop.
func TestStatusMetrics(t *testing.T) {
	p := newProviders(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	base, err := fair.New(redistest.Client(t), name, 3, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base, p.opts(redsemotel.WithStatusMetrics())...)
	// Another process's client, unwrapped: its leases count in the usage.
	other, err := fair.New(redistest.Client(t), name, 3, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	mine, err := sem.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { // queued: the semaphore is full
		l, err := other.Acquire(ctx)
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	redistest.WaitFor(t, 5*time.Second, "a waiter queued", func() (bool, error) {
		n, ok := gauge(p.collect(t), "redsem.semaphore.queue.size")
		return ok && n == 1, nil
	})
	m := p.collect(t)
	for gname, want := range map[string]int64{"redsem.semaphore.limit": 3, "redsem.semaphore.usage": 3, "redsem.semaphore.queue.size": 1} {
		if v, ok := gauge(m, gname); !ok || v != want {
			t.Errorf("%s = %v (reported: %v), want %d", gname, v, ok, want)
		}
		for _, set := range points(m, gname) {
			n, _ := set.Value(redsemotel.AttrSemaphoreName)
			v, _ := set.Value(redsemotel.AttrSemaphoreVariant)
			if n.AsString() != name || v.AsString() != "fair" || set.Len() != 2 {
				t.Errorf("%s: point %v", gname, set.ToSlice())
			}
		}
	}
	for _, l := range []redsem.Lease{mine, theirs} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if v, ok := gauge(p.collect(t), "redsem.semaphore.usage"); !ok || v != 0 {
		t.Errorf("usage %v (%v) after every release, want 0", v, ok)
	}
	if err := sem.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := gauge(p.collect(t), "redsem.semaphore.limit"); ok {
		t.Error("the limit is still read after Close")
	}

	// Without the option: no gauges.
	plain := redsemotel.Wrap(other, p.opts()...)
	defer plain.Close()
	if _, ok := gauge(p.collect(t), "redsem.semaphore.limit"); ok {
		t.Error("a gauge without WithStatusMetrics")
	}
}

// The scope has the module's version, on spans and metrics.
func TestScopeVersion(t *testing.T) {
	if redsemotel.Version() == "" {
		t.Fatal("empty Version")
	}
	s := newSetup(t, "unfair", 0)
	ctx := redistest.Ctx(t, 10*time.Second)
	if _, err := s.sem.TryAcquireN(ctx, 5); !errors.Is(err, redsem.ErrWeight) {
		t.Fatal(err)
	}
	sp := s.ended("redsem.acquire")[0]
	if sc := sp.InstrumentationScope(); sc.Name != redsemotel.ScopeName || sc.Version != redsemotel.Version() {
		t.Errorf("span scope %+v, want %s %s", sc, redsemotel.ScopeName, redsemotel.Version())
	}
	if sp.Status().Code != codes.Error {
		t.Errorf("_OTHER: status %v", sp.Status())
	}
	for _, sm := range collect(t, s).ScopeMetrics {
		if sm.Scope.Name != redsemotel.ScopeName || sm.Scope.Version != redsemotel.Version() {
			t.Errorf("meter scope %+v", sm.Scope)
		}
	}
}

// A lease that Resume returns is held by this process from then on: a
// "redsem.hold" span and its slots in redsem.client.slot.usage until it
// ends. Resume of a lease held already through the same wrapper returns
// the same wrapped lease and counts nothing twice.
func TestResumeHold(t *testing.T) {
	p := newProviders(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	first, err := fair.New(redistest.Client(t), name, 3, fair.Options{LeaseTTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	base, err := fair.New(redistest.Client(t), name, 3, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sem := redsemotel.Wrap(base, p.opts()...)
	t.Cleanup(func() { _ = sem.Close() })
	granted, err := first.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sem.Resume(ctx, granted.ID())
	if err != nil {
		t.Fatal(err)
	}
	again, err := sem.Resume(ctx, granted.ID())
	if err != nil || again != l {
		t.Fatalf("second Resume: %v, %v; want the same wrapped lease", again, err)
	}
	if got := sumOf(p.collect(t), "redsem.client.slot.usage"); got != 2 {
		t.Errorf("slot usage %v with the resumed lease of 2 slots, want 2", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range p.spans.Ended() {
		names = append(names, sp.Name())
	}
	if fmt.Sprint(names) != "[redsem.hold]" {
		t.Errorf("spans %v, want one redsem.hold", names)
	}
	if got := sumOf(p.collect(t), "redsem.client.slot.usage"); got != 0 {
		t.Errorf("slot usage %v after Release, want 0", got)
	}
	<-granted.Done() // the first handle learns at its next renewal
	if granted.Err() != nil {
		t.Errorf("first handle: %v after the release through the resumed one, want nil", granted.Err())
	}
}
