//go:build !linux

package perfmap

import (
	"fmt"
	"os"
	"runtime"

	"github.com/profsym/profsym/internal/frame"
)

// openInRoot: perf maps are found through /proc/PID/root, which only Linux
// has.
func openInRoot(root, name string) (*os.File, error) {
	return nil, fmt.Errorf("perf maps of running processes are read on Linux only, not %s: %w", runtime.GOOS, frame.ErrNotFound)
}
