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
// Tokens from the future. A token is the semaphore's Redis server time in
// microseconds when the lease was granted: max(last+1, now_us), and the
// clock passes last+1 within the script that issues it, so a legitimate
// token is normally at or below the semaphore's Redis clock by the time any
// store sees it. A token far ahead of every clock was never issued: a bug
// or a hostile client made it up, and once recorded it would make every
// real holder of its slots stale until the clocks caught up with it (the
// year 2255 for 2^53-1). So every guard refuses a token more than a bound,
// MaxSkew, ahead of its store's own clock, with an *InvalidFenceError
// (Field "token"; HTTP 400) and records nothing: RedisGuard against the
// store-side Redis's TIME, read in its script; SQLGuard against
// PostgreSQL's clock_timestamp(), read in its statement; Middleware against
// its server's clock. MaxSkew is an option of each (RedisOptions.MaxSkew,
// SQLOptions.MaxSkew, MiddlewareOptions.MaxSkew); zero means
// DefaultMaxSkew, one minute, and a negative value turns the check off.
// This assumes that the semaphore's Redis and each store agree on the time
// within MaxSkew (NTP keeps servers within milliseconds); a store whose
// clock is behind by more refuses the real tokens, loudly, until the clocks
// are fixed or MaxSkew raised. A forged token within the bound can still be
// recorded and stall its slots for up to MaxSkew.
//
// Signed fences. Where a store is reached across a trust boundary, sign
// the HTTP fence: with Transport.SigningKey the client adds
// Redsem-Fence-Signature, an HMAC-SHA256 over the resource, the slots and
// the token, and NewMiddleware with the same MiddlewareOptions.SigningKey
// refuses (400, nothing recorded) a fence whose signature is missing or
// does not match, so a client without the key cannot present a token that
// no semaphore gave it. SetSignedHeaders and ParseSignedHeaders do the same
// by hand.
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
// See docs/fencing.md for the token's exact monotonicity assumption, the
// clock bound and a timeline of the zombie.
package fencing
