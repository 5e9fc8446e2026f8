package redsemotel_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/redsemotel"
	"github.com/redsem/redsem/unfair"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Wrap a semaphore, and every acquire and every lease shows in the traces
// (and the metrics) of the providers given, or of the global ones. Here a
// span recorder stands in for an exporter.
func ExampleWrap() {
	client := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()}) // your Redis
	defer client.Close()
	base, err := unfair.New(client, "gpu-"+uuid.NewString(), 1, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	sem := redsemotel.Wrap(base, redsemotel.WithTracerProvider(tp))
	defer sem.Close()
	ctx := context.Background()
	lease, err := sem.TryAcquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx); err != nil {
		fmt.Println("second:", err)
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// The hold span ends just after Done closes.
	for deadline := time.Now().Add(5 * time.Second); len(spans.Ended()) < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == redsemotel.AttrOutcome {
				fmt.Println(s.Name(), a.Value.AsString())
			}
		}
	}
	// Output:
	// second: redsem: no slot available
	// redsem.acquire granted
	// redsem.acquire no_slot
	// redsem.hold released
}
