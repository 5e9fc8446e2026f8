// Package fencing lets a store reject writes from a semaphore holder whose
// lease is gone: the "zombie" that paused (GC, swap, a stopped VM) past its
// lease while another holder took its slot, and then wakes up and writes as
// if nothing happened.
//
// Every redsem lease carries a slot in [0, limit) (a weighted lease from
// AcquireN: several slots) and a token that is strictly greater than every
// token issued before it for the same semaphore name. A holder presents a
// Fence (resource, slots, token) with each write; the store keeps the
// highest token per (resource, slot) and rejects a lower one with
// ErrStale. Fencing is per slot because the holders of a semaphore are not
// totally ordered: with limit 3, three live holders have three tokens,
// and "reject anything below the highest token seen" would reject the
// legitimate holders with the lower ones. Only holders of the same slot
// follow one another in time, so a zombie of slot 2 is rejected as soon as
// the new holder of slot 2 has reached the store, and holders of other slots
// are never disturbed. An equal token is accepted: a holder may write many
// times.
//
// A weighted lease is checked against every slot it holds, and its token is
// recorded for all of them or for none, in one atomic step: a zombie's slots
// are granted again one by one, possibly to different holders, and it must
// be rejected as soon as the new holder of any one of them has written, not
// only of its first slot.
//
// Guards (all implement or adapt to the Guard interface):
//
//   - RedisGuard: an atomic Lua check-and-record in a store-side Redis, and
//     RedisGuard.Set, a guarded SET in the same script.
//   - SQLGuard: a PostgreSQL table and one conditional INSERT ... ON CONFLICT
//     statement (CheckSQL; CheckSlotsSQL for a weighted fence), run in the
//     caller's own transaction via database/sql or (through ExecFunc) pgx.
//   - HTTP: Transport sends the fence of the request's context as headers
//     (Redsem-Fence-Slots for a weighted fence);
//     Middleware checks them with any Guard and answers 409 Conflict when
//     stale, 400 Bad Request when malformed.
//
// A typical guarded write:
//
//	lease, err := sem.AcquireN(ctx, 2) // or Acquire
//	...
//	err = guard.Set(ctx, fencing.Of("orders", lease), key, value, 0)
//	if errors.Is(err, fencing.ErrStale) {
//		// our lease was lost and a newer holder of one of our slots has written
//	}
//
// See docs/fencing.md for the token's exact monotonicity assumption and a
// timeline of the zombie.
package fencing
