//go:build linux

package symupload

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lowPriority runs fn on an OS thread of its own at nice 19, so that on a
// busy host the kernel gives its CPU to the sampled processes (and the
// agent's sampling) first. The thread is not unlocked: it exits with the
// goroutine instead of going back to the runtime still niced.
func lowPriority(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Lowering one's own priority needs no privilege; on failure fn
		// still runs, paced.
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		done <- fn()
	}()
	return <-done
}
