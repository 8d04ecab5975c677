//go:build unix

package locate

import (
	"fmt"
	"os"
	"syscall"
)

// statKey names a file version: device, inode, size and modification time,
// so that the paths reaching one file share an entry.
func statKey(path string, st os.FileInfo) string {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d:%d:%d:%d", uint64(s.Dev), uint64(s.Ino), st.Size(), st.ModTime().UnixNano())
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
