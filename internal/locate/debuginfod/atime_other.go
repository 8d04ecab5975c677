//go:build !linux

package debuginfod

import (
	"io/fs"
	"time"
)

// accessTime falls back to the modification time (when the file was
// stored): without atime the LRU order is by download after a restart.
func accessTime(info fs.FileInfo) time.Time { return info.ModTime() }
