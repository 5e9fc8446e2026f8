package redisproc

import (
	"os"
	"os/exec"
	"syscall"
)

var (
	sigterm           = syscall.SIGTERM
	sigcont os.Signal = syscall.SIGCONT
)

// setDeathSignal makes the server die with this process even if Stop is
// never called (a crash, kill -9).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
