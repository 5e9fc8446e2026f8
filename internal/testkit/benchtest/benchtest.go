// Package benchtest holds the go test -bench bodies that the fair and
// unfair packages share: the same loop, run against each variant.
package benchtest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redisinfo"
)

// TryAcquireRelease runs one uncontended TryAcquire+Release cycle per op
// on s (a semaphore of limit 1 using client c) and reports the time Redis
// spent in the two scripts per cycle as redis-µs/op.
func TryAcquireRelease(b *testing.B, c redis.UniversalClient, s redsem.Semaphore) {
	ctx := context.Background()
	before, err := redisinfo.ReadStats(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	ops := 0
	for b.Loop() {
		ops++
		l, err := s.TryAcquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	after, err := redisinfo.ReadStats(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(after.Sub(before).ScriptUsec)/float64(ops), "redis-µs/op")
}

// Handoff is a contended loop on s (limit 1): 4 x GOMAXPROCS goroutines
// acquire and release at once with no hold. One op is one hold, so ns/op is
// the time from one release to the next grant, all included.
func Handoff(b *testing.B, s redsem.Semaphore) {
	ctx := context.Background()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := s.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
