package fair_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/redistest"
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
