package bench

import "time"

// A holder keeps a worker's slot for as long as its hold asks, as a holder
// that works that long would. A hold under a millisecond spins: the
// runtime's timers wake a sleeper no sooner than the poller's next
// millisecond tick, so time.Sleep(time.Microsecond) held for about 1 ms,
// and an uncontended run measured calls paced 1 ms apart (cold caches)
// where it meant back to back. Longer holds sleep (holder_linux.go says
// how precisely).
type holder struct{ t *timerFD }

// newHolder returns a worker's holder; goSleep: its holds use time.Sleep.
func newHolder(goSleep bool) *holder {
	if goSleep {
		return &holder{}
	}
	return &holder{t: newTimerFD()}
}

func (h *holder) hold(d time.Duration) {
	switch {
	case d <= 0:
	case d < time.Millisecond:
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
	case h.t == nil || !h.t.sleep(d):
		time.Sleep(d)
	}
}

func (h *holder) close() {
	if h.t != nil {
		h.t.close()
	}
}
