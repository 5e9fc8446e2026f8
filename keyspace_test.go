package redsem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
)

// Helpers for tests that look at Redis only generically: every semaphore
// gets a key prefix of its own (Options.KeyPrefix), and the tests inspect
// or delete "every key under the prefix", never a particular key, so they
// hold whatever key layout the scripts use.

// prefixed are the options of a semaphore built on its own key prefix.
type prefixed struct {
	Prefix           string
	LeaseTTL         time.Duration
	DisableAutoRenew bool
}

// uniquePrefix returns a key prefix no other test uses.
func uniquePrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "rst" + hex.EncodeToString(b[:])
}

// newPrefixed builds variant v's semaphore with o, closed when the test ends.
func newPrefixed(t *testing.T, variant string, c redis.UniversalClient, name string, limit int, o prefixed) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	switch variant {
	case "unfair":
		s, err = unfair.New(c, name, limit, unfair.Options{KeyPrefix: o.Prefix, LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew})
	case "fair":
		s, err = fair.New(c, name, limit, fair.Options{KeyPrefix: o.Prefix, LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew})
	default:
		t.Fatalf("unknown variant %q", variant)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// prefixKeys returns every key whose name starts with prefix.
func prefixKeys(ctx context.Context, t *testing.T, c *redis.Client, prefix string) []string {
	t.Helper()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN %s*: %v", prefix, err)
	}
	return keys
}

// footprint is what the keys under a prefix take in Redis.
type footprint struct {
	keys    int
	members int   // elements of every collection (strings count 1)
	bytes   int64 // sum of MEMORY USAGE
}

// measure sums, over every key under prefix, its elements (by its TYPE)
// and its MEMORY USAGE (all of it: SAMPLES 0).
func measure(ctx context.Context, t *testing.T, c *redis.Client, prefix string) footprint {
	t.Helper()
	var f footprint
	for _, k := range prefixKeys(ctx, t, c, prefix) {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var n int64
		switch typ {
		case "none":
			continue // expired between SCAN and TYPE
		case "zset":
			n, err = c.ZCard(ctx, k).Result()
		case "hash":
			n, err = c.HLen(ctx, k).Result()
		case "set":
			n, err = c.SCard(ctx, k).Result()
		case "list":
			n, err = c.LLen(ctx, k).Result()
		case "stream":
			n, err = c.XLen(ctx, k).Result()
		default:
			n = 1
		}
		if err != nil {
			t.Fatalf("counting %s (%s): %v", k, typ, err)
		}
		b, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("MEMORY USAGE %s: %v", k, err)
		}
		f.keys++
		f.members += int(n)
		f.bytes += b
	}
	return f
}

// deleteAll deletes every key under prefix: the semaphore's whole state.
func deleteAll(ctx context.Context, t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	keys := prefixKeys(ctx, t, c, prefix)
	for _, k := range keys {
		if err := c.Del(ctx, k).Err(); err != nil {
			t.Fatalf("DEL %s: %v", k, err)
		}
	}
	return len(keys)
}
