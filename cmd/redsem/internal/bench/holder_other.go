//go:build !linux

package bench

import "time"

// timerFD is Linux's precise sleep (holder_linux.go); elsewhere holds use
// time.Sleep.
type timerFD struct{}

func newTimerFD() *timerFD                  { return nil }
func (t *timerFD) sleep(time.Duration) bool { return false }
func (t *timerFD) close()                   {}
