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

// SetTotal changes the family's total for every client, live: lowered, it
// grants nothing until the family is under it; 0 removes the bound.
func ExampleFamily_SetTotal() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	tenants, err := unfair.NewFamily(client, "example:tenant-settotal", 2, unfair.FamilyOptions{Total: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer tenants.Close()

	acme, err := tenants.Get("acme")
	if err != nil {
		log.Fatal(err)
	}
	globex, err := tenants.Get("globex")
	if err != nil {
		log.Fatal(err)
	}
	l, err := acme.TryAcquireN(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)

	if err := tenants.SetTotal(ctx, 2); err != nil {
		log.Fatal(err)
	}
	_, err = globex.TryAcquire(ctx)
	fmt.Println("total 2:", err)

	if err := tenants.SetTotal(ctx, 0); err != nil {
		log.Fatal(err)
	}
	g, err := globex.TryAcquire(ctx)
	fmt.Println("no total:", err)
	st, err := tenants.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("total %d, held %d\n", st.Total, st.Held)
	_ = g.Release(ctx)
	// Output:
	// total 2: redsem: no slot available
	// no total: <nil>
	// total 0, held 3
}
