package fencing

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redsem/redsem/internal/human"
)

// DefaultMaxSkew is how far a token may be ahead of a store's own clock
// when a guard's MaxSkew option is zero; see MaxSkew in RedisOptions.
//
// A token is the semaphore's Redis server time in microseconds when the
// lease was granted (or the previous token plus one, which stays behind
// that clock, see docs/fencing.md), and it reaches a store later still, so
// a legitimate token is ahead of the store's clock only by as much as the
// semaphore's Redis clock is ahead of the store's. Servers kept by NTP
// agree within milliseconds, and a clock left unsynchronised drifts by
// seconds a day, so one minute leaves a wide margin for clocks that work.
// It also bounds the harm of a token that no semaphore issued (a bug, or a
// client that forges one): a guard records at most a token one minute
// ahead, which makes the real holders of its slots stale for at most about
// one minute, instead of until the year 2255 for a token of 2^53-1.
const DefaultMaxSkew = time.Minute

// maxSkew resolves a MaxSkew option: zero is DefaultMaxSkew, a negative
// value turns the bound off (returned as -1).
func maxSkew(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultMaxSkew
	case d < 0:
		return -1
	}
	return d
}

// maxSkewUS is the bound in whole microseconds for the stores, or -1 for
// none.
func maxSkewUS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Microseconds()
}

// fromFuture reports whether token is more than skew (>= 0) ahead of the
// clock reading nowUS (microseconds since 1970), without overflow.
func fromFuture(token, nowUS int64, skew time.Duration) bool {
	if skew < 0 {
		return false
	}
	us := skew.Microseconds()
	if nowUS > math.MaxInt64-us {
		return false
	}
	return token > nowUS+us
}

// futureError is the *InvalidFenceError of a token more than skew ahead of
// clock (named for the message), which read nowUS (0: unknown).
func futureError(f Fence, nowUS int64, skew time.Duration, clock string) error {
	reason := fmt.Sprintf("from the future: more than MaxSkew %s ahead of %s", human.Duration(skew), clock)
	if nowUS > 0 {
		ahead := f.Token - nowUS // > 0
		if ahead < math.MaxInt64/int64(time.Microsecond) {
			reason += fmt.Sprintf(" (by %s)", human.Duration((time.Duration(ahead) * time.Microsecond).Round(time.Millisecond)))
		} else {
			reason += fmt.Sprintf(" (which reads %d us)", nowUS)
		}
	}
	reason += "; forged, or the semaphore's Redis and this store disagree on the time by more than MaxSkew"
	return &InvalidFenceError{Field: "token", Value: strconv.FormatInt(f.Token, 10), Reason: reason}
}
