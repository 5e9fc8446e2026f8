// Package fair is the FIFO semaphore: waiters queue in a Redis ZSET in
// arrival order, holders live in another ZSET scored by deadline, and Lua
// scripts admit only the earliest live waiters, however often a later one
// asks.
//
// Liveness costs one heartbeat per process, not per waiter: each process
// has one session that keeps all of its waiters queued; a session that
// stops heart-beating for QueueTTL is evicted with all its waiters, wherever
// they stand. Freed slots are granted inside the script that frees them
// (release, cancel, expiry, SetLimit) and the grantee is told on its
// session's pub/sub channel (sharded pub/sub on a Redis Cluster), or
// directly by the releaser's reply when both are in one process; the
// session heartbeat is the fallback.
//
// A Family (NewFamily) makes one semaphore per key on demand (per tenant,
// per API key) whose members share that one session, heartbeat and
// subscription per process, and forgets members nobody uses.
package fair

//go:generate go run ../internal/variantgen fair
