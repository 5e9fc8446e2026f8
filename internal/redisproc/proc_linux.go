package redisproc

import (
	"os/exec"
	"syscall"
)

var sigterm = syscall.SIGTERM

// setDeathSignal makes the server die with this process even if Stop is
// never called (a crash, kill -9).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
