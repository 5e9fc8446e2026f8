package bench

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timerFD sleeps on a timerfd that the Go poller waits on, for holds as long
// as asked: the runtime's own timers have a millisecond's grain whenever the
// poller wakes for the network in between (netpoll rounds a wait shorter
// than 1 ms up to 1 ms), so a time.Sleep(2 * time.Millisecond) among a
// benchmark's replies lasted 2.3-2.5 ms on average where node's setTimeout
// held 2.1 ms, and the comparison measured the holders' sleep as much as
// the semaphores. A timerfd fires at its nanosecond deadline and wakes the
// poller itself, without spinning.
type timerFD struct {
	fd int
	f  *os.File // the poller's handle of fd; reads park the goroutine
}

// newTimerFD returns nil where timerfd is refused (time.Sleep then).
func newTimerFD() *timerFD {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return &timerFD{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}
}

// sleep waits d and reports whether it did (false: nothing was waited).
func (t *timerFD) sleep(d time.Duration) bool {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if unix.TimerfdSettime(t.fd, 0, &spec, nil) != nil {
		return false
	}
	var b [8]byte // the expiry count
	_, err := t.f.Read(b[:])
	return err == nil
}

func (t *timerFD) close() { t.f.Close() }
