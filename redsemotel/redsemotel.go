// Package redsemotel instruments a redsem.Semaphore with OpenTelemetry,
// through the OpenTelemetry API only (no SDK among its dependencies): the
// application chooses and configures the SDK and its exporters.
//
//	sem = redsemotel.Wrap(sem) // global providers; or WithTracerProvider, WithMeterProvider
//
// Every Acquire, AcquireN, TryAcquire and TryAcquireN makes a span
// "redsem.acquire", a child of the span in its context, ended when the
// call returns; every lease it grants makes a span "redsem.hold", a child of
// the same span, from the grant to the lease's release or loss. Both carry
// redsem.semaphore (the name) and redsem.weight (the slots asked for). The
// acquire span also carries redsem.outcome, one of granted, no_slot
// (TryAcquire refused), timeout (the context's deadline passed), canceled
// (the context was cancelled), closed (the semaphore was closed) or error,
// and, when granted, redsem.token and redsem.slots. The hold span carries
// redsem.outcome released or lost. A span's status is Error only for the
// outcomes error and lost.
//
// Metrics, under the instrumentation scope
// "github.com/redsem/redsem/redsemotel", each with redsem.semaphore:
//
//	redsem.acquire.duration  Float64Histogram     s       and redsem.outcome (as on the span)
//	redsem.hold.duration     Float64Histogram     s       and redsem.outcome (released, lost)
//	redsem.slots.held        Int64UpDownCounter   {slot}  slots held by this process's leases
//	redsem.acquire.waiting   Int64UpDownCounter   {call}  acquire calls in flight in this process
//	redsem.leases.lost       Int64Counter         {lease}
//
// Leases are the semaphore's own, unchanged (Slots, Token, Context, Done
// and the rest); the hold span ends from context.AfterFunc on the lease's
// Context, which ends when the lease is released or lost.
package redsemotel

import (
	"context"
	"errors"
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

// Outcomes of the acquire span (and the redsem.acquire.duration metric).
const (
	OutcomeGranted  = "granted"
	OutcomeNoSlot   = "no_slot"
	OutcomeTimeout  = "timeout"
	OutcomeCanceled = "canceled"
	OutcomeClosed   = "closed"
	OutcomeError    = "error"
)

// Outcomes of the hold span (and the redsem.hold.duration metric).
const (
	OutcomeReleased = "released"
	OutcomeLost     = "lost"
)

// Attribute keys.
const (
	AttrSemaphore = attribute.Key("redsem.semaphore")
	AttrWeight    = attribute.Key("redsem.weight")
	AttrOutcome   = attribute.Key("redsem.outcome")
	AttrToken     = attribute.Key("redsem.token")
	AttrSlots     = attribute.Key("redsem.slots")
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
// to its release or loss. Status, SetLimit, Name and Close pass through.
//
// The returned semaphore also has a method Unwrap() redsem.Semaphore that
// returns sem, through which other packages of this module (redsemsql)
// reach the semaphore behind the wrapper.
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

// Name passes through.
func (s *semaphore) Name() string { return s.sem.Name() }

// Close passes through.
func (s *semaphore) Close() error { return s.sem.Close() }

// acquire runs one acquire call inside its span and, if it granted a
// lease, starts the lease's hold span.
func (s *semaphore) acquire(ctx context.Context, n int, call func(context.Context) (redsem.Lease, error)) (redsem.Lease, error) {
	weight := AttrWeight.Int(n)
	actx, span := s.tracer.Start(ctx, "redsem.acquire", trace.WithAttributes(s.name, weight))
	s.waiting.Add(ctx, 1, s.only)
	start := time.Now()
	l, err := call(actx)
	took := time.Since(start)
	s.waiting.Add(ctx, -1, s.only)
	outcome := Outcome(err)
	span.SetAttributes(AttrOutcome.String(outcome))
	if err == nil {
		span.SetAttributes(AttrToken.Int64(l.Token()), AttrSlots.IntSlice(l.Slots()))
	} else if outcome == OutcomeError {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	s.acquireDur.Record(ctx, took.Seconds(), metric.WithAttributes(s.name, AttrOutcome.String(outcome)))
	if err != nil {
		return nil, err
	}
	s.hold(ctx, l, weight)
	return l, nil
}

// hold measures lease l from now to its end: a span, the slots held, and
// at the end the hold's duration and, if lost, the loss.
func (s *semaphore) hold(ctx context.Context, l redsem.Lease, weight attribute.KeyValue) {
	slots := int64(len(l.Slots()))
	_, span := s.tracer.Start(ctx, "redsem.hold", trace.WithAttributes(s.name, weight,
		AttrToken.Int64(l.Token()), AttrSlots.IntSlice(l.Slots())))
	s.held.Add(ctx, slots, s.only)
	start := time.Now()
	// The metrics outlive the caller's context: record them on one that
	// keeps its values (baggage, span) but not its end.
	mctx := context.WithoutCancel(ctx)
	// Context ends with the lease (released or lost): AfterFunc runs the
	// end without a goroutine waiting all along.
	context.AfterFunc(l.Context(), func() {
		outcome := OutcomeReleased
		if l.Err() != nil {
			outcome = OutcomeLost
		}
		s.held.Add(mctx, -slots, s.only)
		s.holdDur.Record(mctx, time.Since(start).Seconds(), metric.WithAttributes(s.name, AttrOutcome.String(outcome)))
		span.SetAttributes(AttrOutcome.String(outcome))
		if outcome == OutcomeLost {
			s.lost.Add(mctx, 1, s.only)
			span.SetStatus(codes.Error, l.Err().Error())
		}
		span.End()
	})
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
