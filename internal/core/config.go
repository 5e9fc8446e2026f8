package core

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// Defaults shared by both variants.
const (
	DefaultPrefix   = "redsem"
	DefaultLeaseTTL = 30 * time.Second
	DefaultQueueTTL = 10 * time.Second
	DefaultFallback = time.Second
	// DefaultReplicaTimeout is how long a grant waits for replica
	// acknowledgement when MinReplicas is set.
	DefaultReplicaTimeout = time.Second
	MaxLimit              = 1 << 20
	MaxNameLen            = 512
	// MaxRatePer is the longest Rate.Per (the Lua library's MAX_PER_MS): 366 days.
	MaxRatePer = 366 * 24 * time.Hour
)

// Config is what an Engine is built from; fair.New and unfair.New fill it
// from their Options.
type Config struct {
	Client redis.UniversalClient
	Name   string
	Limit  int
	Fair   bool

	Prefix           string
	LeaseTTL         time.Duration
	QueueTTL         time.Duration // fair only
	DisableAutoRenew bool
	// Fallback bounds how long a waiter waits without a wake-up message
	// before it checks again.
	Fallback time.Duration
	Observer redsem.Observer
	Logger   *slog.Logger
	// MinReplicas, if positive, makes every grant wait (WAIT) until this
	// many replicas acknowledged it, at most ReplicaTimeout; a grant that
	// too few acknowledge is released and reported as ErrNotReplicated.
	MinReplicas    int
	ReplicaTimeout time.Duration

	// Owner is stored with every lease and queue entry (Status shows it);
	// zero: hostname:pid.
	Owner string
	// MaxHold, if positive, stops auto-renewal once a lease is this old.
	MaxHold time.Duration
	// MaxWaiters, if positive, bounds the fair queue (ErrQueueFull).
	MaxWaiters int
	// Rate, if not zero, bounds how many slots are granted per Rate.Per.
	Rate redsem.Rate
}

// MaxOwnerLen bounds Options.Owner.
const MaxOwnerLen = 256

// DefaultOwner is hostname:pid.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

func cfgErr(field, format string, args ...any) error {
	return &redsem.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validate checks cfg and fills in defaults.
func (c *Config) validate() error {
	if c.Client == nil || isNilPointer(c.Client) {
		return cfgErr("client", "nil Redis client")
	}
	if c.Name == "" {
		return cfgErr("name", "empty name")
	}
	if len(c.Name) > MaxNameLen {
		return cfgErr("name", "longer than %d bytes", MaxNameLen)
	}
	if !utf8.ValidString(c.Name) {
		return cfgErr("name", "not valid UTF-8")
	}
	if c.Limit < 1 || c.Limit > MaxLimit {
		return cfgErr("limit", "%d is outside [1, %d]", c.Limit, MaxLimit)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return cfgErr("Options.KeyPrefix", "%q contains a brace, which would break the key hash tag", c.Prefix)
	}
	var err error
	if c.LeaseTTL, err = ttl("Options.LeaseTTL", c.LeaseTTL, DefaultLeaseTTL); err != nil {
		return err
	}
	if c.QueueTTL, err = ttl("Options.QueueTTL", c.QueueTTL, DefaultQueueTTL); err != nil {
		return err
	}
	if c.Fallback, err = ttl("Options.FallbackInterval", c.Fallback, DefaultFallback); err != nil {
		return err
	}
	if c.ReplicaTimeout, err = ttl("Options.ReplicaTimeout", c.ReplicaTimeout, DefaultReplicaTimeout); err != nil {
		return err
	}
	if c.Owner == "" {
		c.Owner = DefaultOwner()
	}
	if len(c.Owner) > MaxOwnerLen || strings.ContainsAny(c.Owner, "|\n") || !utf8.ValidString(c.Owner) {
		return cfgErr("Options.Owner", "%q: at most %d bytes of UTF-8 without '|' or newline", c.Owner, MaxOwnerLen)
	}
	if c.MaxHold < 0 {
		return cfgErr("Options.MaxHold", "negative duration %v", c.MaxHold)
	}
	if c.MaxWaiters < 0 {
		return cfgErr("Options.MaxWaiters", "negative count %d", c.MaxWaiters)
	}
	var err2 error
	if c.Rate, err2 = CheckRate("Options.Rate", c.Rate); err2 != nil {
		return err2
	}
	if c.MinReplicas < 0 {
		return cfgErr("Options.MinReplicas", "negative count %d", c.MinReplicas)
	}
	if c.MinReplicas > 0 {
		switch c.Client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			return cfgErr("Options.MinReplicas", "needs a *redis.Client, a failover client or a *redis.ClusterClient, not %T", c.Client)
		}
	}
	return nil
}

// CheckRate validates a rate (Options.Rate, or SetRate's argument) and
// returns it with Per rounded up to whole milliseconds (the scripts'
// resolution; up, so that the bound is never looser than asked).
func CheckRate(field string, r redsem.Rate) (redsem.Rate, error) {
	switch {
	case r.IsZero():
		return r, nil
	case r.Limit < 0:
		return r, cfgErr(field, "negative limit in %d/%v", r.Limit, r.Per)
	case r.Per < 0:
		return r, cfgErr(field, "negative period in %d/%v", r.Limit, r.Per)
	case r.Limit == 0:
		return r, cfgErr(field, "limit 0 with period %v: set both (the zero Rate means no rate)", r.Per)
	case r.Per == 0:
		return r, cfgErr(field, "period 0 with limit %d: set both (the zero Rate means no rate)", r.Limit)
	case r.Limit > MaxLimit:
		return r, cfgErr(field, "limit %d is outside [1, %d]", r.Limit, MaxLimit)
	case r.Per > MaxRatePer:
		return r, cfgErr(field, "period %v is longer than %v", r.Per, MaxRatePer)
	}
	if t := r.Per.Truncate(time.Millisecond); t != r.Per {
		r.Per = t + time.Millisecond
	}
	return r, nil
}

func ttl(field string, d, def time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, cfgErr(field, "negative duration %v", d)
	case d == 0:
		return def, nil
	case d < time.Millisecond:
		return 0, cfgErr(field, "%v is below the 1ms resolution of Redis", d)
	}
	return d.Truncate(time.Millisecond), nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
