package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/unfair"
)

// The zombie: client A holds the only slot, pauses past its lease, and
// writes after B took the slot over. The store-side guard rejects A.
func Example_zombie() {
	ctx := context.Background()
	rdb := redisClient() // the semaphore's Redis; here also the store
	defer rdb.Close()

	guard, err := fencing.NewRedisGuard(rdb, fencing.RedisOptions{})
	if err != nil {
		panic(err)
	}
	key := guard.DataKey("orders", "latest")
	defer rdb.Del(ctx, guard.FenceKey("orders"), key)

	// A and B run in different processes; each has its own Semaphore.
	opts := unfair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true}
	semA, _ := unfair.New(rdb, "example-zombie", 1, opts)
	semB, _ := unfair.New(rdb, "example-zombie", 1, opts)
	defer semA.Close()
	defer semB.Close()

	a, _ := semA.Acquire(ctx)
	fmt.Println("A holds slot", a.Slot())
	fmt.Println("A writes:", guard.Set(ctx, fencing.Of("orders", a), key, "from A", 0))

	// A pauses (GC, swap, SIGSTOP) and does not renew. B's Acquire returns
	// once A's lease has expired.
	b, _ := semB.Acquire(ctx)
	defer b.Release(ctx)
	fmt.Println("B holds slot", b.Slot(), "with a higher token:", b.Token() > a.Token())
	fmt.Println("B writes:", guard.Set(ctx, fencing.Of("orders", b), key, "from B", 0))

	// A wakes up and, unaware, writes again.
	err = guard.Set(ctx, fencing.Of("orders", a), key, "from A, late", 0)
	fmt.Println("A writes again, stale:", errors.Is(err, fencing.ErrStale))

	v, _ := rdb.Get(ctx, key).Result()
	fmt.Println("stored:", v)
	// Output:
	// A holds slot 0
	// A writes: <nil>
	// B holds slot 0 with a higher token: true
	// B writes: <nil>
	// A writes again, stale: true
	// stored: from B
}

// A service fenced with Middleware; clients send their lease's fence with
// Transport. A request below the slot's highest token gets 409 Conflict.
func ExampleMiddleware() {
	ctx := context.Background()
	rdb := redisClient()
	defer rdb.Close()
	guard, _ := fencing.NewRedisGuard(rdb, fencing.RedisOptions{KeyPrefix: "example-http"})
	defer rdb.Del(ctx, guard.FenceKey("reports"))

	srv := httptest.NewServer(fencing.Middleware(guard, http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			f, _ := fencing.FromContext(r.Context())
			fmt.Fprintf(w, "stored for slot %d", f.Slot)
		})))
	defer srv.Close()
	client := &http.Client{Transport: &fencing.Transport{}}

	put := func(f fencing.Fence) {
		// With a lease: fencing.WithLease(ctx, "reports", lease).
		req, _ := http.NewRequestWithContext(fencing.WithFence(ctx, f), http.MethodPut, srv.URL, strings.NewReader("data"))
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("token %d: %d %s\n", f.Token, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	put(fencing.Fence{Resource: "reports", Slot: 0, Token: 7})
	put(fencing.Fence{Resource: "reports", Slot: 0, Token: 9})
	put(fencing.Fence{Resource: "reports", Slot: 1, Token: 8}) // another slot: not disturbed
	put(fencing.Fence{Resource: "reports", Slot: 0, Token: 7}) // slot 0's old holder
	// Output:
	// token 7: 200 stored for slot 0
	// token 9: 200 stored for slot 0
	// token 8: 200 stored for slot 1
	// token 7: 409 fencing: stale token 7 for resource "reports" slot 0: token 9 was already recorded
}

// A weighted lease (AcquireN) is fenced on every slot it holds. When it
// turns zombie, its slots are granted again one by one, possibly to other
// holders; the zombie is rejected as soon as any one of them has written,
// even if its first slot has no new writer yet.
func Example_weighted() {
	ctx := context.Background()
	rdb := redisClient()
	defer rdb.Close()
	guard, err := fencing.NewRedisGuard(rdb, fencing.RedisOptions{KeyPrefix: "example-weighted"})
	if err != nil {
		panic(err)
	}
	defer rdb.Del(ctx, guard.FenceKey("batch"))

	opts := unfair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true}
	semA, _ := unfair.New(rdb, "example-weighted", 3, opts)
	semB, _ := unfair.New(rdb, "example-weighted", 3, opts)
	defer semA.Close()
	defer semB.Close()

	a, _ := semA.AcquireN(ctx, 3)
	fmt.Println("A holds slots", a.Slots())
	fmt.Println("A writes:", guard.Check(ctx, fencing.Of("batch", a)))

	// A pauses past its lease. B's AcquireN returns once A's lease has
	// expired; B takes slots 0 and 1 and does not write (yet); C takes 2.
	b, _ := semB.AcquireN(ctx, 2)
	defer b.Release(ctx)
	c, _ := semB.Acquire(ctx)
	defer c.Release(ctx)
	fmt.Println("B holds", b.Slots(), "and C holds", c.Slots())
	fmt.Println("C writes:", guard.Check(ctx, fencing.Of("batch", c)))

	// A wakes up and writes with the fence of all its slots.
	err = guard.Check(ctx, fencing.Of("batch", a))
	var stale *fencing.StaleError
	if errors.As(err, &stale) {
		fmt.Println("A writes again: stale because of slot", stale.Slot)
	}
	// Output:
	// A holds slots [0 1 2]
	// A writes: <nil>
	// B holds [0 1] and C holds [2]
	// C writes: <nil>
	// A writes again: stale because of slot 2
}
