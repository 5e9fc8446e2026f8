package bench

import (
	"testing"
	"time"
)

// A hold is never shorter than asked, whichever way it waits (timerfd,
// time.Sleep, the spin under a millisecond), and a holder serves many
// holds in a row.
func TestHolderHoldsAtLeastAsAsked(t *testing.T) {
	for _, goSleep := range []bool{false, true} {
		h := newHolder(goSleep)
		for _, d := range []time.Duration{0, 50 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, time.Millisecond} {
			start := time.Now()
			h.hold(d)
			if got := time.Since(start); got < d {
				t.Errorf("goSleep=%v: hold(%v) lasted %v", goSleep, d, got)
			}
		}
		h.close()
	}
}
