//go:build unix

package cgsel

import (
	"io/fs"
	"syscall"
)

// inode is a cgroup's id: kernfs gives a directory its node's id as inode
// number (64-bit kernels), which bpf_get_current_cgroup_id returns.
func inode(info fs.FileInfo) (uint64, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}
