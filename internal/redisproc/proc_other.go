//go:build !linux

package redisproc

import (
	"os"
	"os/exec"
)

var sigterm = os.Interrupt

func setDeathSignal(*exec.Cmd) {}
