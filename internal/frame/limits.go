package frame

import "unicode/utf8"

// DefaultMaxNameBytes bounds a function or file name written into a
// profile or a log record. Real C++ names reach a few KB; a hostile symbol
// table can hold names of megabytes, which would be copied into every
// batch and every log attribute that mentions them.
const DefaultMaxNameBytes = 4096

// TruncSuffix marks a name cut at its limit.
const TruncSuffix = "..."

// Truncate returns s cut to at most max bytes on a UTF-8 boundary, ending
// in TruncSuffix when cut. max <= 0 means no bound.
func Truncate(s string, max int) string {
	if max <= 0 || len(s) <= max {
		return s
	}
	if max <= len(TruncSuffix) {
		return s[:max]
	}
	n := max - len(TruncSuffix)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + TruncSuffix
}
