package redsemotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel/attribute"
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

	// error.type is set on failures only.
	errType := func(set *attribute.Set) string {
		if v, ok := set.Value(redsemotel.AttrErrorType); ok {
			return v.AsString()
		}
		return "ok"
	}
	for _, s := range spans.Ended()[:3] { // the 4th: request
		set := attribute.NewSet(s.Attributes()...)
		fmt.Println(s.Name(), errType(&set), "in", s.Parent().SpanID() == request.SpanContext().SpanID())
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
			for _, p := range h.DataPoints {
				fmt.Println(m.Name, errType(&p.Attributes), p.Count)
			}
		}
	}
	// Unordered output:
	// second: redsem: no slot available
	// redsem.acquire ok in true
	// redsem.acquire no_slot in true
	// redsem.hold ok in true
	// redsem.client.acquire.duration ok 1
	// redsem.client.acquire.duration no_slot 1
	// redsem.client.hold.duration ok 1
}

// A family's members, wrapped by WrapFamily, are measured under the
// family's name: one series for every tenant, not one per tenant. Their
// spans still carry each member's key.
func ExampleWrapFamily() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	family, err := fair.NewFamily(client, "tenants-"+uuid.NewString()[:8], 2, fair.FamilyOptions{})
	if err != nil {
		log.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	tenants := redsemotel.WrapFamily(family, redsemotel.WithTracerProvider(tp), redsemotel.WithMeterProvider(mp),
		redsemotel.WithoutHoldSpans(), redsemotel.WithAttributes(attribute.String("service.role", "api")))
	defer tenants.Close()

	ctx := context.Background()
	for _, tenant := range []string{"acme", "globex", "initech"} {
		sem, err := tenants.Get(tenant)
		if err != nil {
			log.Fatal(err)
		}
		lease, err := sem.Acquire(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}

	for _, s := range spans.Ended() { // acquire spans only: WithoutHoldSpans
		set := attribute.NewSet(s.Attributes()...)
		key, _ := set.Value(redsemotel.AttrSemaphoreKey)
		fmt.Println(s.Name(), key.AsString())
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
			for _, p := range h.DataPoints {
				_, hasKey := p.Attributes.Value(redsemotel.AttrSemaphoreKey)
				variant, _ := p.Attributes.Value(redsemotel.AttrSemaphoreVariant)
				role, _ := p.Attributes.Value("service.role")
				fmt.Println(m.Name, p.Count, "key:", hasKey, variant.AsString(), role.AsString())
			}
		}
	}
	// Output:
	// redsem.acquire acme
	// redsem.acquire globex
	// redsem.acquire initech
	// redsem.client.acquire.duration 3 key: false fair api
	// redsem.client.hold.duration 3 key: false fair api
}
