package unfair_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/unfair"
)

// An API that allows 2 concurrent calls per API key: one unfair semaphore
// per key, made on demand, spread over 4 shards (hash slots: on a Redis
// Cluster, over several masters). Every process of the family must use the
// same Shards.
func ExampleNewFamily() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	keys, err := unfair.NewFamily(client, "example:calls-per-api-key", 2, unfair.FamilyOptions{Shards: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer keys.Close()

	var leases []redsem.Lease
	for _, apiKey := range []string{"key-1", "key-1", "key-1", "key-2"} {
		sem, err := keys.Get(apiKey)
		if err != nil {
			log.Fatal(err)
		}
		l, err := sem.TryAcquire(ctx)
		switch {
		case errors.Is(err, redsem.ErrNoSlot):
			fmt.Println(apiKey, "must wait")
			continue
		case err != nil:
			log.Fatal(err)
		}
		fmt.Println(apiKey, "calls")
		leases = append(leases, l)
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	// Output:
	// key-1 calls
	// key-1 calls
	// key-1 must wait
	// key-2 calls
}
