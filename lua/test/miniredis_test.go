package lua_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
)

// Both variants run unchanged on miniredis, which users unit-test with:
// the scripts use only commands that it (and Redis 6.2) has, and plain
// PUBLISH/SUBSCRIBE outside a cluster. This checks that they run there, not
// redsem's guarantees (those are tested against real Redis).
func TestVariantsRunOnMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			defer c.Close()
			var s redsem.Semaphore
			var err error
			if variant == "fair" {
				s, err = fair.New(c, "mini-"+variant, 2, fair.Options{})
			} else {
				s, err = unfair.New(c, "mini-"+variant, 2, unfair.Options{})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			a, err := s.AcquireN(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatalf("TryAcquire when full: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				l, err := s.Acquire(ctx)
				if err == nil {
					err = l.Release(ctx)
				}
				done <- err
			}()
			if err := a.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := s.SetLimit(ctx, 3); err != nil {
				t.Fatal(err)
			}
			st, err := s.Status(ctx)
			if err != nil || st.Limit != 3 || len(st.Holders) != 0 {
				t.Fatalf("status %+v, %v", st, err)
			}
		})
	}
}

// Code that takes a redsem.Semaphore can be unit-tested on miniredis: both
// variants run on it unchanged. That checks your code, not redsem's
// guarantees (those are tested against real Redis).
func Example_miniredis() {
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	sem, err := unfair.New(client, "api", 2, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()
	ctx := context.Background()
	a, _ := sem.TryAcquire(ctx)
	b, _ := sem.TryAcquire(ctx)
	_, err = sem.TryAcquire(ctx)
	fmt.Println("third:", err)
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output: third: redsem: no slot available
}
