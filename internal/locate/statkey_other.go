//go:build !unix

package locate

import (
	"fmt"
	"os"
)

func statKey(path string, st os.FileInfo) string {
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
