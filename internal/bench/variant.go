package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// Variants are the workloads the bench tool knows, in the order it shows them.
var Variants = []string{"fair", "unfair", "local", "naive-counter", "naive-zset"}

// Sem is the one operation the workers need: block until a slot is held,
// and return the function that gives it back.
type Sem interface {
	Acquire(ctx context.Context) (release func(context.Context) error, err error)
	Close() error
}

// SemOptions configures NewSem.
type SemOptions struct {
	// NaiveRetry is how long the naive baselines sleep between attempts;
	// zero: 100ms, the seed's retry_interval.
	NaiveRetry time.Duration
	// LeaseTTL for fair, unfair and naive-zset; zero: 30s.
	LeaseTTL time.Duration
}

// NewSem returns the semaphore of variant called name with limit slots.
// client may be nil for "local", which runs without Redis.
func NewSem(variant string, client redis.UniversalClient, name string, limit int, o SemOptions) (Sem, error) {
	if limit < 1 {
		return nil, fmt.Errorf("bench: limit %d < 1", limit)
	}
	if o.NaiveRetry <= 0 {
		o.NaiveRetry = 100 * time.Millisecond
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 30 * time.Second
	}
	if variant != "local" && client == nil {
		return nil, fmt.Errorf("bench: variant %s needs a Redis client", variant)
	}
	switch variant {
	case "fair":
		s, err := fair.New(client, name, limit, fair.Options{LeaseTTL: o.LeaseTTL})
		if err != nil {
			return nil, err
		}
		return redsemSem{s, s.Close}, nil
	case "unfair":
		s, err := unfair.New(client, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL})
		if err != nil {
			return nil, err
		}
		return redsemSem{s, s.Close}, nil
	case "local":
		return make(localSem, limit), nil
	case "naive-counter":
		return &naiveCounter{c: client, key: "bench:naive-counter:{" + name + "}", limit: int64(limit), retry: o.NaiveRetry}, nil
	case "naive-zset":
		return &naiveZSet{c: client, key: "bench:naive-zset:{" + name + "}", limit: limit,
			timeoutMs: o.LeaseTTL.Milliseconds(), retry: o.NaiveRetry}, nil
	}
	return nil, fmt.Errorf("bench: unknown variant %q (want one of %v)", variant, Variants)
}

type redsemSem struct {
	s     redsem.Semaphore
	close func() error
}

func (r redsemSem) Acquire(ctx context.Context) (func(context.Context) error, error) {
	l, err := r.s.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (r redsemSem) Close() error { return r.close() }

// localSem is an in-process channel semaphore: the machine's ceiling for the
// same loop, with no Redis at all. Blocked senders on a Go channel are
// served in arrival order, so it is FIFO too.
type localSem chan struct{}

func (l localSem) Acquire(ctx context.Context) (func(context.Context) error, error) {
	select {
	case l <- struct{}{}:
		return func(context.Context) error { <-l; return nil }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l localSem) Close() error { return nil }

// naiveCounter is the seed's first, wrong design: INCR, and if over the
// limit DECR and retry after a fixed sleep. A crashed holder leaks its slot
// forever; it is here only as a baseline.
type naiveCounter struct {
	c     redis.UniversalClient
	key   string
	limit int64
	retry time.Duration
}

func (n *naiveCounter) Acquire(ctx context.Context) (func(context.Context) error, error) {
	for {
		v, err := n.c.Incr(ctx, n.key).Result()
		if err != nil {
			return nil, err
		}
		if v <= n.limit {
			return func(ctx context.Context) error { return n.c.Decr(ctx, n.key).Err() }, nil
		}
		if err := n.c.Decr(context.WithoutCancel(ctx), n.key).Err(); err != nil {
			return nil, err
		}
		if err := sleep(ctx, n.retry); err != nil {
			return nil, err
		}
	}
}

func (n *naiveCounter) Close() error { return nil }

// naiveZSet is the seed's sorted-set semaphore (lua/naive_zset_acquire.lua),
// polled at a fixed interval, released with ZREM.
type naiveZSet struct {
	c         redis.UniversalClient
	key       string
	limit     int
	timeoutMs int64
	retry     time.Duration
}

func (n *naiveZSet) Acquire(ctx context.Context) (func(context.Context) error, error) {
	id := uuid.NewString()
	for {
		ok, err := lua.NaiveZSetAcquire.Run(ctx, n.c, []string{n.key}, n.timeoutMs, n.limit, id).Int()
		if err != nil {
			return nil, err
		}
		if ok == 1 {
			return func(ctx context.Context) error { return n.c.ZRem(ctx, n.key, id).Err() }, nil
		}
		if err := sleep(ctx, n.retry); err != nil {
			return nil, err
		}
	}
}

func (n *naiveZSet) Close() error { return nil }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// IsDone reports whether err is the end of a run's context rather than a
// failure of the semaphore.
func IsDone(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
