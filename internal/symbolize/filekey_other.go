//go:build !unix

package symbolize

import (
	"fmt"
	"os"
)

// fileKey names a file's contents by path, size and modification time.
func fileKey(path string, st os.FileInfo) string {
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
