// Package unfair is the sorted-set semaphore: holders live in a Redis ZSET
// scored by their deadline (server time); one Lua script removes expired
// holders, counts, and admits, so at most limit leases are live at once.
//
// Whoever asks while a slot is free gets it: waiters are not ordered. A
// blocked Acquire subscribes to release notices (pub/sub; sharded pub/sub
// on a Redis Cluster), so a freed slot is taken within about one round
// trip, with a bounded fallback in case a notice is lost. Choose package
// fair when arrival order matters.
package unfair

//go:generate go run ../internal/variantgen unfair
