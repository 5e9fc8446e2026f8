package redsemotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// redisAddr is the address of the test's throw-away Redis; in your code it
// is your Redis.
func redisAddr() string { return redistest.SharedAddr() }

// Wrap a semaphore, and every acquire and every lease shows in the traces
// and the metrics of the providers given (or of the global ones). Here a
// span recorder and a manual reader stand in for exporters.
func ExampleWrap() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	base, err := unfair.New(client, "gpu-"+uuid.NewString(), 1, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	sem := redsemotel.Wrap(base, redsemotel.WithTracerProvider(tp), redsemotel.WithMeterProvider(mp))
	defer sem.Close()

	ctx, request := tp.Tracer("app").Start(context.Background(), "request")
	lease, err := sem.TryAcquire(ctx) // span redsem.acquire, then redsem.hold
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx); err != nil {
		fmt.Println("second:", err)
	}
	if err := lease.Release(ctx); err != nil { // ends redsem.hold
		log.Fatal(err)
	}
	request.End()

	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == redsemotel.AttrOutcome {
				fmt.Println(s.Name(), a.Value.AsString(), "in", s.Parent().SpanID() == request.SpanContext().SpanID())
			}
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
			for _, p := range h.DataPoints {
				o, _ := p.Attributes.Value(redsemotel.AttrOutcome)
				fmt.Println(m.Name, o.AsString(), p.Count)
			}
		}
	}
	// Unordered output:
	// second: redsem: no slot available
	// redsem.acquire granted in true
	// redsem.acquire no_slot in true
	// redsem.hold released in true
	// redsem.acquire.duration granted 1
	// redsem.acquire.duration no_slot 1
	// redsem.hold.duration released 1
}
