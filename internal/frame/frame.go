// Package frame is the contract between the two halves of profsym: the
// attribute keys and frame types of the frame format (docs/frame-format.md),
// the identity of a file, the plain data every symbol source returns, and the
// reasons a frame can stay unresolved. It imports nothing from this project
// (only OpenTelemetry's semantic conventions), so that the host side, the
// engine, the locate chain, the CLI and the collector components all share it.
package frame

import (
	"errors"
	"strings"
)

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
	// ErrNoMapping: a native frame without a mapping, or whose mapping
	// carries no identity (build id or htlhash) to look a file up by.
	ErrNoMapping = errors.New("no_mapping")
	// ErrPending: a file for this frame is still being fetched (a
	// debuginfod download) and the batch did not wait for it; the fetch
	// goes on, and a later batch names the frame once it has arrived.
	ErrPending = errors.New("pending")
)

// ErrRetry marks a failure that comes from what else is going on (memory
// that other work holds) rather than from the input. It is not a reason of
// its own: the error also wraps one (ErrLimitExceeded) for counting, and
// is Transient, so that nothing remembers it.
var ErrRetry = errors.New("retry later")

// Reasons lists every reason, for documentation and telemetry.
var Reasons = []error{ErrInvalidBuildID, ErrInvalidPath, ErrLimitExceeded, ErrBuildIDMismatch, ErrPending, ErrTimeout,
	ErrFetchFailed, ErrCorruptFile, ErrNoDebugInfo, ErrNotFound, ErrNoMapping}

// Transient reports whether err may go away on its own soon (a fetch still
// running, a timeout, a failed fetch), so that nothing should remember it
// for long.
func Transient(err error) bool {
	return errors.Is(err, ErrPending) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrFetchFailed) || errors.Is(err, ErrRetry)
}

// Reason maps an error to its short, countable reason string.
func Reason(err error) string {
	for _, r := range Reasons {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	if err == nil {
		return ""
	}
	return "error"
}

// JavaMethod is the function name of a Java frame, the same from every
// source (JFR recordings, the HotSpot walker): the class in source form
// ("java.lang.String", from the JVM's "java/lang/String") and the method,
// "java.lang.String.hashCode".
func JavaMethod(internalClass, method string) string {
	if internalClass == "" {
		return method
	}
	return strings.ReplaceAll(internalClass, "/", ".") + "." + method
}
