package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// redisAddr is the address of the test's throw-away Redis; in your code it
// is your Redis.
func redisAddr() string { return redistest.SharedAddr() }

// Do acquires a slot, runs the function and always releases the slot. The
// function's context is cancelled if the lease is lost.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// At most 20 connections to the legacy database, across all instances.
	sem, err := unfair.New(client, "example:legacy-db", 20, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	err = redsem.Do(ctx, sem, func(ctx context.Context, l redsem.Lease) error {
		// Pass l.Slot() and l.Token() to the store you protect (package fencing).
		fmt.Println("holding slot", l.Slot(), "with a fencing token:", l.Token() > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: holding slot 0 with a fencing token: true
}

// Choosing the variant is a constructor call; the rest of the code sees a
// redsem.Semaphore.
func Example_chooseVariant() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	var sem redsem.Semaphore
	strictOrder := true
	if strictOrder {
		s, err := fair.New(client, "example:gpu", 2, fair.Options{})
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		sem = s
	} else {
		s, err := unfair.New(client, "example:gpu", 2, unfair.Options{})
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		sem = s
	}
	ctx := context.Background()
	a, _ := sem.Acquire(ctx)
	b, _ := sem.Acquire(ctx)
	_, err := sem.TryAcquire(ctx)
	fmt.Println("third holder:", err, errors.Is(err, redsem.ErrNoSlot))
	fmt.Println("slots:", a.Slot(), b.Slot(), "tokens increase:", b.Token() > a.Token())
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output:
	// third holder: redsem: no slot available true
	// slots: 0 1 tokens increase: true
}

// AcquireN takes several slots at once, all or nothing, like
// golang.org/x/sync/semaphore's Acquire(ctx, n), but across every process.
func Example_weighted() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()

	// A GPU server that takes 20 jobs' worth of work; this job needs 3.
	sem, err := fair.New(client, "example:gpu", 20, fair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()
	lease, err := sem.AcquireN(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("slots:", lease.Slots())
	_, err = sem.AcquireN(ctx, 21)
	fmt.Println("21 of 20:", errors.Is(err, redsem.ErrWeight))
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// slots: [0 1 2]
	// 21 of 20: true
}
