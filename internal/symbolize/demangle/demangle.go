// Package demangle turns C++ (Itanium) and Rust (legacy and v0) linkage names
// into the names people read, formatted like llvm-symbolizer prints them.
package demangle

import (
	"strings"

	dm "github.com/ianlancetaylor/demangle"

	"github.com/profsym/profsym/internal/lru"
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
	if strings.HasPrefix(s, "_R") {
		// Rust v0: profsym's own reader (the library's puts nested
		// closures out of order and drops unit generic arguments).
		if d, ok := RustV0(s); ok {
			return d
		}
		return s // as llvm-cxxfilt prints what it cannot demangle
	}
	out := llvmSpelling(dm.Filter(s, dm.LLVMStyle))
	// Only names with an expanded pack in a template argument need the
	// AST pass; everything else keeps Filter's output (Rust legacy names
	// included, which Filter recognises by their hash).
	if !strings.HasPrefix(s, "_Z") || !strings.Contains(s, "Dp") || !strings.Contains(out, ", (") {
		return out
	}
	a, err := dm.ToAST(s, dm.LLVMStyle)
	if err != nil {
		return out
	}
	if b, changed := flattenPacks(a); changed {
		return llvmSpelling(dm.ASTToString(b, dm.LLVMStyle))
	}
	return out
}

// llvmSpelling fixes the few spots where the library's LLVM style still
// differs from llvm-cxxfilt: an empty pack leaves a dangling ", " before the
// closing bracket, and "operator<" followed by template arguments is
// printed "operator< <T>" (GNU's spelling) where llvm prints "operator<<T>".
var llvmSpelling = strings.NewReplacer(
	", >", ">",
	", )", ")",
	"operator< <", "operator<<",
	"operator<< <", "operator<<<",
).Replace

// flattenPacks splices an expanded parameter pack into the template
// argument list holding it. The library prints such a pack as a
// parenthesized expression list ("is_invocable_r_v<int, F&, (int)>"), where
// llvm-cxxfilt and c++filt print the arguments ("<int, F&, int>").
func flattenPacks(a dm.AST) (dm.AST, bool) {
	any := false
	out := a.Copy(func(n dm.AST) dm.AST {
		t, ok := n.(*dm.Template)
		if !ok {
			return nil
		}
		var args []dm.AST
		changed := false
		for _, arg := range t.Args {
			if el, ok := arg.(*dm.ExprList); ok {
				args = append(args, el.Exprs...)
				changed = true
				continue
			}
			args = append(args, arg)
		}
		if !changed {
			return nil
		}
		any = true
		return &dm.Template{Name: t.Name, Args: args}
	}, func(dm.AST) bool { return false })
	if out == nil {
		return a, false
	}
	return out, any
}

// Defaults of the demangled-name cache bounds.
const (
	DefaultEntries = 1 << 16
	DefaultBytes   = 32 << 20
)

// Cache memoizes Name; symbol tables repeat the same few thousand names
// across millions of frames. It is bounded in entries and bytes (least
// recently used names are dropped) because a fleet brings an unbounded
// variety of names. Safe for concurrent use.
type Cache struct {
	c *lru.Cache[string, string]
}

// entryOverhead is a cached name's cost beyond its two strings: map and list
// entries and the string headers.
const entryOverhead = 160

// NewCache makes a cache of at most maxEntries names and maxBytes bytes
// (0: the defaults).
func NewCache(maxEntries int, maxBytes int64) *Cache {
	if maxEntries <= 0 {
		maxEntries = DefaultEntries
	}
	if maxBytes <= 0 {
		maxBytes = DefaultBytes
	}
	return &Cache{c: lru.NewKeyed[string, string](maxBytes, maxEntries,
		func(k, v string) int64 { return int64(len(k)+len(v)) + entryOverhead }, nil)}
}

// Name is Name(s), memoized.
func (c *Cache) Name(s string) string {
	if !Mangled(s) {
		return s
	}
	if v, ok := c.c.Get(s); ok {
		return v
	}
	d := Name(s)
	c.c.Add(s, d)
	return d
}

// Stats returns the cache's counters.
func (c *Cache) Stats() lru.Stats { return c.c.Stats() }
