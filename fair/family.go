package fair

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// FamilyOptions configures a Family: the Options of every member, and how
// long an idle member is kept.
type FamilyOptions struct {
	Options
	// IdleAfter is how long the family keeps a member with no call in
	// flight and no live lease before it drops it from its map; zero: one
	// minute. A dropped member keeps working for whoever still holds it
	// (and for its leases); Get makes a new one for its key.
	IdleAfter time.Duration
	// Shards is how many hash slots the members are spread over (a
	// member's shard is a stable hash of its key); each shard has its own
	// sessions key and channel, and a process keeps at most one session,
	// subscription and heartbeat per shard it uses. Zero: 1, on every
	// client (a *redis.ClusterClient too), the key layout of families made
	// before shards existed, so that a default never changes what a key
	// means; at most 1024. On a cluster, set it (16 covers up to 16
	// masters, 5 or 6 shards per master of 3) once no process of an older
	// version uses the family: those write no record and keep the one-shard
	// layout. The first process that uses the family records its shard
	// count in Redis; a client built with another (the default included)
	// gets a *redsem.ConfigError from Acquire, TryAcquire, SetLimit and
	// SetRate, so every process of a family must use the same (see
	// docs/operations.md, "Families on a cluster").
	Shards int
	// Total bounds the slots held across all members at once ("each
	// tenant at most limit, all tenants together at most Total"): a grant
	// needs room in its member's limit and in the total, in one atomic
	// admission, so no slot is held while waiting for the other; AcquireN
	// counts n against both. Zero: no total, and the family counts none
	// (its members store and behave exactly as without this field). At
	// most 2^20. A family with a total keeps all of its members in one
	// hash slot: Shards above 1 is refused with a *redsem.ConfigError.
	// Every process of the family must be built with a Total (the value
	// of the first live client holds until SetTotal sets one for all; a
	// client built with another gets redsem.ErrLimitMismatch while
	// anything is held); a process built without one would not count its
	// leases (see docs/design.md, "Limits that compose").
	Total int
}

// Family is a keyed family of fair semaphores: one semaphore per key (per
// tenant, API key, ...), made on demand by Get, all with the same limit and
// options. In one process, the members of a shard share one pub/sub
// subscription and one queue session whose one heartbeat keeps the waiters
// of every member alive, so that the cost of waiting grows with processes
// and shards, not with keys; members are dropped from memory once idle. In
// Redis, every member has its own keys (which expire when unused, as a
// semaphore's do) under its shard's hash tag, so a cluster spreads a
// family's members over FamilyOptions.Shards slots. Keys are
// independent: a full key never blocks another. A Family is safe for
// concurrent use; make one per name and process.
type Family struct {
	f *core.Family
}

// NewFamily returns a family called name of fair semaphores that each admit
// at most limit holders at once, in arrival order. It does no I/O and
// validates like New (and a negative IdleAfter, Shards outside [0, 1024]).
func NewFamily(client redis.UniversalClient, name string, limit int, opts FamilyOptions) (*Family, error) {
	f, err := core.NewFamily(core.ConfigOf(client, name, limit, true, opts.Options), opts.IdleAfter, opts.Shards, opts.Total)
	if err != nil {
		return nil, err
	}
	return &Family{f: f}, nil
}

// Get returns the semaphore of key, making it if needed; key follows the
// rules of a semaphore name (non-empty UTF-8, at most 512 bytes), or Get
// returns a *redsem.ConfigError. Calls for one key share one semaphore
// (one Redis key set, one local state) until the family drops it as idle. Its Name is key; its Close
// does nothing (Family.Close ends the shared machinery). Get returns
// redsem.ErrClosed after Close.
func (f *Family) Get(key string) (*Semaphore, error) { return semaphore(f.f.Get(key)) }

// SetTotal sets the family's total (FamilyOptions.Total) for every client
// of the family, live: raising it admits waiters at once, lowering it
// grants nothing until enough is released; 0 removes the bound (the
// family goes on counting, so a later SetTotal holds at once). The
// setting never expires. A family built without a total counts nothing:
// SetTotal then returns a *redsem.ConfigError.
func (f *Family) SetTotal(ctx context.Context, total int) error { return f.f.SetTotal(ctx, total) }

// Status returns the family's total in force (0: none) and its use: the
// slots held in all members, and the waiters in all members (the entries of their queues).
// Without a total it scans the members' keys (SCAN) and adds them up, one
// member at a time.
func (f *Family) Status(ctx context.Context) (redsem.FamilyStatus, error) { return f.f.Status(ctx) }

// Name is the family's name as given to NewFamily.
func (f *Family) Name() string { return f.f.Name() }

// Len is how many members the family keeps in memory now.
func (f *Family) Len() int { return f.f.Len() }

// Close stops the shared subscription and heartbeat: Acquire calls of every
// member blocked at the time leave their queue and return redsem.ErrClosed,
// as do later calls and Get. Leases already granted keep working (renew,
// release) after Close.
func (f *Family) Close() error { return f.f.Close() }
