package demangle

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Types, function signatures, dyn bounds, lifetimes and consts of Rust
// v0 names (see rustv0.go).

var basicTypes = map[byte]string{
	'a': "i8", 'b': "bool", 'c': "char", 'd': "f64", 'e': "str", 'f': "f32", 'h': "u8", 'i': "isize",
	'j': "usize", 'l': "i32", 'm': "u32", 'n': "i128", 'o': "u128", 's': "i16", 't': "u16", 'u': "()",
	'v': "...", 'x': "i64", 'y': "u64", 'z': "!", 'p': "_",
}

func (d *v0) typ() {
	if !d.enter() {
		return
	}
	defer d.leave()
	start := d.pos
	c := d.next()
	if b, ok := basicTypes[c]; ok {
		d.w(b)
		return
	}
	switch c {
	case 'A':
		d.w("[")
		d.typ()
		d.w("; ")
		d.constant()
		d.w("]")
	case 'S':
		d.w("[")
		d.typ()
		d.w("]")
	case 'T':
		d.w("(")
		n := 0
		for ; !d.err && !d.eat('E'); n++ {
			if n > 0 {
				d.w(", ")
			}
			d.typ()
		}
		if n == 1 {
			d.w(",")
		}
		d.w(")")
	case 'R', 'Q':
		d.w("&")
		if d.eat('L') {
			if l := d.base62(); l != 0 {
				d.lifetime(l)
				d.w(" ")
			}
		}
		if c == 'Q' {
			d.w("mut ")
		}
		d.typ()
	case 'P':
		d.w("*const ")
		d.typ()
	case 'O':
		d.w("*mut ")
		d.typ()
	case 'F':
		d.fnSig()
	case 'D':
		d.dynBounds()
		if !d.eat('L') {
			d.fail()
			return
		}
		if l := d.base62(); l != 0 {
			d.w(" + ")
			d.lifetime(l)
		}
	case 'B':
		d.backref(d.typ)
	default:
		d.pos = start
		d.path(true, false)
	}
}

func (d *v0) fnSig() {
	saved := d.bound
	defer func() { d.bound = saved }()
	d.binder()
	if d.eat('U') {
		d.w("unsafe ")
	}
	if d.eat('K') {
		d.w(`extern "`)
		if d.eat('C') {
			d.w("C")
		} else {
			name, puny := d.identifier()
			if puny {
				d.fail()
			}
			d.w(strings.ReplaceAll(name, "_", "-"))
		}
		d.w(`" `)
	}
	d.w("fn(")
	for i := 0; !d.err && !d.eat('E'); i++ {
		if i > 0 {
			d.w(", ")
		}
		d.typ()
	}
	d.w(")")
	if !d.eat('u') {
		d.w(" -> ")
		d.typ()
	}
}

func (d *v0) dynBounds() {
	saved := d.bound
	defer func() { d.bound = saved }()
	d.w("dyn ")
	d.binder()
	for i := 0; !d.err && !d.eat('E'); i++ {
		if i > 0 {
			d.w(" + ")
		}
		open := d.path(true, true)
		for !d.err && d.eat('p') {
			if !open {
				open = true
				d.w("<")
			} else {
				d.w(", ")
			}
			name, _ := d.identifier()
			d.w(name + " = ")
			d.typ()
		}
		if open {
			d.w(">")
		}
	}
}

// binder prints "for<'a, 'b> " for G<n>: n lifetimes bound from here on.
func (d *v0) binder() {
	n := d.optBase62('G')
	if d.err || n == 0 {
		return
	}
	// Each bound lifetime is used later, a byte at least: a binder longer
	// than the input is forged (and would print without bound).
	if n >= uint64(len(d.in))-min(d.bound, uint64(len(d.in))) {
		d.fail()
		return
	}
	d.w("for<")
	for i := uint64(0); i < n; i++ {
		d.bound++
		if i > 0 {
			d.w(", ")
		}
		d.lifetime(1)
	}
	d.w("> ")
}

func (d *v0) lifetime(i uint64) {
	if i == 0 {
		d.w("'_")
		return
	}
	if i-1 >= d.bound {
		d.fail()
		return
	}
	depth := d.bound - i
	if depth < 26 {
		d.w("'" + string(rune('a'+depth)))
	} else {
		d.w("'z" + strconv.FormatUint(depth-26+1, 10))
	}
}

func (d *v0) constant() {
	if !d.enter() {
		return
	}
	defer d.leave()
	c := d.next()
	switch c {
	case 'a', 's', 'l', 'x', 'n', 'i', 'h', 't', 'm', 'y', 'o', 'j':
		if d.eat('n') {
			d.w("-")
		}
		hex, v := d.hex()
		if len(hex) <= 16 {
			d.w(strconv.FormatUint(v, 10))
		} else {
			d.w("0x" + hex)
		}
	case 'b':
		switch hex, _ := d.hex(); hex {
		case "0":
			d.w("false")
		case "1":
			d.w("true")
		default:
			d.fail()
		}
	case 'c':
		hex, v := d.hex()
		if len(hex) > 6 || v > utf8.MaxRune {
			d.fail()
			return
		}
		d.w(quoteChar(rune(v)))
	case 'p':
		d.w("_")
	case 'B':
		d.backref(d.constant)
	default:
		d.fail()
	}
}

// hex reads "0_" or hex digits then "_": the digits and, when they fit,
// their value.
func (d *v0) hex() (string, uint64) {
	start := d.pos
	var v uint64
	if !isHex(d.look()) {
		d.fail()
		return "", 0
	}
	if d.eat('0') {
		if !d.eat('_') {
			d.fail()
		}
		return "0", 0
	}
	for !d.err && !d.eat('_') {
		c := d.next()
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint64(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint64(c-'a') + 10
		default:
			d.fail()
		}
	}
	if d.err {
		return "", 0
	}
	return d.in[start : d.pos-1], v
}

func quoteChar(r rune) string {
	switch r {
	case '\t':
		return `'\t'`
	case '\r':
		return `'\r'`
	case '\n':
		return `'\n'`
	case '\\':
		return `'\\'`
	case '\'':
		return `'\''`
	}
	if r >= 0x20 && r <= 0x7e {
		return "'" + string(r) + "'"
	}
	return `'\u{` + strconv.FormatInt(int64(r), 16) + `}'`
}
