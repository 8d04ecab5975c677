//go:build linux

package testfixture

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a helper server exit with the test binary, even when
// the test is killed before its cleanups run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
