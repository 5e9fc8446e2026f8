package fair_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
)

// One semaphore per tenant, made on demand: each tenant may run two jobs at
// once, and a busy tenant never blocks another. All tenants of the process
// share one subscription and one heartbeat.
func ExampleNewFamily() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	tenants, err := fair.NewFamily(client, "example:tenant-jobs", 2, fair.FamilyOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer tenants.Close()

	try := func(tenant string) redsem.Lease {
		sem, err := tenants.Get(tenant)
		if err != nil {
			log.Fatal(err)
		}
		l, err := sem.TryAcquire(ctx)
		switch {
		case errors.Is(err, redsem.ErrNoSlot):
			fmt.Println(tenant, "busy")
			return nil
		case err != nil:
			log.Fatal(err)
		}
		fmt.Println(tenant, "runs a job")
		return l
	}
	var leases []redsem.Lease
	for _, tenant := range []string{"acme", "acme", "acme", "globex"} {
		if l := try(tenant); l != nil {
			leases = append(leases, l)
		}
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	// Output:
	// acme runs a job
	// acme runs a job
	// acme busy
	// globex runs a job
}

// Each tenant may run two jobs at once, and all tenants together three: a
// job needs room in its tenant's limit and in the total, in one step, so
// no tenant holds a slot while it waits for the other. When the total is
// what is full, waiters of every tenant are served in arrival order.
func ExampleNewFamily_total() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	tenants, err := fair.NewFamily(client, "example:tenant-total", 2, fair.FamilyOptions{Total: 3})
	if err != nil {
		log.Fatal(err)
	}
	defer tenants.Close()

	var leases []redsem.Lease
	for _, tenant := range []string{"acme", "acme", "acme", "globex", "initech"} {
		sem, err := tenants.Get(tenant)
		if err != nil {
			log.Fatal(err)
		}
		l, err := sem.TryAcquire(ctx)
		switch {
		case errors.Is(err, redsem.ErrNoSlot):
			fmt.Println(tenant, "must wait")
			continue
		case err != nil:
			log.Fatal(err)
		}
		fmt.Println(tenant, "runs a job")
		leases = append(leases, l)
	}
	st, err := tenants.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("total %d, held %d\n", st.Total, st.Held)
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	// Output:
	// acme runs a job
	// acme runs a job
	// acme must wait
	// globex runs a job
	// initech must wait
	// total 3, held 3
}
