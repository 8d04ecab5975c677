//go:build !linux

package testfixture

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; cleanups stop the
// server elsewhere.
func dieWithParent(*exec.Cmd) {}

func userXattrs(string) bool { return false }
