package kernel

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Release returns the running kernel's release (uname -r).
func Release() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}
