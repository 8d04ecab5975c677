//go:build !linux

package symupload

// lowPriority runs fn: thread priorities are only lowered on Linux.
func lowPriority(fn func() error) error { return fn() }
