package fencing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/lua"
)

// RedisOptions configures a RedisGuard. The zero value is valid.
type RedisOptions struct {
	// KeyPrefix is the first part of every key the guard uses; zero:
	// "redsem-fence". It may not contain braces.
	KeyPrefix string
	// MaxSlots, when > 0, makes the guard reject slots >= MaxSlots with an
	// *InvalidFenceError (set it to the highest limit the semaphore will
	// ever have); zero: only slot >= 0 is checked.
	MaxSlots int
	// MaxSkew is how far a token may be ahead of the store-side Redis's
	// clock (its TIME, read in the script): a token above TIME in
	// microseconds plus MaxSkew is from the future, and Check and Set
	// refuse it with an *InvalidFenceError (Field "token") and record
	// nothing. Zero: DefaultMaxSkew (one minute). Negative: no bound (not
	// recommended: one forged token then makes the real holders of its
	// slots stale for as long as it is ahead). It must exceed how far the
	// semaphore's Redis clock can be ahead of this Redis's; see
	// DefaultMaxSkew.
	MaxSkew time.Duration
}

// RedisGuard fences writes to a Redis (the store-side Redis, which may be
// another server than the semaphore's). It keeps one HASH per resource,
// FenceKey(resource), mapping slot -> highest token, with no TTL: a record
// that expired would let a zombie through. A weighted fence is checked
// against, and recorded for, every slot it names in one script. Keys of one
// resource share a {hash-tag}, so Redis Cluster keeps them in one slot. It
// is safe for concurrent use.
//
// The guard is only as durable as the store-side Redis: if that Redis loses
// the fence key (restart without persistence, failover), the next write of
// each slot is accepted whatever its token. Keep the fence key in the same
// Redis as the data it protects so that both are lost or kept together.
//
// Tokens are microseconds of the semaphore's Redis clock, so the guard
// refuses a token more than MaxSkew ahead of the store-side Redis's own
// clock (see RedisOptions.MaxSkew): this assumes both clocks agree within
// MaxSkew.
type RedisGuard struct {
	client   redis.UniversalClient
	prefix   string
	maxSlots int
	skew     time.Duration // resolved: -1 for none
}

var _ Guard = (*RedisGuard)(nil)

// NewRedisGuard returns a guard that records tokens in client. It does no
// I/O; it returns an *InvalidFenceError for a nil client, a prefix with
// braces or a negative MaxSlots.
func NewRedisGuard(client redis.UniversalClient, opts RedisOptions) (*RedisGuard, error) {
	if client == nil {
		return nil, &InvalidFenceError{Field: "client", Value: "<nil>", Reason: "nil"}
	}
	prefix := opts.KeyPrefix
	if prefix == "" {
		prefix = "redsem-fence"
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, &InvalidFenceError{Field: "RedisOptions.KeyPrefix", Value: prefix, Reason: "contains a brace"}
	}
	if opts.MaxSlots < 0 {
		return nil, &InvalidFenceError{Field: "RedisOptions.MaxSlots", Value: strconv.Itoa(opts.MaxSlots), Reason: "negative"}
	}
	return &RedisGuard{client: client, prefix: prefix, maxSlots: opts.MaxSlots, skew: maxSkew(opts.MaxSkew)}, nil
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// base is the common start of every key of resource: prefix:{resource}:.
func (g *RedisGuard) base(resource string) string {
	return g.prefix + ":{" + tagEscaper.Replace(resource) + "}:"
}

// FenceKey is the HASH that holds resource's highest token per slot.
func (g *RedisGuard) FenceKey(resource string) string { return g.base(resource) + "fence" }

// DataKey returns a key named name in resource's {hash-tag}, for Set: in
// Redis Cluster the data key of a guarded write must share the fence key's
// hash slot. On a single Redis any key will do.
func (g *RedisGuard) DataKey(resource, name string) string { return g.base(resource) + "data:" + name }

// Check records f.Token as the highest token of (f.Resource, s) for every
// slot s of f unless a higher one is recorded for any of them, in one
// script: all or nothing; see Guard. A stale token yields a *StaleError
// that names the (lowest) slot with a higher token and that token, and
// leaves the record of every slot unchanged. A token more than MaxSkew
// ahead of the store-side Redis's clock yields an *InvalidFenceError and
// records nothing.
func (g *RedisGuard) Check(ctx context.Context, f Fence) error {
	if err := f.validate(g.maxSlots); err != nil {
		return err
	}
	v, err := core.Script(lua.Fence).Run(ctx, g.client, []string{g.FenceKey(f.Resource)},
		f.slotList(), strconv.FormatInt(f.Token, 10), maxSkewUS(g.skew)).Slice()
	return g.reply(f, v, err)
}

// Set is a guarded write: in one script it checks f as Check does (every
// slot of f, and the clock) and, only if the token is accepted, sets key to
// value, with a TTL of ttl when ttl > 0 (ttl is rounded down to
// milliseconds; a positive ttl below 1ms is an error) or no TTL when ttl is
// 0. A stale token yields a *StaleError, and a token more than MaxSkew
// ahead of the store-side Redis's clock an *InvalidFenceError; both leave
// the record of every slot and key unchanged. In Redis Cluster, key must
// share the fence key's hash slot: use DataKey.
func (g *RedisGuard) Set(ctx context.Context, f Fence, key, value string, ttl time.Duration) error {
	if err := f.validate(g.maxSlots); err != nil {
		return err
	}
	if ttl < 0 || (ttl > 0 && ttl < time.Millisecond) {
		return &InvalidFenceError{Field: "ttl", Value: ttl.String(), Reason: "negative or below 1ms"}
	}
	v, err := core.Script(lua.FenceSet).Run(ctx, g.client, []string{g.FenceKey(f.Resource), key},
		f.slotList(), strconv.FormatInt(f.Token, 10), maxSkewUS(g.skew), value, ttl.Milliseconds()).Slice()
	return g.reply(f, v, err)
}

// Highest returns the highest token recorded for (resource, slot), or 0
// when none is.
func (g *RedisGuard) Highest(ctx context.Context, resource string, slot int) (int64, error) {
	if err := (Fence{Resource: resource, Slot: slot, Token: 1}).validate(g.maxSlots); err != nil {
		return 0, err
	}
	n, err := g.client.HGet(ctx, g.FenceKey(resource), strconv.Itoa(slot)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// reply turns a fence script reply into nil, a *StaleError, an
// *InvalidFenceError or an error: {1, token}, {0, highest, slot} or
// {-1, now_us}.
func (g *RedisGuard) reply(f Fence, v []any, err error) error {
	if err != nil {
		return fmt.Errorf("fencing: redis guard: %w", err)
	}
	if len(v) == 2 {
		code, _ := v[0].(int64)
		now, isInt := v[1].(int64)
		switch {
		case code == 1:
			return nil
		case code == -1 && isInt:
			return futureError(f, now, g.skew, "the fence store's Redis clock")
		}
	}
	if len(v) != 3 {
		return fmt.Errorf("fencing: redis guard: unexpected reply %v", v)
	}
	s, _ := v[1].(string)
	highest, herr := strconv.ParseInt(s, 10, 64)
	s, _ = v[2].(string)
	slot, serr := strconv.Atoi(s)
	if herr != nil || serr != nil {
		return fmt.Errorf("fencing: redis guard: unexpected reply %v", v)
	}
	return &StaleError{Fence: f, Slot: slot, Highest: highest}
}
