// Package redsem defines a distributed semaphore: a bound on how many holders
// use a shared resource at once across goroutines, processes and machines,
// with Redis as the coordination point.
//
// Two implementations share the Semaphore interface and are chosen at
// construction:
//
//   - [github.com/redsem/redsem/unfair]: holders in a sorted set; whoever asks
//     when a slot is free gets it. Cheapest; no ordering among waiters.
//   - [github.com/redsem/redsem/fair]: strict FIFO; waiters queue in Redis and
//     only the earliest live waiters are admitted.
//
// Every granted slot is a Lease with a TTL that renews itself in the
// background, a slot number in [0, limit) and a fencing token that is
// strictly greater than every token issued before it for the same name. Pass
// the slot and token to the store you protect (see package fencing) so that a
// holder that paused past its lease is rejected there.
//
// Use Do to acquire, run and always release:
//
//	err := redsem.Do(ctx, sem, func(ctx context.Context, l redsem.Lease) error {
//		return callLegacyDB(ctx, l.Slot(), l.Token())
//	})
package redsem
