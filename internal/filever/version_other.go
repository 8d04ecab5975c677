//go:build !unix

package filever

import "os"

// Of returns the version st describes, named by path: no inodes here.
func Of(path string, st os.FileInfo) Version {
	return Version{Path: path, Size: st.Size(), Mtime: st.ModTime().UnixNano()}
}
