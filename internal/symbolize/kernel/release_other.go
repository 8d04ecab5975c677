//go:build !linux

package kernel

import (
	"fmt"
	"runtime"
)

// Release fails: there is no Linux kernel to name.
func Release() (string, error) {
	return "", fmt.Errorf("kernel release: not Linux but %s", runtime.GOOS)
}
