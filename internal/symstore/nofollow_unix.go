//go:build unix

package symstore

import "syscall"

// noFollow refuses a symlink planted in the store.
const noFollow = syscall.O_NOFOLLOW
