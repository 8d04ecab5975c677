package demangle

import (
	"strconv"
	"strings"
)

// Rust's v0 symbol mangling (RFC 2603), demangled as llvm-cxxfilt and
// llvm-symbolizer print it: crate roots without their hash, closures as
// {closure#N}, generic arguments of value paths as ::<...>, backrefs
// followed, the instantiating crate dropped and a suffix (".llvm.123")
// kept in parentheses. A name this reader cannot parse is returned as is.
// Input is untrusted: recursion, bound lifetimes and the output are
// bounded, and every read is checked.

// Bounds of one v0 demangling.
const (
	maxV0Depth  = 500      // nested paths, types and consts (llvm's bound)
	maxV0Output = 64 << 10 // bytes of output: backrefs can expand a short name exponentially
)

// RustV0 demangles a v0 symbol ("_R..."). ok is false when s is not one
// this reader understands.
func RustV0(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, "_R")
	if !ok {
		return "", false
	}
	in, suffix := rest, ""
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		in, suffix = rest[:i], rest[i:]
	}
	d := &v0{in: in, print: true}
	d.path(false, false)
	if d.pos != len(d.in) && !d.err {
		// The instantiating crate: parsed, not printed.
		d.print = false
		d.path(false, false)
	}
	if d.err || d.pos != len(d.in) {
		return "", false
	}
	if suffix != "" {
		d.out.WriteString(" (" + suffix + ")")
	}
	return d.out.String(), true
}

// v0 is one demangling: the input after "_R", the cursor, the output.
type v0 struct {
	in    string
	pos   int
	out   strings.Builder
	print bool
	err   bool
	depth int
	bound uint64 // lifetimes bound by enclosing for<...> binders
}

func (d *v0) fail() { d.err = true }

func (d *v0) look() byte {
	if d.err || d.pos >= len(d.in) {
		return 0
	}
	return d.in[d.pos]
}

func (d *v0) next() byte {
	if d.err || d.pos >= len(d.in) {
		d.fail()
		return 0
	}
	c := d.in[d.pos]
	d.pos++
	return c
}

func (d *v0) eat(c byte) bool {
	if d.look() == c && !d.err {
		d.pos++
		return true
	}
	return false
}

func (d *v0) w(s string) {
	if d.err || !d.print {
		return
	}
	if d.out.Len()+len(s) > maxV0Output {
		d.fail()
		return
	}
	d.out.WriteString(s)
}

// enter bounds recursion; leave undoes it.
func (d *v0) enter() bool {
	if d.err || d.depth >= maxV0Depth {
		d.fail()
		return false
	}
	d.depth++
	return true
}

func (d *v0) leave() { d.depth-- }

// path prints a path; inType omits "::" before generic arguments, as in a
// type. With open, generic arguments are left open (a dyn trait's
// associated types follow) and path reports whether they were.
func (d *v0) path(inType, open bool) bool {
	if !d.enter() {
		return false
	}
	defer d.leave()
	switch d.next() {
	case 'C':
		d.optBase62('s')
		d.ident(true)
	case 'M':
		d.implPath(inType)
		d.w("<")
		d.typ()
		d.w(">")
	case 'X':
		d.implPath(inType)
		d.w("<")
		d.typ()
		d.w(" as ")
		d.path(true, false)
		d.w(">")
	case 'Y':
		d.w("<")
		d.typ()
		d.w(" as ")
		d.path(true, false)
		d.w(">")
	case 'N':
		ns := d.next()
		if !isLower(ns) && !isUpper(ns) {
			d.fail()
			return false
		}
		d.path(inType, false)
		dis := d.optBase62('s')
		name, puny := d.identifier()
		if isUpper(ns) {
			d.w("::{")
			switch ns {
			case 'C':
				d.w("closure")
			case 'S':
				d.w("shim")
			default:
				d.w(string(ns))
			}
			if name != "" {
				d.w(":")
				d.writeIdent(name, puny)
			}
			d.w("#" + strconv.FormatUint(dis, 10) + "}")
		} else if name != "" {
			d.w("::")
			d.writeIdent(name, puny)
		}
	case 'I':
		d.path(inType, false)
		if !inType {
			d.w("::")
		}
		d.w("<")
		for i := 0; !d.err && !d.eat('E'); i++ {
			if i > 0 {
				d.w(", ")
			}
			d.genericArg()
		}
		if open {
			return true
		}
		d.w(">")
	case 'B':
		isOpen := false
		d.backref(func() { isOpen = d.path(inType, open) })
		return isOpen
	default:
		d.fail()
	}
	return false
}

// implPath parses an impl's path, which is not printed.
func (d *v0) implPath(inType bool) {
	saved := d.print
	d.print = false
	d.optBase62('s')
	d.path(inType, false)
	d.print = saved
}

func (d *v0) genericArg() {
	switch {
	case d.eat('L'):
		d.lifetime(d.base62())
	case d.eat('K'):
		d.constant()
	default:
		d.typ()
	}
}

// backref follows B<n>: fn parses at input position n, which must lie
// before the reference (so every chain of references ends). Not followed
// when nothing is printed.
func (d *v0) backref(fn func()) {
	at := d.base62()
	if d.err || at >= uint64(d.pos) {
		d.fail()
		return
	}
	if !d.print {
		return
	}
	saved := d.pos
	d.pos = int(at)
	fn()
	d.pos = saved
}

// optBase62 reads tag and a base-62 number (plus one), or nothing: 0.
func (d *v0) optBase62(tag byte) uint64 {
	if !d.eat(tag) {
		return 0
	}
	v := d.base62()
	if v+1 == 0 {
		d.fail()
	}
	return v + 1
}

// base62 reads "_" (0) or digits 0-9a-zA-Z then "_" (their value plus one).
func (d *v0) base62() uint64 {
	if d.eat('_') {
		return 0
	}
	var v uint64
	for {
		c := d.next()
		if d.err {
			return 0
		}
		if c == '_' {
			break
		}
		var digit uint64
		switch {
		case c >= '0' && c <= '9':
			digit = uint64(c - '0')
		case isLower(c):
			digit = 10 + uint64(c-'a')
		case isUpper(c):
			digit = 36 + uint64(c-'A')
		default:
			d.fail()
			return 0
		}
		if v > (^uint64(0)-digit)/62 {
			d.fail()
			return 0
		}
		v = v*62 + digit
	}
	if v+1 == 0 {
		d.fail()
		return 0
	}
	return v + 1
}

// identifier reads ["u"] <decimal> ["_"] <bytes>.
func (d *v0) identifier() (string, bool) {
	puny := d.eat('u')
	n := d.decimal()
	d.eat('_')
	if d.err || n > uint64(len(d.in)-d.pos) {
		d.fail()
		return "", false
	}
	s := d.in[d.pos : d.pos+int(n)]
	d.pos += int(n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '_' || c >= '0' && c <= '9' || isLower(c) || isUpper(c)) {
			d.fail()
			return "", false
		}
	}
	return s, puny
}

func (d *v0) ident(print bool) {
	name, puny := d.identifier()
	if print {
		d.writeIdent(name, puny)
	}
}

func (d *v0) writeIdent(name string, puny bool) {
	if !puny {
		d.w(name)
		return
	}
	s, ok := punycode(name)
	if !ok {
		d.fail()
		return
	}
	d.w(s)
}

func (d *v0) decimal() uint64 {
	c := d.look()
	if c < '0' || c > '9' {
		d.fail()
		return 0
	}
	if d.eat('0') {
		return 0
	}
	var v uint64
	for c := d.look(); c >= '0' && c <= '9'; c = d.look() {
		d.pos++
		if v > (^uint64(0)-uint64(c-'0'))/10 {
			d.fail()
			return 0
		}
		v = v*10 + uint64(c-'0')
	}
	return v
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isUpper(c byte) bool { return c >= 'A' && c <= 'Z' }
func isHex(c byte) bool   { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }
