package unfair_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/redisinfo"
	"github.com/redsem/redsem/internal/testkit/benchtest"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// Compare two commits with benchstat: see docs/benchmarks.md.

// BenchmarkTryAcquireRelease is one uncontended TryAcquire+Release cycle:
// two scripts, two round trips; redis-µs/op is the time Redis spent in them.
func BenchmarkTryAcquireRelease(b *testing.B) {
	c := redistest.Client(b)
	s, err := unfair.New(c, redistest.Name(b), 1, unfair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchtest.TryAcquireRelease(b, c, s)
}

// BenchmarkHandoff is a contended loop: limit 1, 4 x GOMAXPROCS goroutines
// in one process acquiring and releasing at once with no hold. One op is one
// hold, so ns/op is the time from one release to the next grant.
func BenchmarkHandoff(b *testing.B) {
	s, err := unfair.New(redistest.Client(b), redistest.Name(b), 1, unfair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchtest.Handoff(b, s)
}

// BenchmarkAcquireWaiters is the contended loop with n goroutines blocked in
// Acquire at once (limit 1): one op is one hold. Unfair waiters keep no
// state in Redis; what grows with n is the number of retries a release
// triggers. The fallback is long so that only release notices wake them.
func BenchmarkAcquireWaiters(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := redistest.Client(b)
			count := &redisinfo.CommandCounter{}
			c.AddHook(count)
			s, err := unfair.New(c, redistest.Name(b), 1,
				unfair.Options{FallbackInterval: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			// Hold the slot while the waiters line up.
			first, err := s.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			ops := make(chan struct{})
			var wg sync.WaitGroup
			sent := count.N()
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						l, err := s.Acquire(ctx)
						if err != nil {
							if !errors.Is(err, context.Canceled) {
								b.Error(err)
							}
							return
						}
						select {
						case ops <- struct{}{}:
						case <-ctx.Done():
						}
						_ = l.Release(context.Background())
					}
				}()
			}
			// Time only the steady state: wait until every waiter has made
			// its two first attempts (one before subscribing, one after).
			for count.N()-sent < 2*int64(n) {
				time.Sleep(5 * time.Millisecond)
			}
			if err := first.Release(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				<-ops
			}
			b.StopTimer()
			cancel()
			wg.Wait()
		})
	}
}
