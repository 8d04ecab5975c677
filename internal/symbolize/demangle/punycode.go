package demangle

import (
	"strings"
	"unicode/utf8"
)

// punycode decodes RFC 3492 as Rust spells it: '_' delimits the basic code
// points. The output has at most as many code points as the input bytes.
func punycode(in string) (string, bool) {
	const (
		base, tmin, tmax = 36, 1, 26
		skew, damp       = 38, 700
	)
	var out []rune
	if i := strings.LastIndexByte(in, '_'); i >= 0 {
		for _, c := range []byte(in[:i]) {
			out = append(out, rune(c))
		}
		in = in[i+1:]
	}
	n, bias, i := 128, 72, 0
	adapt := func(delta, points int, first bool) int {
		if first {
			delta /= damp
		} else {
			delta /= 2
		}
		delta += delta / points
		k := 0
		for delta > ((base-tmin)*tmax)/2 {
			delta /= base - tmin
			k += base
		}
		return k + (base-tmin+1)*delta/(delta+skew)
	}
	for p := 0; p < len(in); {
		old, w := i, 1
		for k := base; ; k += base {
			if p >= len(in) {
				return "", false
			}
			c := in[p]
			p++
			var digit int
			switch {
			case isLower(c):
				digit = int(c - 'a')
			case c >= '0' && c <= '9':
				digit = 26 + int(c-'0')
			default:
				return "", false
			}
			if digit > (1<<31-1-i)/w {
				return "", false
			}
			i += digit * w
			t := k - bias
			if k <= bias {
				t = tmin
			} else if k >= bias+tmax {
				t = tmax
			}
			if digit < t {
				break
			}
			if w > (1<<31-1)/(base-t) {
				return "", false
			}
			w *= base - t
		}
		bias = adapt(i-old, len(out)+1, old == 0)
		if i/(len(out)+1) > utf8.MaxRune-n {
			return "", false
		}
		n += i / (len(out) + 1)
		i %= len(out) + 1
		if n < 0x80 || !utf8.ValidRune(rune(n)) {
			return "", false
		}
		out = append(out[:i], append([]rune{rune(n)}, out[i:]...)...)
		i++
	}
	return string(out), true
}
