package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
)

// naiveZSetAcquire is the textbook sorted-set acquire (naive_zset_acquire.lua,
// a copy of the baseline that is the bench's alone).
//
//go:embed naive_zset_acquire.lua
var naiveZSetAcquireSrc string

var naiveZSetAcquire = redis.NewScript(naiveZSetAcquireSrc)

// floorSrc is the FUNCTION library of the "floor" variant (floor.lua): the
// leanest script pair that keeps the records a lease of redsem's needs.
//
//go:embed floor.lua
var floorSrc string

// Variants are the workloads the bench tool knows, in the order it shows them.
var Variants = []string{"fair", "unfair", "local", "naive-counter", "naive-zset", "floor"}

// Sem is the one operation the workers need: block until n slots are held
// (n is 1 unless the run has --weights), and return the function that gives
// them back.
type Sem interface {
	Acquire(ctx context.Context, n int) (release func(context.Context) error, err error)
	Close() error
}

// acquirerN is a semaphore that can take several slots in one grant. Until
// the variants have AcquireN, the weighted path finds it by this assertion.
type acquirerN interface {
	AcquireN(ctx context.Context, n int) (redsem.Lease, error)
}

// Weighable reports whether variant can run with --weights (an acquire of
// more than one slot): local always, fair and unfair once they have
// AcquireN, the naive baselines never.
func Weighable(variant string) bool {
	switch variant {
	case "local":
		return true
	case "fair":
		_, ok := any((*fair.Semaphore)(nil)).(acquirerN)
		return ok
	case "unfair":
		_, ok := any((*unfair.Semaphore)(nil)).(acquirerN)
		return ok
	}
	return false
}

// naiveKey is the key of a naive baseline's semaphore.
func naiveKey(prefix, variant, name string) string {
	return prefix + ":bench:" + variant + ":{" + name + "}"
}

// SemOptions configures NewSem.
type SemOptions struct {
	// NaiveRetry is how long the naive baselines and the floor sleep between attempts;
	// zero: 100ms, the textbook retry interval.
	NaiveRetry time.Duration
	// LeaseTTL for fair, unfair and naive-zset; zero: 30s.
	LeaseTTL time.Duration
	// KeyPrefix of every key; zero: the semaphores' default ("redsem").
	KeyPrefix string
	// Rate of fair and unfair (Options.Rate); zero: none.
	Rate redsem.Rate
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
	if o.KeyPrefix == "" {
		o.KeyPrefix = "redsem"
	}
	if variant != "local" && client == nil {
		return nil, fmt.Errorf("bench: variant %s needs a Redis client", variant)
	}
	switch variant {
	case "fair":
		s, err := fair.New(client, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, KeyPrefix: o.KeyPrefix, Rate: o.Rate})
		if err != nil {
			return nil, err
		}
		return redsemSem{s}, nil
	case "unfair":
		s, err := unfair.New(client, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, KeyPrefix: o.KeyPrefix, Rate: o.Rate})
		if err != nil {
			return nil, err
		}
		return redsemSem{s}, nil
	case "local":
		return &localSem{slots: make(chan struct{}, limit)}, nil
	case "naive-counter":
		return &naiveCounter{c: client, key: naiveKey(o.KeyPrefix, variant, name), limit: int64(limit), retry: o.NaiveRetry}, nil
	case "naive-zset":
		return &naiveZSet{c: client, key: naiveKey(o.KeyPrefix, variant, name), limit: limit,
			timeoutMs: o.LeaseTTL.Milliseconds(), retry: o.NaiveRetry}, nil
	case "floor":
		return newFloor(client, naiveKey(o.KeyPrefix, variant, name), limit, o.NaiveRetry)
	}
	return nil, fmt.Errorf("bench: unknown variant %q (want one of %v)", variant, Variants)
}

// redsemSem runs the workers on a redsem.Semaphore.
type redsemSem struct{ s redsem.Semaphore }

// tokenAcquirer is a Sem whose grants carry a fencing token (redsem's: the
// server's clock in µs at the grant, or just above): RunWorkers records it.
type tokenAcquirer interface {
	AcquireToken(ctx context.Context, n int) (release func(context.Context) error, token int64, err error)
}

// Acquire takes n slots: Acquire for one, AcquireN (found by interface
// assertion) for more; without AcquireN an acquire of n > 1 fails.
func (r redsemSem) Acquire(ctx context.Context, n int) (func(context.Context) error, error) {
	release, _, err := r.AcquireToken(ctx, n)
	return release, err
}

// AcquireToken is Acquire that also returns the lease's fencing token.
func (r redsemSem) AcquireToken(ctx context.Context, n int) (func(context.Context) error, int64, error) {
	var l redsem.Lease
	var err error
	if n == 1 {
		l, err = r.s.Acquire(ctx)
	} else if w, ok := r.s.(acquirerN); ok {
		l, err = w.AcquireN(ctx, n)
	} else {
		return nil, 0, fmt.Errorf("bench: %T has no AcquireN: cannot take %d slots at once", r.s, n)
	}
	if err != nil {
		return nil, 0, err
	}
	return l.Release, l.Token(), nil
}

// Close closes the semaphore.
func (r redsemSem) Close() error { return r.s.Close() }

// localSem is an in-process channel semaphore: the machine's ceiling for the
// same loop, with no Redis at all. Blocked senders on a Go channel are
// served in arrival order, so it is FIFO too. An acquire of n > 1 slots
// takes them one by one while holding mu, so that two of them never hold
// part of what each needs (no deadlock) and a big one is not overtaken.
type localSem struct {
	slots chan struct{}
	mu    sync.Mutex
}

// Acquire takes n slots, or none if ctx ends first.
func (l *localSem) Acquire(ctx context.Context, n int) (func(context.Context) error, error) {
	if n > 1 {
		l.mu.Lock()
		defer l.mu.Unlock()
	}
	for i := 0; i < n; i++ {
		select {
		case l.slots <- struct{}{}:
		case <-ctx.Done():
			l.give(i)
			return nil, ctx.Err()
		}
	}
	return func(context.Context) error { l.give(n); return nil }, nil
}

// give returns n slots.
func (l *localSem) give(n int) {
	for i := 0; i < n; i++ {
		<-l.slots
	}
}

// Close does nothing: the channel needs no cleanup.
func (l *localSem) Close() error { return nil }

// naiveCounter is the textbook first, wrong design: INCR, and if over the
// limit DECR and retry after a fixed sleep. A crashed holder leaks its slot
// forever; it is here only as a baseline.
type naiveCounter struct {
	c     redis.UniversalClient
	key   string
	limit int64
	retry time.Duration
}

// Acquire loops INCR, and DECR plus a sleep while over the limit; it
// takes one slot whatever is asked (the baselines are not weighable).
func (n *naiveCounter) Acquire(ctx context.Context, _ int) (func(context.Context) error, error) {
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

// Close does nothing.
func (n *naiveCounter) Close() error { return nil }

// naiveZSet is the textbook sorted-set semaphore (naive_zset_acquire.lua),
// polled at a fixed interval, released with ZREM.
type naiveZSet struct {
	c         redis.UniversalClient
	key       string
	limit     int
	timeoutMs int64
	retry     time.Duration
}

// Acquire polls the script until it grants a slot; it takes one slot
// whatever is asked (the baselines are not weighable).
func (n *naiveZSet) Acquire(ctx context.Context, _ int) (func(context.Context) error, error) {
	id := uuid.NewString()
	for {
		ok, err := naiveZSetAcquire.Run(ctx, n.c, []string{n.key}, n.timeoutMs, n.limit, id).Int()
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

// Close does nothing.
func (n *naiveZSet) Close() error { return nil }

// floorSem runs floor.lua's packed pair (floor_acquire, floor_release) on
// go-redis with nothing of redsem around it: what one call at a time costs
// a Go client that keeps a lease's records (server clock, fencing token,
// slot, a record per id, a tombstone) and nothing more. It is the ceiling
// of the uncontended cycle (docs/benchmarks.md); it has no queue and no
// notices, so under contention it polls at a fixed interval like the naive
// baselines, and it has no expiry, so its leases last floorLease.
type floorSem struct {
	c     redis.UniversalClient
	keys  []string
	limit int
	retry time.Duration
}

// floorLease is the floor's lease time, ms: longer than any run, because
// floor.lua does not model expiry (it refuses once a lease has expired).
const floorLease = int64(time.Hour / time.Millisecond)

// floorTombstone is how long, ms, the floor keeps a released id's tombstone.
const floorTombstone = 15000

// newFloor loads floor.lua's library (FUNCTION LOAD REPLACE) and returns
// the floor semaphore whose keys start with key.
func newFloor(c redis.UniversalClient, key string, limit int, retry time.Duration) (*floorSem, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.FunctionLoadReplace(ctx, floorSrc).Err(); err != nil {
		return nil, fmt.Errorf("bench: loading floor.lua: %w", err)
	}
	return &floorSem{c: c, limit: limit, retry: retry,
		keys: []string{key + ":holders", key + ":free", key + ":ended", key + ":meta"}}, nil
}

// Acquire calls floor_acquire until it grants a slot, sleeping the retry
// interval after each refusal; it takes one slot whatever is asked (not
// weighable).
func (f *floorSem) Acquire(ctx context.Context, _ int) (func(context.Context) error, error) {
	id := uuid.NewString()
	for {
		r, err := f.c.FCall(ctx, "floor_acquire", f.keys, f.limit, id, floorLease).Int64Slice()
		if err != nil {
			return nil, err
		}
		switch r[0] {
		case 1:
			return func(ctx context.Context) error {
				return f.c.FCall(ctx, "floor_release", f.keys, id, floorTombstone).Err()
			}, nil
		case 0:
			if err := sleep(ctx, f.retry); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("bench: floor_acquire replied %v", r)
		}
	}
}

// Close does nothing.
func (f *floorSem) Close() error { return nil }

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
