// Package contain keeps a panic in a parser of untrusted bytes (ELF, DWARF,
// symbol tables, a download's build id) to the one file that caused it: the
// file reads as corrupt and everything else flows on. Fuzz targets switch
// containment off, so that there a panic is a crash the fuzzer reports: a
// bug of ours, not a corrupt file.
package contain

import "sync/atomic"

// off counts the fuzz targets running in this process with containment off.
var off atomic.Int32

// Panic, deferred directly by a parser (defer contain.Panic(func(r any) {
// ... })), recovers a panic and hands its value to handle, which sets the
// parser's results (an error wrapping frame.ErrCorruptFile). While a fuzz
// target has called Off, it recovers nothing.
func Panic(handle func(r any)) {
	if off.Load() > 0 {
		return
	}
	if r := recover(); r != nil {
		handle(r)
	}
}

// Off lets panics through until the returned function is called. Fuzz
// targets call it first: f.Cleanup(contain.Off()).
func Off() (restore func()) {
	off.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			off.Add(-1)
		}
	}
}
