//go:build !linux

package perfmap

import (
	"fmt"
	"os"
	"runtime"

	"github.com/profsym/profsym/internal/frame"
)

// statFile identifies the open file's version and says whether it is a
// regular file.
func statFile(f *os.File) (fileKey, bool, error) {
	st, err := f.Stat()
	if err != nil {
		return fileKey{}, false, err
	}
	return fileKey{size: uint64(st.Size()), mtimeNs: st.ModTime().UnixNano()}, st.Mode().IsRegular(), nil
}

// openInRoot: perf maps are found through /proc/PID/root, which only Linux
// has.
func openInRoot(root, name string) (*os.File, error) {
	return nil, fmt.Errorf("perf maps of running processes are read on Linux only, not %s: %w", runtime.GOOS, frame.ErrNotFound)
}
