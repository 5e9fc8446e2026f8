package fair_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func redisAddr() string { return redistest.SharedAddr() }

// Waiters are admitted in arrival order.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// A GPU server that takes one job at a time, served first come, first served.
	sem, err := fair.New(client, "example:gpu", 1, fair.Options{QueueTTL: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	holder, _ := sem.Acquire(ctx)
	admitted := make(chan string, 3)
	for i, job := range []string{"first", "second", "third"} {
		go func() {
			l, err := sem.Acquire(ctx)
			if err != nil {
				log.Fatal(err)
			}
			admitted <- job
			_ = l.Release(ctx)
		}()
		waitForWaiters(ctx, sem, i+1) // queue them in this order
	}
	st, _ := sem.Status(ctx)
	fmt.Println("queued:", len(st.Waiters))
	_ = holder.Release(ctx)
	for range 3 {
		fmt.Println(<-admitted)
	}
	// Output:
	// queued: 3
	// first
	// second
	// third
}

// waitForWaiters polls Status until n waiters are queued.
func waitForWaiters(ctx context.Context, sem *fair.Semaphore, n int) {
	for {
		st, err := sem.Status(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if len(st.Waiters) >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// At most 5 calls in flight and at most 60 started a minute, in one
// admission: a call waits for a free slot and room in the rate's window,
// in arrival order.
func Example_rate() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// An LLM API that allows 5 calls in flight and 60 a minute.
	name := fmt.Sprintf("example:llm-%d", time.Now().UnixNano()) // a window of its own
	sem, err := fair.New(client, name, 5, fair.Options{
		Rate: redsem.Rate{Limit: 60, Per: time.Minute},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	started := 0
	for {
		l, err := sem.TryAcquire(ctx) // Acquire would wait for the window instead
		var rl *redsem.RateLimitedError
		if errors.As(err, &rl) {
			fmt.Println("started:", started)
			fmt.Println("rate limited:", errors.Is(err, redsem.ErrRateLimited), errors.Is(err, redsem.ErrNoSlot))
			fmt.Println("retry within a minute:", rl.RetryAfter > 0 && rl.RetryAfter <= time.Minute)
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		started++ // ... call the API ...
		_ = l.Release(ctx)
	}
	st, _ := sem.Status(ctx)
	fmt.Printf("rate %v, %d granted in the window\n", st.Rate, st.RateGranted)
	// Output:
	// started: 60
	// rate limited: true true
	// retry within a minute: true
	// rate 60/1m, 60 granted in the window
}
