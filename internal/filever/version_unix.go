//go:build unix

package filever

import (
	"os"
	"syscall"
)

// Of returns the version st describes; path is used only where st carries
// no inode.
func Of(path string, st os.FileInfo) Version {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return Version{Dev: uint64(s.Dev), Ino: uint64(s.Ino), Size: st.Size(), Mtime: st.ModTime().UnixNano()}
	}
	return Version{Path: path, Size: st.Size(), Mtime: st.ModTime().UnixNano()}
}
