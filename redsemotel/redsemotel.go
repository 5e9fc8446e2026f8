package redsemotel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redsem/redsem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of the tracer and the meter.
const Scope = "github.com/redsem/redsem/redsemotel"

// Outcomes of the acquire span (its redsem.outcome, and the same attribute
// of the redsem.acquire.duration metric).
const (
	// OutcomeGranted: a lease was granted.
	OutcomeGranted = "granted"
	// OutcomeNoSlot: TryAcquire or TryAcquireN refused (redsem.ErrNoSlot).
	OutcomeNoSlot = "no_slot"
	// OutcomeTimeout: the context's deadline passed (context.DeadlineExceeded).
	OutcomeTimeout = "timeout"
	// OutcomeCanceled: the context was cancelled (context.Canceled).
	OutcomeCanceled = "canceled"
	// OutcomeClosed: the semaphore was closed (redsem.ErrClosed).
	OutcomeClosed = "closed"
	// OutcomeError: any other error; the span's status is Error.
	OutcomeError = "error"
)

// Outcomes of the hold span (its redsem.outcome, and the same attribute of
// the redsem.hold.duration metric).
const (
	// OutcomeReleased: the lease ended by its Release.
	OutcomeReleased = "released"
	// OutcomeLost: the lease was lost (before or during its Release); the
	// span's status is Error and redsem.leases.lost counts it.
	OutcomeLost = "lost"
)

// Attribute keys of the spans and the metrics.
const (
	// AttrSemaphore is the semaphore's name, on every span and metric.
	AttrSemaphore = attribute.Key("redsem.semaphore")
	// AttrWeight is the slots asked for (1, or AcquireN's n), on both spans.
	AttrWeight = attribute.Key("redsem.weight")
	// AttrOutcome is how the call or the hold ended (the Outcome constants).
	AttrOutcome = attribute.Key("redsem.outcome")
	// AttrToken is the granted lease's fencing token (int64).
	AttrToken = attribute.Key("redsem.token")
	// AttrSlots is the granted lease's slots (an int slice).
	AttrSlots = attribute.Key("redsem.slots")
)

// Option configures Wrap.
type Option func(*config)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
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

// Wrap returns sem instrumented with OpenTelemetry (API only). Every
// Acquire, AcquireN, TryAcquire and TryAcquireN call makes a span
// "redsem.acquire", a child of the span in its context, ended when the call
// returns; every lease it grants makes a span "redsem.hold", from the grant
// to its release or loss. Status, SetLimit, SetRate (for a semaphore that
// has it, found by interface assertion), Name and Close pass through.
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
	meter := c.mp.Meter(Scope)
	s := &semaphore{sem: sem, tracer: c.tp.Tracer(Scope), name: AttrSemaphore.String(sem.Name())}
	s.only = metric.WithAttributeSet(attribute.NewSet(s.name))
	// The attribute sets of the histograms, made once: a set per record
	// would cost a sort and an allocation on every call.
	s.byOutcome = make(map[string]metric.MeasurementOption)
	for _, o := range []string{OutcomeGranted, OutcomeNoSlot, OutcomeTimeout, OutcomeCanceled,
		OutcomeClosed, OutcomeError, OutcomeReleased, OutcomeLost} {
		s.byOutcome[o] = metric.WithAttributeSet(attribute.NewSet(s.name, AttrOutcome.String(o)))
	}
	// The API's instruments never fail to be made; an SDK that refuses one
	// returns a no-op instrument and reports the error to otel's handler.
	s.acquireDur, _ = meter.Float64Histogram("redsem.acquire.duration",
		metric.WithUnit("s"), metric.WithDescription("Duration of acquire calls, by outcome."))
	s.holdDur, _ = meter.Float64Histogram("redsem.hold.duration",
		metric.WithUnit("s"), metric.WithDescription("How long leases were held, from grant to release or loss."))
	s.held, _ = meter.Int64UpDownCounter("redsem.slots.held",
		metric.WithUnit("{slot}"), metric.WithDescription("Slots held by this process's leases."))
	s.waiting, _ = meter.Int64UpDownCounter("redsem.acquire.waiting",
		metric.WithUnit("{call}"), metric.WithDescription("Acquire calls in flight in this process."))
	s.lost, _ = meter.Int64Counter("redsem.leases.lost",
		metric.WithUnit("{lease}"), metric.WithDescription("Leases lost (expired, removed or given up) before their release."))
	return s
}

type semaphore struct {
	sem    redsem.Semaphore
	tracer trace.Tracer
	name   attribute.KeyValue
	only   metric.MeasurementOption // the attribute set {redsem.semaphore}
	// byOutcome: {redsem.semaphore, redsem.outcome} for each outcome (read only)
	byOutcome map[string]metric.MeasurementOption

	acquireDur, holdDur metric.Float64Histogram
	held, waiting       metric.Int64UpDownCounter
	lost                metric.Int64Counter
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

// Status passes through.
func (s *semaphore) Status(ctx context.Context) (redsem.Status, error) { return s.sem.Status(ctx) }

// SetLimit passes through.
func (s *semaphore) SetLimit(ctx context.Context, limit int) error { return s.sem.SetLimit(ctx, limit) }

// SetRate passes through to the wrapped semaphore's SetRate (fair's and
// unfair's have one), so that code which finds it by interface assertion
// works on the wrapper too; a semaphore without one gets an error.
func (s *semaphore) SetRate(ctx context.Context, rate redsem.Rate) error {
	r, ok := s.sem.(interface {
		SetRate(context.Context, redsem.Rate) error
	})
	if !ok {
		return fmt.Errorf("redsemotel: %T has no SetRate", s.sem)
	}
	return r.SetRate(ctx, rate)
}

// Name passes through.
func (s *semaphore) Name() string { return s.sem.Name() }

// Close passes through.
func (s *semaphore) Close() error { return s.sem.Close() }

// call runs an acquire call; if it panics, the call is no longer waiting
// and its span ends (status Error) before the panic goes on.
func (s *semaphore) call(ctx, actx context.Context, span trace.Span, call func(context.Context) (redsem.Lease, error)) (redsem.Lease, error) {
	defer func() {
		if r := recover(); r != nil {
			s.waiting.Add(ctx, -1, s.only)
			span.SetStatus(codes.Error, fmt.Sprint("panic: ", r))
			span.End()
			panic(r)
		}
	}()
	return call(actx)
}

// acquire runs one acquire call inside its span and, if it granted a
// lease, starts the lease's hold span.
func (s *semaphore) acquire(ctx context.Context, n int, call func(context.Context) (redsem.Lease, error)) (redsem.Lease, error) {
	weight := AttrWeight.Int(n)
	actx, span := s.tracer.Start(ctx, "redsem.acquire", trace.WithAttributes(s.name, weight))
	s.waiting.Add(ctx, 1, s.only)
	start := time.Now()
	l, err := s.call(ctx, actx, span, call)
	took := time.Since(start)
	s.waiting.Add(ctx, -1, s.only)
	outcome := Outcome(err)
	span.SetAttributes(AttrOutcome.String(outcome))
	var slots []int
	var grant []attribute.KeyValue // token and slots, on both spans
	if err == nil {
		slots = l.Slots()
		grant = []attribute.KeyValue{AttrToken.Int64(l.Token()), AttrSlots.IntSlice(slots)}
		span.SetAttributes(grant...)
	} else if outcome == OutcomeError {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	s.acquireDur.Record(ctx, took.Seconds(), s.byOutcome[outcome])
	if err != nil {
		return nil, err
	}
	return s.hold(ctx, l, weight, len(slots), grant), nil
}

// hold starts the hold span and the slots held of lease l, granted now
// (slots: how many it holds; grant: its token and slots), and returns l
// wrapped so that its end ends them.
func (s *semaphore) hold(ctx context.Context, l redsem.Lease, weight attribute.KeyValue, slots int, grant []attribute.KeyValue) *lease {
	_, span := s.tracer.Start(ctx, "redsem.hold", trace.WithAttributes(s.name, weight),
		trace.WithAttributes(grant...))
	w := &lease{Lease: l, s: s, span: span, slots: int64(slots), start: time.Now(),
		// The metrics outlive the caller's context: record them on one that
		// keeps its values (baggage, span) but not its end.
		mctx: context.WithoutCancel(ctx)}
	s.held.Add(w.mctx, w.slots, s.only)
	// The lease may be lost without a Release (not renewed in time, its
	// keys gone): this goroutine sees it, and ends with the lease however
	// it ends, so none outlives its lease.
	go func() {
		<-l.Done()
		w.end(holdOutcome(l.Err()))
	}()
	return w
}

// lease is a granted lease with its hold span: every method is the
// semaphore's lease's, and Release also ends the span.
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
// returns: outcome released, or lost when Release returns
// redsem.ErrLeaseLost. Another error leaves the lease held (Release may be
// called again) and the span open, unless the lease ended meanwhile.
func (l *lease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	switch {
	case err == nil:
		l.end(OutcomeReleased) // a later Release (nil too) finds it ended
	case errors.Is(err, redsem.ErrLeaseLost):
		l.end(OutcomeLost)
	default:
		select {
		case <-l.Lease.Done():
			l.end(holdOutcome(l.Lease.Err()))
		default:
		}
	}
	return err
}

// Unwrap returns the lease that the wrapped semaphore granted.
func (l *lease) Unwrap() redsem.Lease { return l.Lease }

// end ends the hold, once: its span, the slots held, its duration and, if
// lost, the loss.
func (l *lease) end(outcome string) {
	l.once.Do(func() {
		s := l.s
		s.held.Add(l.mctx, -l.slots, s.only)
		s.holdDur.Record(l.mctx, time.Since(l.start).Seconds(), s.byOutcome[outcome])
		l.span.SetAttributes(AttrOutcome.String(outcome))
		if outcome == OutcomeLost {
			s.lost.Add(l.mctx, 1, s.only)
			l.span.SetStatus(codes.Error, redsem.ErrLeaseLost.Error())
		}
		l.span.End()
	})
}

// holdOutcome is the outcome of a lease that ended with Err() err.
func holdOutcome(err error) string {
	if err != nil {
		return OutcomeLost
	}
	return OutcomeReleased
}

// Outcome classifies the error of an acquire call as the span and the
// metrics name it: granted (nil), closed, no_slot, timeout, canceled or
// error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeGranted
	case errors.Is(err, redsem.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, redsem.ErrNoSlot):
		return OutcomeNoSlot
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	}
	return OutcomeError
}
