package debuginfod

import (
	"io/fs"
	"syscall"
	"time"
)

// accessTime is when the cached file was last served (hit bumps it), so
// that the LRU order survives restarts.
func accessTime(info fs.FileInfo) time.Time {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	return info.ModTime()
}
