//go:build linux

package testfixture

import (
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// dieWithParent makes a helper server exit with the test binary, even when
// the test is killed before its cleanups run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// userXattrs reports whether files under dir can carry user extended
// attributes.
func userXattrs(dir string) bool {
	p := filepath.Join(dir, ".xattr-probe")
	if err := unix.Mknod(p, unix.S_IFREG|0o600, 0); err != nil {
		return false
	}
	defer unix.Unlink(p)
	return unix.Setxattr(p, "user.profsym.probe", []byte("1"), 0) == nil
}
