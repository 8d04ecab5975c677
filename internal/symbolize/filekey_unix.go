//go:build unix

package symbolize

import (
	"fmt"
	"os"
	"syscall"
)

// fileKey names a file's contents by device and inode, so that one library
// reached through many paths (/proc/PID/map_files/..., a host mount) is one
// object, plus size and modification time, so that a rebuilt file is not.
func fileKey(path string, st os.FileInfo) string {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d:%d:%d:%d", uint64(s.Dev), uint64(s.Ino), st.Size(), st.ModTime().UnixNano())
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
