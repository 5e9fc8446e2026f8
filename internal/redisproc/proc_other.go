//go:build !linux

package redisproc

import (
	"os"
	"os/exec"
)

var (
	sigterm = os.Interrupt
	sigcont os.Signal // none: a stopped process cannot be continued portably
)

func setDeathSignal(*exec.Cmd) {}
