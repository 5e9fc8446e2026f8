// Package lua holds redsem's Redis scripts. Each script is a .lua file in
// this directory whose header states its KEYS, ARGV and reply; lib.lua holds
// the functions they share and is prepended to each one. All scripts take
// time from the Redis server (TIME), never from the client, and touch only
// the keys of one semaphore, which share a {hash-tag} so that Redis Cluster
// keeps them in one slot.
//
// The scripts are exposed as *redis.Script values; call them with Run, which
// sends EVALSHA and falls back to EVAL when the server's script cache was
// emptied (restart, failover, SCRIPT FLUSH).
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	lib string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed heartbeat.lua
	heartbeatSrc string
	//go:embed status.lua
	statusSrc string
	//go:embed setlimit.lua
	setLimitSrc string
	//go:embed fence_lib.lua
	fenceLib string
	//go:embed fence.lua
	fenceSrc string
	//go:embed fence_set.lua
	fenceSetSrc string
)

var (
	// Acquire takes n slots, or (queue mode) joins the fair queue.
	Acquire = redis.NewScript(lib + acquireSrc)
	// Renew extends a live lease and never re-creates a lost one.
	Renew = redis.NewScript(lib + renewSrc)
	// Release gives a slot back or removes a queue entry, then admits waiters.
	Release = redis.NewScript(lib + releaseSrc)
	// Heartbeat keeps a process's fair waiters alive, at a cost that does
	// not grow with their number.
	Heartbeat = redis.NewScript(lib + heartbeatSrc)
	// Status reads the live state without writing (run it with RunRO).
	Status = redis.NewScript(lib + statusSrc)
	// SetLimit sets the limit for every client of a name.
	SetLimit = redis.NewScript(lib + setLimitSrc)

	// Fence checks a fencing token for the slots of a resource and records
	// it (package fencing). It runs in the store-side Redis, on a fence key
	// rather than the semaphore keys; fence_lib.lua is prepended.
	Fence = redis.NewScript(fenceLib + fenceSrc)
	// FenceSet is Fence plus a SET of one data key, only when not stale.
	FenceSet = redis.NewScript(fenceLib + fenceSetSrc)
)

// KeyCount is the number of KEYS every semaphore script takes (see lib.lua);
// the fence scripts take their own.
const KeyCount = 7
