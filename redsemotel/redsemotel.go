package redsemotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the name of the instrumentation scope of the tracer and the
// meter; its version is Version().
const ScopeName = "github.com/redsem/redsem/redsemotel"

// Attribute keys of the spans and the metrics.
const (
	// AttrSemaphoreName is the semaphore's name; for a member of a family
	// wrapped by WrapFamily, the family's name. On every span and metric.
	AttrSemaphoreName = attribute.Key("redsem.semaphore.name")
	// AttrSemaphoreKey is a family member's key (WrapFamily): on its spans,
	// and on its metrics only with WithKeyAttribute.
	AttrSemaphoreKey = attribute.Key("redsem.semaphore.key")
	// AttrSemaphoreVariant is "fair" or "unfair" (absent for another
	// implementation of redsem.Semaphore). On every span and metric.
	AttrSemaphoreVariant = attribute.Key("redsem.semaphore.variant")
	// AttrAcquireWeight is the slots asked for (1, or AcquireN's n), on both
	// spans.
	AttrAcquireWeight = attribute.Key("redsem.acquire.weight")
	// AttrLeaseToken is the granted lease's fencing token (int64), on a
	// granted redsem.acquire span and on redsem.hold.
	AttrLeaseToken = attribute.Key("redsem.lease.token")
	// AttrLeaseSlots is the granted lease's slots (an int slice), on a
	// granted redsem.acquire span and on redsem.hold.
	AttrLeaseSlots = attribute.Key("redsem.lease.slots")
	// AttrErrorType is OpenTelemetry's error.type: set (to one of the
	// ErrorType constants) on a failed acquire's span and duration, and on a
	// lost hold's span and duration; absent on success.
	AttrErrorType = attribute.Key("error.type")
)

// Values of error.type (AttrErrorType), as ErrorType names an acquire's
// error. A span's status is Error only for ErrorTypeUnavailable,
// ErrorTypeOther and ErrorTypeLeaseLost; the others are how a semaphore
// says no, not faults.
const (
	// ErrorTypeNoSlot: TryAcquire or TryAcquireN refused (redsem.ErrNoSlot).
	ErrorTypeNoSlot = "no_slot"
	// ErrorTypeRateLimited: TryAcquire refused by the rate although a slot
	// was free (redsem.ErrRateLimited, which also matches ErrNoSlot).
	ErrorTypeRateLimited = "rate_limited"
	// ErrorTypeQueueFull: a fair AcquireN refused because
	// Options.MaxWaiters waiters were queued (redsem.ErrQueueFull).
	ErrorTypeQueueFull = "queue_full"
	// ErrorTypeTimeout: the context's deadline passed
	// (context.DeadlineExceeded).
	ErrorTypeTimeout = "timeout"
	// ErrorTypeCanceled: the context was cancelled (context.Canceled).
	ErrorTypeCanceled = "canceled"
	// ErrorTypeClosed: the semaphore was closed (redsem.ErrClosed).
	ErrorTypeClosed = "closed"
	// ErrorTypeUnavailable: Redis could not be reached
	// (redsem.ErrUnavailable, even if the context ended meanwhile); the
	// span's status is Error.
	ErrorTypeUnavailable = "unavailable"
	// ErrorTypeOther: any other error (redsem.ErrWeight, a limit mismatch,
	// a grant not replicated, ...); the span's status is Error.
	ErrorTypeOther = "_OTHER"
	// ErrorTypeLeaseLost: a hold that ended by the lease's loss rather
	// than its Release; the hold span's status is Error.
	ErrorTypeLeaseLost = "lease_lost"
)

// errorTypes is every value ErrorType returns, "" (success) included,
// and the hold's lease_lost: the attribute sets are made for these once.
var errorTypes = [...]string{"", ErrorTypeNoSlot, ErrorTypeRateLimited, ErrorTypeQueueFull,
	ErrorTypeTimeout, ErrorTypeCanceled, ErrorTypeClosed, ErrorTypeUnavailable, ErrorTypeOther,
	ErrorTypeLeaseLost}

// ErrorType names the error of an acquire call as error.type does on the
// spans and the metrics: "" for nil (no error.type), else one of the
// ErrorType constants (except ErrorTypeLeaseLost, which is a hold's).
func ErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, redsem.ErrClosed):
		return ErrorTypeClosed
	case errors.Is(err, redsem.ErrUnavailable):
		return ErrorTypeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		// Before the rate: an Acquire that gave up while the rate held it
		// back matches ErrRateLimited too, and it is a timeout.
		return ErrorTypeTimeout
	case errors.Is(err, context.Canceled):
		return ErrorTypeCanceled
	case errors.Is(err, redsem.ErrRateLimited):
		return ErrorTypeRateLimited
	case errors.Is(err, redsem.ErrNoSlot):
		return ErrorTypeNoSlot
	case errors.Is(err, redsem.ErrQueueFull):
		return ErrorTypeQueueFull
	}
	return ErrorTypeOther
}

// faulty reports whether a span with error.type et gets status Error.
func faulty(et string) bool {
	return et == ErrorTypeUnavailable || et == ErrorTypeOther || et == ErrorTypeLeaseLost
}

// Bucket boundaries of the duration histograms, in seconds (advice to the
// SDK; a View may override them). Acquire: OpenTelemetry's semantic
// conventions' duration buckets (5 ms to 10 s), below them 0.5, 1 and 2.5
// ms (a TryAcquire is a Redis round trip), above them 30 s and a minute.
// Hold: 5 ms to 8 hours (under redsemsql a hold lasts as long as a pooled
// connection).
var (
	acquireBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
		0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60}
	holdBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
		60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800}
)

// Option configures Wrap and WrapFamily.
type Option func(*config)

type config struct {
	tp            trace.TracerProvider
	mp            metric.MeterProvider
	attrs         []attribute.KeyValue
	noHoldSpans   bool
	statusMetrics bool
	keyAttr       bool
}

// WithTracerProvider sets the provider of the tracer; default:
// otel.GetTracerProvider() when Wrap is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the provider of the meter; default:
// otel.GetMeterProvider() when Wrap is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithAttributes adds static attributes to every span and every metric
// point (e.g. the service's pool or role; keep their values few, as for
// any metric attribute). Given twice, both sets apply; an attribute with
// the key redsem.semaphore.name or redsem.semaphore.variant replaces the
// package's own; the package's other attributes (the weight, the token and
// slots of a lease, error.type, a family member's redsem.semaphore.key)
// keep their values.
func WithAttributes(kv ...attribute.KeyValue) Option {
	kv = append([]attribute.KeyValue(nil), kv...)
	return func(c *config) { c.attrs = append(c.attrs, kv...) }
}

// WithoutHoldSpans leaves out the "redsem.hold" spans (a hold may last
// hours: under redsemsql, as long as a pooled connection); the acquire
// spans and every metric stay.
func WithoutHoldSpans() Option {
	return func(c *config) { c.noHoldSpans = true }
}

// WithStatusMetrics adds the observable gauges redsem.semaphore.limit,
// redsem.semaphore.usage and redsem.semaphore.queue.size, read from the
// semaphore's Status on each collection: one Redis round trip per
// collection and wrapped semaphore, bounded by the collection's context
// and at most 2 s; a failed read reports no point and goes to the SDK's
// error handler. They are the whole semaphore's (every process's), so
// every process that reports them reports the same numbers: aggregate
// with max, not sum. Wrap the semaphore once with it (not per request);
// Close stops the reads. WrapFamily ignores it: a family has no Status of
// its own, and reading every member's would cost as many round trips as
// keys in use.
func WithStatusMetrics() Option {
	return func(c *config) { c.statusMetrics = true }
}

// WithKeyAttribute puts a family member's key (redsem.semaphore.key) on
// the metrics too, not only on the spans: one series per key in use, so
// only for families with few keys. Only WrapFamily has keys.
func WithKeyAttribute() Option {
	return func(c *config) { c.keyAttr = true }
}

func newConfig(opts []Option) config {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	return c
}

// instruments are the tracer and the instruments that the semaphores of
// one Wrap or WrapFamily share.
type instruments struct {
	tracer    trace.Tracer
	holdSpans bool
	meter     metric.Meter

	acquireDur, holdDur metric.Float64Histogram
	usage, pending      metric.Int64UpDownCounter
	lost                metric.Int64Counter

	// WithStatusMetrics only.
	limitG, usageG, queueG metric.Int64ObservableGauge

	// held maps each lease held now through these instruments (the
	// semaphore's own Lease) to its wrapper (*lease), so that Resume of a
	// lease held already returns its wrapper instead of counting it twice;
	// resumeMu makes Resume's look-up and new hold one step.
	held     sync.Map
	resumeMu sync.Mutex
}

func newInstruments(c *config) *instruments {
	v := Version()
	meter := c.mp.Meter(ScopeName, metric.WithInstrumentationVersion(v))
	in := &instruments{tracer: c.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(v)),
		holdSpans: !c.noHoldSpans, meter: meter}
	// The API's instruments never fail to be made; an SDK that refuses one
	// returns a no-op instrument and reports the error to otel's handler.
	in.acquireDur, _ = meter.Float64Histogram("redsem.client.acquire.duration",
		metric.WithUnit("s"), metric.WithDescription("Duration of acquire calls; error.type on failure."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	in.holdDur, _ = meter.Float64Histogram("redsem.client.hold.duration",
		metric.WithUnit("s"), metric.WithDescription("How long leases were held, from grant to release or loss (error.type lease_lost)."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	in.usage, _ = meter.Int64UpDownCounter("redsem.client.slot.usage",
		metric.WithUnit("{slot}"), metric.WithDescription("Slots held by this process's leases."))
	in.pending, _ = meter.Int64UpDownCounter("redsem.client.acquire.pending",
		metric.WithUnit("{request}"), metric.WithDescription("Acquire calls waiting in this process."))
	in.lost, _ = meter.Int64Counter("redsem.client.lease.lost",
		metric.WithUnit("{lease}"), metric.WithDescription("Leases lost (expired, removed or given up) before their release."))
	if c.statusMetrics {
		in.limitG, _ = meter.Int64ObservableGauge("redsem.semaphore.limit",
			metric.WithUnit("{slot}"), metric.WithDescription("The limit in force, read from Redis on collection."))
		in.usageG, _ = meter.Int64ObservableGauge("redsem.semaphore.usage",
			metric.WithUnit("{slot}"), metric.WithDescription("Slots held by every process's leases, read from Redis on collection."))
		in.queueG, _ = meter.Int64ObservableGauge("redsem.semaphore.queue.size",
			metric.WithUnit("{request}"), metric.WithDescription("Waiters in the fair queue, read from Redis on collection (0 for unfair)."))
	}
	return in
}

// observe registers the callback of the status gauges of sem, with the
// attributes kv; nil if it could not.
func (in *instruments) observe(sem redsem.Semaphore, kv []attribute.KeyValue) metric.Registration {
	set := metric.WithAttributeSet(attribute.NewSet(kv...))
	reg, err := in.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, bounds.StatusRead)
		defer cancel()
		st, err := sem.Status(ctx)
		if err != nil {
			return fmt.Errorf("redsemotel: status of %q: %w", sem.Name(), err)
		}
		var usage int64
		for _, h := range st.Holders {
			usage += int64(max(len(h.Slots), 1))
		}
		o.ObserveInt64(in.limitG, int64(st.Limit), set)
		o.ObserveInt64(in.usageG, usage, set)
		o.ObserveInt64(in.queueG, int64(len(st.Waiters)), set)
		return nil
	}, in.limitG, in.usageG, in.queueG)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	return reg
}

// sets are the metric attribute sets of a semaphore, made once: a set per
// record would cost a sort and an allocation on every call.
type sets struct {
	base  metric.MeasurementOption            // the semaphore's attributes
	byErr map[string]metric.MeasurementOption // and error.type, for each of errorTypes ("" none); read only
}

func newSets(kv []attribute.KeyValue) *sets {
	s := &sets{base: metric.WithAttributeSet(attribute.NewSet(kv...)),
		byErr: make(map[string]metric.MeasurementOption, len(errorTypes))}
	for _, et := range errorTypes {
		if et == "" {
			s.byErr[et] = s.base
			continue
		}
		with := append(append([]attribute.KeyValue(nil), kv...), AttrErrorType.String(et))
		s.byErr[et] = metric.WithAttributeSet(attribute.NewSet(with...))
	}
	return s
}

// variant is "fair" or "unfair" for the semaphores of those packages (also
// behind wrappers with Unwrap() redsem.Semaphore), "" for another.
func variant(sem redsem.Semaphore) string {
	for depth := 0; sem != nil && depth < 16; depth++ {
		switch sem.(type) {
		case *fair.Semaphore:
			return "fair"
		case *unfair.Semaphore:
			return "unfair"
		}
		u, ok := sem.(interface{ Unwrap() redsem.Semaphore })
		if !ok {
			return ""
		}
		sem = u.Unwrap()
	}
	return ""
}

// Wrap returns sem instrumented with OpenTelemetry (API only). Every
// Acquire, AcquireN, TryAcquire and TryAcquireN call makes a span
// "redsem.acquire", a child of the span in its context, ended when the call
// returns; every lease it grants makes a span "redsem.hold", from the grant
// to its release or loss (unless WithoutHoldSpans), and so does every
// lease that Resume returns, from the Resume on. Status, SetLimit,
// SetRate, Name and Close pass through; Close also stops
// WithStatusMetrics' reads.
//
// Its redsem.semaphore.name is sem.Name(): for the members of a keyed
// family, whose names are their keys, use WrapFamily instead, or every key
// becomes a metric series.
//
// The leases it grants are the semaphore's own, wrapped: every Lease method
// behaves the same, and Release also ends the hold span before it returns.
//
// The returned semaphore also has a method Unwrap() redsem.Semaphore that
// returns sem, through which other packages of this module (redsemsql)
// reach the semaphore behind the wrapper:
//
//	u, ok := sem.(interface{ Unwrap() redsem.Semaphore })
func Wrap(sem redsem.Semaphore, opts ...Option) redsem.Semaphore {
	c := newConfig(opts)
	in := newInstruments(&c)
	kv := []attribute.KeyValue{AttrSemaphoreName.String(sem.Name())}
	if v := variant(sem); v != "" {
		kv = append(kv, AttrSemaphoreVariant.String(v))
	}
	kv = append(kv, c.attrs...)
	s := &semaphore{sem: sem, in: in, span: kv, m: newSets(kv)}
	if c.statusMetrics {
		s.reg = in.observe(sem, kv)
	}
	return s
}

type semaphore struct {
	sem  redsem.Semaphore
	in   *instruments
	span []attribute.KeyValue // on both spans (read only)
	m    *sets                // of the metrics
	reg  metric.Registration  // the status gauges' callback; nil: none
	once sync.Once            // unregisters reg
}

var _ redsem.Semaphore = (*semaphore)(nil)

// Unwrap returns the semaphore that Wrap instrumented.
func (s *semaphore) Unwrap() redsem.Semaphore { return s.sem }

// Acquire is the wrapped semaphore's Acquire, traced and measured.
func (s *semaphore) Acquire(ctx context.Context) (redsem.Lease, error) {
	return s.acquire(ctx, 1, s.sem.Acquire)
}

// AcquireN is the wrapped semaphore's AcquireN, traced and measured.
func (s *semaphore) AcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return s.acquire(ctx, n, func(ctx context.Context) (redsem.Lease, error) { return s.sem.AcquireN(ctx, n) })
}

// TryAcquire is the wrapped semaphore's TryAcquire, traced and measured.
func (s *semaphore) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	return s.acquire(ctx, 1, s.sem.TryAcquire)
}

// TryAcquireN is the wrapped semaphore's TryAcquireN, traced and measured.
func (s *semaphore) TryAcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return s.acquire(ctx, n, func(ctx context.Context) (redsem.Lease, error) { return s.sem.TryAcquireN(ctx, n) })
}

// Resume is the wrapped semaphore's Resume. A lease it returns is held by
// this process from then on, as a granted one is: a "redsem.hold" span
// (unless WithoutHoldSpans) and the slots used, until its release or loss.
// A lease held already through this wrapper (or a member of the same
// family) comes back as the same wrapped lease.
func (s *semaphore) Resume(ctx context.Context, id string) (redsem.Lease, error) {
	l, err := s.sem.Resume(ctx, id)
	if err != nil {
		return nil, err
	}
	s.in.resumeMu.Lock()
	defer s.in.resumeMu.Unlock()
	if w, ok := s.in.held.Load(heldKey(l)); ok {
		return w.(*lease), nil
	}
	slots := l.Slots()
	grant := []attribute.KeyValue{AttrLeaseToken.Int64(l.Token()), AttrLeaseSlots.IntSlice(slots)}
	return s.hold(ctx, l, AttrAcquireWeight.Int(len(slots)), len(slots), grant), nil
}

// Status passes through.
func (s *semaphore) Status(ctx context.Context) (redsem.Status, error) { return s.sem.Status(ctx) }

// SetLimit passes through.
func (s *semaphore) SetLimit(ctx context.Context, limit int) error { return s.sem.SetLimit(ctx, limit) }

// SetRate passes through.
func (s *semaphore) SetRate(ctx context.Context, rate redsem.Rate) error {
	return s.sem.SetRate(ctx, rate)
}

// Name passes through.
func (s *semaphore) Name() string { return s.sem.Name() }

// Close passes through, and stops the status gauges' reads
// (WithStatusMetrics) whatever it returns.
func (s *semaphore) Close() error {
	err := s.sem.Close()
	s.once.Do(func() {
		if s.reg != nil {
			if uerr := s.reg.Unregister(); uerr != nil {
				otel.Handle(uerr)
			}
		}
	})
	return err
}

// call runs an acquire call; if it panics, the call is no longer pending
// and its span ends (status Error) before the panic goes on.
func (s *semaphore) call(ctx, actx context.Context, span trace.Span, call func(context.Context) (redsem.Lease, error)) (redsem.Lease, error) {
	defer func() {
		if r := recover(); r != nil {
			s.in.pending.Add(ctx, -1, s.m.base)
			span.SetAttributes(AttrErrorType.String(ErrorTypeOther))
			span.SetStatus(codes.Error, fmt.Sprint("panic: ", r))
			span.End()
			panic(r)
		}
	}()
	return call(actx)
}

// acquire runs one acquire call inside its span and, if it granted a
// lease, starts the lease's hold.
func (s *semaphore) acquire(ctx context.Context, n int, call func(context.Context) (redsem.Lease, error)) (redsem.Lease, error) {
	weight := AttrAcquireWeight.Int(n)
	actx, span := s.in.tracer.Start(ctx, "redsem.acquire", trace.WithAttributes(s.span...), trace.WithAttributes(weight))
	s.in.pending.Add(ctx, 1, s.m.base)
	start := time.Now()
	l, err := s.call(ctx, actx, span, call)
	took := time.Since(start)
	s.in.pending.Add(ctx, -1, s.m.base)
	et := ErrorType(err)
	var slots []int
	var grant []attribute.KeyValue // token and slots, on both spans
	if err == nil {
		slots = l.Slots()
		grant = []attribute.KeyValue{AttrLeaseToken.Int64(l.Token()), AttrLeaseSlots.IntSlice(slots)}
		span.SetAttributes(grant...)
	} else {
		span.SetAttributes(AttrErrorType.String(et))
		if faulty(et) {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
	s.in.acquireDur.Record(ctx, took.Seconds(), s.m.byErr[et])
	if err != nil {
		return nil, err
	}
	return s.hold(ctx, l, weight, len(slots), grant), nil
}

// hold starts the hold span (unless WithoutHoldSpans) and the slots used
// of lease l, granted now (slots: how many it holds; grant: its token and
// slots), and returns l wrapped so that its end ends them.
func (s *semaphore) hold(ctx context.Context, l redsem.Lease, weight attribute.KeyValue, slots int, grant []attribute.KeyValue) *lease {
	span := trace.SpanFromContext(context.Background()) // no-op
	if s.in.holdSpans {
		_, span = s.in.tracer.Start(ctx, "redsem.hold", trace.WithAttributes(s.span...),
			trace.WithAttributes(weight), trace.WithAttributes(grant...))
	}
	w := &lease{Lease: l, s: s, span: span, slots: int64(slots), start: time.Now(),
		// The metrics outlive the caller's context: record them on one that
		// keeps its values (baggage, span) but not its end.
		mctx: context.WithoutCancel(ctx)}
	s.in.usage.Add(w.mctx, w.slots, s.m.base)
	s.in.held.Store(heldKey(l), w)
	// The lease may be lost without a Release (not renewed in time, its
	// keys gone): this goroutine sees it, and ends with the lease however
	// it ends, so none outlives its lease.
	go func() {
		<-l.Done()
		w.end(holdErrorType(l.Err()))
	}()
	return w
}

// heldKey is the key of lease l in instruments.held: l itself when it is
// a pointer (this module's leases are), which identifies the lease; else
// a key of its own, which finds nothing (a Lease of another kind may not
// be comparable).
func heldKey(l redsem.Lease) any {
	if reflect.TypeOf(l).Kind() == reflect.Pointer {
		return l
	}
	return new(int)
}

// lease is a granted lease with its hold: every method is the semaphore's
// lease's, and Release also ends the hold.
type lease struct {
	redsem.Lease
	s     *semaphore
	span  trace.Span
	slots int64
	start time.Time
	mctx  context.Context
	once  sync.Once
}

var _ redsem.Lease = (*lease)(nil)

// Release is the lease's Release; the hold span and metrics end before it
// returns: released, or lost (error.type lease_lost) when Release returns
// redsem.ErrLeaseLost. Another error leaves the lease held (Release may be
// called again) and the span open, unless the lease ended meanwhile.
func (l *lease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	switch {
	case err == nil:
		l.end("") // a later Release (nil too) finds it ended
	case errors.Is(err, redsem.ErrLeaseLost):
		l.end(ErrorTypeLeaseLost)
	default:
		select {
		case <-l.Lease.Done():
			l.end(holdErrorType(l.Lease.Err()))
		default:
		}
	}
	return err
}

// Unwrap returns the lease that the wrapped semaphore granted.
func (l *lease) Unwrap() redsem.Lease { return l.Lease }

// end ends the hold, once: its span, the slots used, its duration and, if
// lost (et lease_lost), the loss.
func (l *lease) end(et string) {
	l.once.Do(func() {
		s := l.s
		s.in.held.CompareAndDelete(heldKey(l.Lease), l)
		s.in.usage.Add(l.mctx, -l.slots, s.m.base)
		s.in.holdDur.Record(l.mctx, time.Since(l.start).Seconds(), s.m.byErr[et])
		if et != "" {
			s.in.lost.Add(l.mctx, 1, s.m.base)
			l.span.SetAttributes(AttrErrorType.String(et))
			l.span.SetStatus(codes.Error, redsem.ErrLeaseLost.Error())
		}
		l.span.End()
	})
}

// holdErrorType is the error.type of a hold whose lease ended with Err()
// err: none, or lease_lost.
func holdErrorType(err error) string {
	if err != nil {
		return ErrorTypeLeaseLost
	}
	return ""
}
