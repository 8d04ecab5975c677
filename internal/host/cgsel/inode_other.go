//go:build !unix

package cgsel

import "io/fs"

// inode: no cgroups here.
func inode(fs.FileInfo) (uint64, bool) { return 0, false }
