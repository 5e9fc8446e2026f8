package unfair_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

func redisAddr() string { return redistest.SharedAddr() }

// Acquire, use the slot's fencing token, release.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// An API that allows 5 concurrent calls per key.
	sem, err := unfair.New(client, "example:api-key-42", 5, unfair.Options{LeaseTTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := sem.Acquire(waitCtx) // blocks until a slot frees or waitCtx ends
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	st, _ := sem.Status(ctx)
	fmt.Printf("slot %d of %d, %d holder(s)\n", lease.Slot(), st.Limit, len(st.Holders))
	fmt.Println("token is positive:", lease.Token() > 0)
	// Output:
	// slot 0 of 5, 1 holder(s)
	// token is positive: true
}

// TryAcquire never waits.
func ExampleSemaphore_TryAcquire() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	sem, _ := unfair.New(client, "example:single", 1, unfair.Options{})
	first, _ := sem.TryAcquire(ctx)
	_, err := sem.TryAcquire(ctx)
	fmt.Println(err)
	_ = first.Release(ctx)
	second, err := sem.TryAcquire(ctx)
	fmt.Println(err, second.Token() > first.Token())
	_ = second.Release(ctx)
	// Output:
	// redsem: no slot available
	// <nil> true
}

// Do runs a function under a slot; errors from the function come back.
func ExampleSemaphore_do() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	sem, _ := unfair.New(client, "example:do", 3, unfair.Options{})
	err := redsem.Do(ctx, sem, func(ctx context.Context, l redsem.Lease) error {
		return fmt.Errorf("call failed in slot %d", l.Slot())
	})
	fmt.Println(err)
	// Output: call failed in slot 0
}
