package frame

import (
	"errors"
	"fmt"
)

// ErrInvalidBuildID is the reason of a frame whose mapping carries an
// identity that is not well formed; such an identity is never used to build
// a path or a cache key.
var ErrInvalidBuildID = errors.New("invalid_build_id")

// Sizes of a GNU build id in bytes. GNU ld writes 20 (sha1), lld and gold 8,
// 16 or 20, others up to 32; 64 leaves room without letting a peer send
// megabytes as an "identity".
const (
	MinBuildIDBytes = 4
	MaxBuildIDBytes = 64
	// MaxGoBuildIDLen bounds a Go build id (four base64 hashes and three
	// slashes, 83 bytes today).
	MaxGoBuildIDLen = 256
)

// ParseBuildID validates a GNU build id or an htlhash given as hex and
// returns it in lowercase. Anything else (odd length, non-hex, fewer than
// MinBuildIDBytes or more than MaxBuildIDBytes bytes) is an error wrapping
// ErrInvalidBuildID. The returned string is safe to use in a path.
func ParseBuildID(s string) (string, error) {
	if n := len(s); n%2 != 0 || n < 2*MinBuildIDBytes || n > 2*MaxBuildIDBytes {
		return "", fmt.Errorf("build id of %d hex digits (want an even number, %d to %d): %w",
			len(s), 2*MinBuildIDBytes, 2*MaxBuildIDBytes, ErrInvalidBuildID)
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			b[i] = c + 'a' - 'A'
		default:
			return "", fmt.Errorf("build id has a non-hex byte %q at %d: %w", c, i, ErrInvalidBuildID)
		}
	}
	return string(b), nil
}

// ParseGoBuildID validates a Go build id (the `Go` ELF note): printable
// base64url characters and slashes, no "..", at most MaxGoBuildIDLen bytes.
// It is matched against files, never joined into a path.
func ParseGoBuildID(s string) (string, error) {
	if len(s) == 0 || len(s) > MaxGoBuildIDLen {
		return "", fmt.Errorf("go build id of %d bytes (want 1 to %d): %w", len(s), MaxGoBuildIDLen, ErrInvalidBuildID)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '/' || c == '='
		if !ok || (c == '/' && i > 0 && s[i-1] == '/') {
			return "", fmt.Errorf("go build id has byte %q at %d: %w", c, i, ErrInvalidBuildID)
		}
	}
	return s, nil
}
