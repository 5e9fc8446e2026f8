package redsemotel_test

// Tests of promises that docs/promises.md listed as gaps: each checks one
// promise of the package's docs through Wrap (or WrapFamily), on real
// semaphores of both variants.

import (
	"context"
	"errors"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// newBase builds an unwrapped semaphore of the variant on c (limit 2),
// closed when the test ends.
func newBase(t *testing.T, variant string, c redis.UniversalClient, name string) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	if variant == "fair" {
		s, err = fair.New(c, name, 2, fair.Options{})
	} else {
		s, err = unfair.New(c, name, 2, unfair.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// cutClient is a client of the shared server through a proxy, whose
// connection to Redis the test cuts: "refused" (every connection reset,
// new dials refused: Redis down) or "black hole" (nothing answered: a
// partition, a hung server). Its reads wait up to 30 s: only a context
// ends a call sooner.
type cutClient struct {
	client *redis.Client
	proxy  *redistest.Proxy
	refuse atomic.Bool
}

func newCutClient(t *testing.T) *cutClient {
	t.Helper()
	srv := redistest.Shared(t)
	c := &cutClient{proxy: redistest.StartProxy(t, srv.Addr)}
	opt := srv.Options()
	opt.Addr = c.proxy.Addr
	opt.ReadTimeout, opt.WriteTimeout = 30*time.Second, 30*time.Second
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if c.refuse.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c.client = redis.NewClient(opt)
	t.Cleanup(func() { _ = c.client.Close() })
	return c
}

func (c *cutClient) cut(t *testing.T, mode string) {
	t.Helper()
	switch mode {
	case "refused":
		c.refuse.Store(true)
		c.proxy.ResetAll()
	case "black hole":
		c.proxy.SetBlackhole(true)
	default:
		t.Fatalf("unknown cut %q", mode)
	}
}

func (c *cutClient) heal() {
	c.refuse.Store(false)
	c.proxy.SetBlackhole(false)
}

// A Release that fails with another error than ErrLeaseLost (Redis
// refused, or not answering) leaves the lease held, in Redis and for the
// instruments: its hold span open, its slot counted in
// redsem.client.slot.usage, nothing counted lost. Once Redis is back and a
// Release succeeds, the hold ends once, as released.
func TestReleaseFailsOtherwise(t *testing.T) {
	for _, variant := range variants {
		for _, mode := range []string{"refused", "black hole"} {
			t.Run(variant+"/"+mode, func(t *testing.T) {
				ctx := redistest.Ctx(t, 30*time.Second)
				name := redistest.Name(t)
				p := newProviders(t)
				cc := newCutClient(t)
				sem := redsemotel.Wrap(newBase(t, variant, cc.client, name), p.opts()...)
				watch := newBase(t, variant, redistest.Client(t), name) // reads Status past the cut
				l, err := sem.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				cc.cut(t, mode)
				rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				err = l.Release(rctx)
				cancel()
				if err == nil || errors.Is(err, redsem.ErrLeaseLost) {
					t.Fatalf("Release with Redis cut off: %v, want another error than ErrLeaseLost", err)
				}
				t.Logf("Release with Redis cut off (%s): %v", mode, err)

				for _, sp := range p.spans.Ended() {
					if sp.Name() == "redsem.hold" {
						t.Fatal("the failed Release ended the hold span")
					}
				}
				select {
				case <-l.Done():
					t.Fatal("the lease's Done closed by the failed Release")
				default:
				}
				if l.Err() != nil {
					t.Fatalf("lease Err %v after the failed Release, want nil (held)", l.Err())
				}
				m := p.collect(t)
				if got := sumOf(m, "redsem.client.slot.usage"); got != 1 {
					t.Fatalf("redsem.client.slot.usage = %v after the failed Release, want 1", got)
				}
				if got := sumOf(m, "redsem.client.lease.lost"); got != 0 {
					t.Fatalf("redsem.client.lease.lost = %v after the failed Release, want 0", got)
				}
				if got := histCount(m, holdDuration, "") + histCount(m, holdDuration, "lease_lost"); got != 0 {
					t.Fatalf("%d hold durations recorded by the failed Release, want 0", got)
				}
				st, err := watch.Status(ctx)
				if err != nil || len(st.Holders) != 1 || st.Holders[0].ID != l.ID() {
					t.Fatalf("Status after the failed Release: %+v, %v; want the lease held", st, err)
				}

				cc.heal()
				if err := l.Release(ctx); err != nil {
					t.Fatalf("Release once Redis is back: %v", err)
				}
				var holds []string
				for _, sp := range p.spans.Ended() {
					if sp.Name() != "redsem.hold" {
						continue
					}
					holds = append(holds, sp.Name())
					if et, ok := attrs(sp.Attributes())[redsemotel.AttrErrorType]; ok || sp.Status().Code != codes.Unset {
						t.Errorf("hold span: error.type %v (set: %v), status %v; want a released hold", et, ok, sp.Status())
					}
				}
				if len(holds) != 1 {
					t.Fatalf("%d hold spans ended once Release succeeded, want 1", len(holds))
				}
				m = p.collect(t)
				if got := sumOf(m, "redsem.client.slot.usage"); got != 0 {
					t.Errorf("redsem.client.slot.usage = %v after the release, want 0", got)
				}
				if got := sumOf(m, "redsem.client.lease.lost"); got != 0 {
					t.Errorf("redsem.client.lease.lost = %v, want 0", got)
				}
				if got, lost := histCount(m, holdDuration, ""), histCount(m, holdDuration, "lease_lost"); got != 1 || lost != 0 {
					t.Errorf("hold durations: %d released, %d lost; want 1, 0", got, lost)
				}
				if st, err := watch.Status(ctx); err != nil || len(st.Holders) != 0 {
					t.Errorf("Status after the release: %+v, %v", st, err)
				}
			})
		}
	}
}

// statusGauges are the gauges of WithStatusMetrics.
var statusGauges = []string{"redsem.semaphore.limit", "redsem.semaphore.usage", "redsem.semaphore.queue.size"}

// namesOn returns the redsem.semaphore.name of every point of the metric.
func namesOn(rm metricdata.ResourceMetrics, metric string) []string {
	var out []string
	for _, set := range points(rm, metric) {
		v, _ := set.Value(redsemotel.AttrSemaphoreName)
		out = append(out, v.AsString())
	}
	return out
}

// A WithStatusMetrics read that fails (a Redis that does not answer,
// reads that would wait 30 s) reports no point for its semaphore, while
// another semaphore's read on the same provider reports its own; the
// error is the collection's (the SDK's to handle), and the read ends
// within 2 s.
func TestStatusMetricsReadFails(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			p := newProviders(t)
			cc := newCutClient(t)
			cc.cut(t, "black hole")
			broken := redsemotel.Wrap(newBase(t, variant, cc.client, redistest.Name(t)), p.opts(redsemotel.WithStatusMetrics())...)
			t.Cleanup(func() { _ = broken.Close() })
			healthy := redsemotel.Wrap(newBase(t, variant, redistest.Client(t), redistest.Name(t)), p.opts(redsemotel.WithStatusMetrics())...)
			t.Cleanup(func() { _ = healthy.Close() })
			l, err := healthy.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()

			var rm metricdata.ResourceMetrics
			start := time.Now()
			err = p.reader.Collect(context.Background(), &rm) // no deadline but the package's
			took := time.Since(start)
			t.Logf("collection took %v: %v", took.Round(time.Millisecond), err)
			if err == nil || !strings.Contains(err.Error(), broken.Name()) {
				t.Fatalf("collection error %v, want the failed read of %q", err, broken.Name())
			}
			if took > 2*time.Second+time.Second {
				t.Fatalf("the collection took %v; a read takes at most 2 s", took)
			}
			for _, g := range statusGauges {
				if names := namesOn(rm, g); len(names) != 1 || names[0] != healthy.Name() {
					t.Errorf("%s: points of %v, want one, of %q only", g, names, healthy.Name())
				}
			}
			if v, ok := gauge(rm, "redsem.semaphore.usage"); !ok || v != 1 {
				t.Errorf("redsem.semaphore.usage of the healthy semaphore: %v (%v), want 1", v, ok)
			}
		})
	}
}

// otelErrors routes the OpenTelemetry error handler (global, set once for
// the test binary) to the running test's sink.
var otelErrors struct {
	once sync.Once
	mu   sync.Mutex
	sink func(error)
}

// catchOtelErrors sends what reaches otel's error handler to sink until
// the test ends.
func catchOtelErrors(t *testing.T, sink func(error)) {
	otelErrors.once.Do(func() {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			otelErrors.mu.Lock()
			s := otelErrors.sink
			otelErrors.mu.Unlock()
			if s != nil {
				s(err)
				return
			}
			log.Print(err)
		}))
	})
	otelErrors.mu.Lock()
	otelErrors.sink = sink
	otelErrors.mu.Unlock()
	t.Cleanup(func() {
		otelErrors.mu.Lock()
		otelErrors.sink = nil
		otelErrors.mu.Unlock()
	})
}

// capture is a metric exporter that keeps the semaphore names of the
// status gauges' points it was given.
type capture struct {
	mu    sync.Mutex
	names map[string]int
}

func (c *capture) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (c *capture) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (c *capture) Export(_ context.Context, rm *metricdata.ResourceMetrics) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range statusGauges {
		for _, n := range namesOn(*rm, g) {
			c.names[n]++
		}
	}
	return nil
}

func (c *capture) ForceFlush(context.Context) error { return nil }
func (c *capture) Shutdown(context.Context) error   { return nil }

func (c *capture) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names[name]
}

// Under a periodic reader (an exporting SDK), the failed read goes to
// otel's error handler, and no point of the semaphore is exported.
func TestStatusMetricsReadFailsToErrorHandler(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			cc := newCutClient(t)
			cc.cut(t, "black hole")
			name := redistest.Name(t)
			var handled atomic.Int64
			var first atomic.Value
			catchOtelErrors(t, func(err error) {
				if strings.Contains(err.Error(), name) {
					if handled.Add(1) == 1 {
						first.Store(err.Error())
					}
				}
			})
			exp := &capture{names: map[string]int{}}
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(100*time.Millisecond))))
			broken := redsemotel.Wrap(newBase(t, variant, cc.client, name),
				redsemotel.WithMeterProvider(mp), redsemotel.WithStatusMetrics())
			t.Cleanup(func() {
				_ = broken.Close() // no read at the shutdown's collection
				_ = mp.Shutdown(context.Background())
			})
			redistest.WaitFor(t, 15*time.Second, "the failed read at otel's error handler", func() (bool, error) {
				return handled.Load() > 0, nil
			})
			t.Logf("error handler got: %v", first.Load())
			if n := exp.count(broken.Name()); n != 0 {
				t.Fatalf("%d status points of the semaphore whose read failed were exported", n)
			}
		})
	}
}

// An attribute of WithAttributes with the key of one of the package's own
// (redsem.semaphore.name, redsem.semaphore.variant) replaces it, on every
// span and every metric point (the status gauges too): its value, once.
func TestWithAttributesReplacesOwn(t *testing.T) {
	own := []attribute.KeyValue{redsemotel.AttrSemaphoreName.String("x"), redsemotel.AttrSemaphoreVariant.String("custom")}
	check := func(t *testing.T, p *providers, wantSpans, wantPoints int) {
		t.Helper()
		spans := p.spans.Ended()
		if len(spans) != wantSpans {
			t.Fatalf("%d spans, want %d", len(spans), wantSpans)
		}
		for _, sp := range spans {
			for _, kv := range own {
				var vals []string
				for _, a := range sp.Attributes() {
					if a.Key == kv.Key {
						vals = append(vals, a.Value.Emit())
					}
				}
				if len(vals) != 1 || vals[0] != kv.Value.AsString() {
					t.Errorf("span %s: %s = %q, want %q once", sp.Name(), kv.Key, vals, kv.Value.AsString())
				}
			}
		}
		rm := p.collect(t)
		n := 0
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				for _, set := range points(rm, m.Name) {
					n++
					for _, kv := range own {
						if v, ok := set.Value(kv.Key); !ok || v.AsString() != kv.Value.AsString() {
							t.Errorf("%s: point %v, want %s=%q", m.Name, set.ToSlice(), kv.Key, kv.Value.AsString())
						}
					}
				}
			}
		}
		if n < wantPoints {
			t.Errorf("%d metric points, want at least %d", n, wantPoints)
		}
	}
	for _, variant := range variants {
		t.Run(variant+"/Wrap", func(t *testing.T) {
			ctx := redistest.Ctx(t, 20*time.Second)
			p := newProviders(t)
			sem := redsemotel.Wrap(newBase(t, variant, redistest.Client(t), redistest.Name(t)),
				p.opts(redsemotel.WithStatusMetrics(), redsemotel.WithAttributes(own...))...)
			t.Cleanup(func() { _ = sem.Close() })
			l, err := sem.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// Spans: acquire, no_slot, hold. Points: acquire durations (ok,
			// no_slot), hold duration, slot usage, pending, three gauges.
			check(t, p, 3, 2+1+1+1+3)
		})
		t.Run(variant+"/WrapFamily", func(t *testing.T) {
			ctx := redistest.Ctx(t, 20*time.Second)
			p := newProviders(t)
			var fam interface {
				Get(string) (redsem.Semaphore, error)
				Close() error
			}
			if variant == "fair" {
				f, err := fair.NewFamily(redistest.Client(t), redistest.Name(t), 2, fair.FamilyOptions{})
				if err != nil {
					t.Fatal(err)
				}
				fam = redsemotel.WrapFamily(f, p.opts(redsemotel.WithAttributes(own...))...)
			} else {
				f, err := unfair.NewFamily(redistest.Client(t), redistest.Name(t), 2, unfair.FamilyOptions{})
				if err != nil {
					t.Fatal(err)
				}
				fam = redsemotel.WrapFamily(f, p.opts(redsemotel.WithAttributes(own...))...)
			}
			t.Cleanup(func() { _ = fam.Close() })
			sem, err := fam.Get("tenant-a")
			if err != nil {
				t.Fatal(err)
			}
			l, err := sem.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sem.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			check(t, p, 3, 2+1+1+1)
		})
	}
}
