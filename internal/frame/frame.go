// Package frame holds the plain data that every symbol source returns and
// the reasons a frame can stay unresolved. It has no dependencies so that
// sources, the engine, the CLI and the collector components all share it.
package frame

import "errors"

// Frame is one source-level frame for an address. A lookup returns a slice of
// frames, innermost (most deeply inlined) first and the real, outermost
// function last, as llvm-symbolizer and pprof order them.
type Frame struct {
	// Name is the function's name as recorded: the linkage (mangled) name
	// when the source has one, otherwise the plain name. The engine demangles.
	Name string
	// File and Line locate the address within this frame; Column and
	// Discriminator are zero when unknown. For an outer frame of an inline
	// chain they are the call site of the next inner frame.
	File          string
	Line          uint32
	Column        uint32
	Discriminator uint32
	// StartFile and StartLine are where the function is declared;
	// StartAddress is where this (possibly inlined) instance starts: its
	// DW_AT_low_pc (zero when DWARF describes it by ranges alone) or, for
	// the outermost frame, the start of the symbol covering the address.
	StartFile    string
	StartLine    uint32
	StartAddress uint64
}

// Reasons a frame stays unresolved. Sources and the engine wrap these with
// %w so callers can count by reason with errors.Is.
var (
	ErrNoDebugInfo     = errors.New("no_debug_info")
	ErrBuildIDMismatch = errors.New("build_id_mismatch")
	ErrFetchFailed     = errors.New("fetch_failed")
	ErrTimeout         = errors.New("timeout")
	ErrCorruptFile     = errors.New("corrupt_file")
	ErrNotFound        = errors.New("not_found") // no file for this object at all
	// ErrLimitExceeded: a configured bound (file size, decompressed bytes,
	// download size or time, name length) stopped the work for this frame.
	ErrLimitExceeded = errors.New("limit_exceeded")
	// ErrInvalidPath: a path from the input escapes its configured root or
	// names something other than a regular file.
	ErrInvalidPath = errors.New("invalid_path")
)

// Reason maps an error to its short, countable reason string.
func Reason(err error) string {
	for _, r := range []error{ErrInvalidBuildID, ErrInvalidPath, ErrLimitExceeded, ErrBuildIDMismatch, ErrTimeout, ErrFetchFailed, ErrCorruptFile, ErrNoDebugInfo, ErrNotFound} {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	if err == nil {
		return ""
	}
	return "error"
}
