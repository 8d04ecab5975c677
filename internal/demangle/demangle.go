// Package demangle turns C++ (Itanium) and Rust (legacy and v0) linkage names
// into the names people read, formatted like llvm-symbolizer prints them.
package demangle

import (
	"strings"
	"sync"

	dm "github.com/ianlancetaylor/demangle"
)

// Mangled reports whether s looks like a name this package can demangle.
// It is cheap, so hot paths can skip the cache for plain C and Go names.
func Mangled(s string) bool {
	return strings.HasPrefix(s, "_Z") || strings.HasPrefix(s, "_R") || strings.HasPrefix(s, "__Z")
}

// Name returns the demangled form of s, or s itself when it is not a
// mangled name or fails to demangle. Rust legacy names lose their hash
// suffix and have their $LT$-style escapes decoded, as rustfilt does.
func Name(s string) string {
	if !Mangled(s) {
		return s
	}
	return dm.Filter(s, dm.LLVMStyle)
}

// Cache memoizes Name; symbol tables repeat the same few thousand names
// across millions of frames.
type Cache struct {
	m sync.Map // string -> string
}

// Name is Name(s), memoized.
func (c *Cache) Name(s string) string {
	if !Mangled(s) {
		return s
	}
	if v, ok := c.m.Load(s); ok {
		return v.(string)
	}
	d := Name(s)
	c.m.Store(s, d)
	return d
}
