//go:build unix

package testfixture

import (
	"syscall"
	"testing"
)

// ID is the cgroup's id, as bpf_get_current_cgroup_id returns it: its
// directory's inode number.
func (c *Cgroup) ID(t testing.TB) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(c.Dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
