package redsemotel_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkWrap measures what Wrap adds to a TryAcquire+Release cycle:
// over an in-process stand-in semaphore (the wrapper's own cost, without
// Redis's noise), and over a real unfair semaphore (the shared test Redis,
// on this machine), bare and wrapped, with the no-op providers and with
// the SDK's (every span sampled, no exporter; metrics aggregated for a
// manual reader).
//
//	go test ./redsemotel -run '^$' -bench Wrap -benchtime 20000x
func BenchmarkWrap(b *testing.B) {
	sdk := func() []redsemotel.Option {
		tp := sdktrace.NewTracerProvider()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
		return []redsemotel.Option{redsemotel.WithTracerProvider(tp), redsemotel.WithMeterProvider(mp)}
	}
	noop := []redsemotel.Option{redsemotel.WithTracerProvider(tracenoop.NewTracerProvider()),
		redsemotel.WithMeterProvider(metricnoop.NewMeterProvider())}
	cycle := func(b *testing.B, sem redsem.Semaphore) {
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("stand-in/bare", func(b *testing.B) { cycle(b, &standIn{}) })
	b.Run("stand-in/noop", func(b *testing.B) { cycle(b, redsemotel.Wrap(&standIn{}, noop...)) })
	b.Run("stand-in/sdk", func(b *testing.B) { cycle(b, redsemotel.Wrap(&standIn{}, sdk()...)) })
	real := func(b *testing.B) redsem.Semaphore {
		s, err := unfair.New(redistest.Client(b), redistest.Name(b), 1<<20, unfair.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return s
	}
	b.Run("redis/bare", func(b *testing.B) { cycle(b, real(b)) })
	b.Run("redis/noop", func(b *testing.B) { cycle(b, redsemotel.Wrap(real(b), noop...)) })
	b.Run("redis/sdk", func(b *testing.B) { cycle(b, redsemotel.Wrap(real(b), sdk()...)) })
}

// standIn is an in-process semaphore without a limit: only for measuring
// the wrapper's own cost.
type standIn struct{}

func (*standIn) Acquire(ctx context.Context) (redsem.Lease, error)    { return newStandInLease(), nil }
func (*standIn) TryAcquire(ctx context.Context) (redsem.Lease, error) { return newStandInLease(), nil }
func (*standIn) AcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return newStandInLease(), nil
}
func (*standIn) TryAcquireN(ctx context.Context, n int) (redsem.Lease, error) {
	return newStandInLease(), nil
}
func (*standIn) Status(context.Context) (redsem.Status, error) { return redsem.Status{}, nil }
func (*standIn) SetLimit(context.Context, int) error           { return nil }
func (*standIn) SetRate(context.Context, redsem.Rate) error    { return nil }
func (*standIn) Name() string                                  { return "stand-in" }
func (*standIn) Close() error                                  { return nil }
func (*standIn) Resume(context.Context, string) (redsem.Lease, error) {
	return newStandInLease(), nil
}

type standInLease struct {
	once   sync.Once
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
}

func newStandInLease() *standInLease {
	ctx, cancel := context.WithCancel(context.Background())
	return &standInLease{done: make(chan struct{}), ctx: ctx, cancel: cancel}
}

func (l *standInLease) ID() string                  { return "id" }
func (l *standInLease) Slot() int                   { return 0 }
func (l *standInLease) Slots() []int                { return []int{0} }
func (l *standInLease) Token() int64                { return 1 }
func (l *standInLease) Deadline() time.Time         { return time.Time{} }
func (l *standInLease) Renew(context.Context) error { return nil }
func (l *standInLease) Done() <-chan struct{}       { return l.done }
func (l *standInLease) Err() error                  { return nil }
func (l *standInLease) Context() context.Context    { return l.ctx }
func (l *standInLease) Release(ctx context.Context) error {
	l.once.Do(func() { close(l.done); l.cancel() })
	return nil
}
