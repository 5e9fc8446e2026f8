package redsem_test

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

// Resume hands a lease to another process: here a front end takes the slot
// for a job and a worker, with its own client as in another process,
// finishes the job and releases the slot. The lease's ID travels with the
// job.
func Example_resume() {
	ctx := context.Background()
	frontClient := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer frontClient.Close()
	workerClient := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer workerClient.Close()

	// Two jobs run at once, across front ends and workers.
	front, err := fair.New(frontClient, "example:jobs", 2, fair.Options{LeaseTTL: 900 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer front.Close()
	worker, err := fair.New(workerClient, "example:jobs", 2, fair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()

	// The front end: a slot for the job, handed on with it.
	lease, err := front.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	jobLeaseID := lease.ID()

	// The worker: the same grant, with the same fencing token.
	job, err := worker.Resume(ctx, jobLeaseID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same token:", job.Token() == lease.Token())
	if err := job.Release(ctx); err != nil { // the slot is free for everyone now
		log.Fatal(err)
	}

	// The front end's handle learns it at its next renewal, and ends quietly.
	<-lease.Done()
	fmt.Println("front end's lease:", lease.Err())
	_, err = worker.Resume(ctx, jobLeaseID)
	fmt.Println("resume again:", errors.Is(err, redsem.ErrLeaseLost))
	// Output:
	// same token: true
	// front end's lease: <nil>
	// resume again: true
}
