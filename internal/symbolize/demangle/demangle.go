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
