package v8

import (
	"encoding/binary"
	"fmt"
	"sort"
	"unicode/utf16"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// memory is the part of runtimes.Mem the readers use.
type memory interface {
	Read(addr uint64, p []byte) error
}

// Bounds of what is read of one process's heap.
const (
	maxStringParts  = 64      // pieces of one cons/sliced/thin string followed
	maxStringDepth  = 16      // nesting of cons strings
	maxSourceUnits  = 8 << 20 // a script's source read for its line ends
	maxSPTBytes     = 1 << 20 // a source position table
	maxLineEnds     = 1 << 22 // lines of a script
	maxContextLocal = 1 << 16 // a ScopeInfo's context locals
	// V8's ScopeInfo keeps its context locals' names inline below this
	// count, in a hash table from it on (kScopeInfoMaxInlinedLocalNamesSize).
	inlinedLocalNames = 75
	readChunk         = 1 << 16 // bytes of a string read at once
)

// reader reads V8 objects of one process with a build's layout. Every
// pointer it follows was read from the process: each is checked to be a
// heap object of the type expected before its fields are trusted.
type reader struct {
	m   memory
	l   *layout
	max int // name bytes
}

func isHeap(v uint64) bool { return v&3 == 1 && v > 4096 }
func isSmi(v uint64) bool  { return v&1 == 0 }
func smi(v uint64) int64   { return int64(v) >> 32 }

func badf(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, runtimes.ErrBadFrame)...)
}

// word reads the 8-byte field at off of the heap object obj (tagged).
func (r *reader) word(obj uint64, off int64) (uint64, error) {
	if !isHeap(obj) {
		return 0, badf("%#x is no heap object", obj)
	}
	var b [8]byte
	if err := r.m.Read(obj-1+uint64(off), b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// typeOf is obj's instance type, through its map.
func (r *reader) typeOf(obj uint64) (int64, error) {
	mp, err := r.word(obj, r.l.mapOff)
	if err != nil {
		return 0, err
	}
	if !isHeap(mp) {
		return 0, badf("object %#x: map %#x", obj, mp)
	}
	var b [2]byte
	if err := r.m.Read(mp-1+uint64(r.l.instanceType), b[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint16(b[:])), nil
}

// units appends up to limit UTF-16 code units of the string obj to out.
func (r *reader) units(obj uint64, limit int, out []uint16, budget *int, depth int) ([]uint16, error) {
	for len(out) < limit {
		*budget--
		if *budget < 0 || depth > maxStringDepth {
			return out, fmt.Errorf("string %#x: too many parts: %w", obj, frame.ErrLimitExceeded)
		}
		t, err := r.typeOf(obj)
		if err != nil {
			return out, err
		}
		if t >= r.l.firstNonString {
			return out, badf("%#x: type %d is no string", obj, t)
		}
		lw, err := r.word(obj, r.l.strLength)
		if err != nil {
			return out, err
		}
		n := int(int32(uint32(lw)))
		if n < 0 || n > 1<<30 {
			return out, badf("string %#x of length %d", obj, n)
		}
		switch t & r.l.reprMask {
		case r.l.seqTag:
			n = min(n, limit-len(out))
			one := t&r.l.encodingMask == r.l.oneByteTag
			at, size := obj-1+uint64(r.l.seqTwoChars), 2
			if one {
				at, size = obj-1+uint64(r.l.seqOneChars), 1
			}
			// In chunks: a read of process memory is bounded
			// (runtimes.MaxRead), a script's source is not.
			b := make([]byte, min(n*size, readChunk))
			for done := 0; done < n; {
				k := min(n-done, len(b)/size)
				if err := r.m.Read(at+uint64(done*size), b[:k*size]); err != nil {
					return out, err
				}
				for i := 0; i < k; i++ {
					if one {
						out = append(out, uint16(b[i]))
					} else {
						out = append(out, binary.LittleEndian.Uint16(b[2*i:]))
					}
				}
				done += k
			}
			return out, nil
		case r.l.thinTag:
			if obj, err = r.word(obj, r.l.thinActual); err != nil {
				return out, err
			}
		case r.l.consTag:
			first, err := r.word(obj, r.l.consFirst)
			if err != nil {
				return out, err
			}
			if out, err = r.units(first, limit, out, budget, depth+1); err != nil {
				return out, err
			}
			if obj, err = r.word(obj, r.l.consSecond); err != nil {
				return out, err
			}
		case r.l.slicedTag:
			parent, err := r.word(obj, r.l.slicedParent)
			if err != nil {
				return out, err
			}
			ow, err := r.word(obj, r.l.slicedOffset)
			if err != nil {
				return out, err
			}
			off := smi(ow)
			if !isSmi(ow) || off < 0 || off > 1<<30 || int(off)+n > maxSourceUnits {
				return out, badf("sliced string %#x at %d", obj, off)
			}
			whole, err := r.units(parent, int(off)+n, nil, budget, depth+1)
			if err != nil {
				return out, err
			}
			if int(off) > len(whole) {
				return out, badf("sliced string %#x past its parent", obj)
			}
			whole = whole[off:]
			return append(out, whole[:min(len(whole), limit-len(out))]...), nil
		default:
			// External strings (node's own modules): their characters are
			// behind a C++ resource object V8's tables do not describe.
			return out, badf("string %#x: external or unknown representation %d", obj, t&r.l.reprMask)
		}
	}
	return out, nil
}

// str reads the string obj, cut at r.max bytes.
func (r *reader) str(obj uint64) (string, error) {
	budget := maxStringParts
	u, err := r.units(obj, r.max, nil, &budget, 0)
	if err != nil {
		return "", err
	}
	s := string(utf16.Decode(u))
	if len(s) > r.max {
		s = s[:r.max]
	}
	return s, nil
}

// fnInfo is what naming a function's frames needs, read once.
type fnInfo struct {
	name, file string
	bytecode   uint32  // the low bits of its BytecodeArray (0: none read)
	spt        []byte  // its source position table (nil: none built yet)
	lineEnds   []int32 // its script's line ends (nil: unknown)
}

func (f *fnInfo) cost() int64 {
	return int64(len(f.name)+len(f.file)+len(f.spt)+4*len(f.lineEnds)) + 96
}

// function reads the SharedFunctionInfo sfi: its name, script, bytecode
// and that bytecode's source positions. lines is the script's line ends,
// looked up by the Script's address (cached by the caller).
func (r *reader) function(sfi uint64, lines func(script uint64) ([]int32, error)) (*fnInfo, error) {
	t, err := r.typeOf(sfi)
	if err != nil {
		return nil, err
	}
	if t != r.l.typeSFI {
		return nil, badf("%#x: type %d, no SharedFunctionInfo (moved or freed)", sfi, t)
	}
	fi := &fnInfo{}
	if fi.name, err = r.functionName(sfi); err != nil {
		return nil, err
	}
	if ba, err := r.bytecodeOf(sfi); err == nil && ba != 0 {
		fi.bytecode = uint32(ba)
		fi.spt = r.positions(ba, r.l.bytecodeSPT)
	}
	script, err := r.word(sfi, r.l.sfiScript)
	if err != nil {
		return nil, err
	}
	if st, err := r.typeOf(script); err == nil && st == r.l.typeScript {
		if nm, err := r.word(script, r.l.scriptName); err == nil {
			fi.file, _ = r.str(nm) // undefined for eval: no file
		}
		if lines != nil {
			fi.lineEnds, _ = lines(script)
		}
	}
	return fi, nil
}

// functionName is the SFI's name: a String, or kept in its ScopeInfo
// once compiled (the function's own name, else the name V8 inferred from
// the assignment, as in Module.prototype.load = function ...).
func (r *reader) functionName(sfi uint64) (string, error) {
	v, err := r.word(sfi, r.l.sfiName)
	if err != nil {
		return "", err
	}
	t, err := r.typeOf(v)
	if err != nil {
		return "", err
	}
	if t < r.l.firstNonString {
		return anonymous(r.str(v))
	}
	if t != r.l.typeScopeInfo {
		// V8 keeps a String or a ScopeInfo there (a Smi when anonymous,
		// which typeOf refuses). Anything else is memory freed since the
		// sample: the function died (a module's local function once the
		// module has run) and a full GC swept it, leaving the SFI's bytes
		// behind a free-space header.
		return "", badf("sfi %#x: name %#x of type %d (the function was collected)", sfi, v, t)
	}
	// ScopeInfo: flags, parameter count, context local count, then the
	// locals' names and infos, then the function's name and its slot,
	// then the inferred name.
	cw, err := r.word(v, 8*r.l.scopeLocals)
	if err != nil {
		return "", err
	}
	n := smi(cw)
	if !isSmi(cw) || n < 0 || n > maxContextLocal {
		return "", badf("scope info %#x: %d context locals", v, n)
	}
	idx := r.l.scopeFirst + 2*n
	if n >= inlinedLocalNames {
		idx = r.l.scopeFirst + 1 + n
	}
	for _, i := range []int64{idx, idx + 2} {
		w, err := r.word(v, i*8)
		if err != nil || !isHeap(w) {
			continue
		}
		if wt, err := r.typeOf(w); err != nil || wt >= r.l.firstNonString {
			continue
		}
		if s, err := r.str(w); err == nil && s != "" {
			return s, nil
		}
	}
	return "<anonymous>", nil
}

func anonymous(s string, err error) (string, error) {
	if err == nil && s == "" {
		s = "<anonymous>"
	}
	return s, err
}

// bytecodeOf is the SFI's BytecodeArray, directly or through its
// baseline code; 0 when it has none (not compiled, flushed).
func (r *reader) bytecodeOf(sfi uint64) (uint64, error) {
	d, err := r.word(sfi, r.l.sfiData)
	if err != nil || !isHeap(d) {
		return 0, err
	}
	t, err := r.typeOf(d)
	if err != nil {
		return 0, err
	}
	if t == r.l.typeCode && r.l.jit {
		if d, err = r.word(d, r.l.codeBytecode); err != nil || !isHeap(d) {
			return 0, err
		}
		if t, err = r.typeOf(d); err != nil {
			return 0, err
		}
	}
	if t != r.l.typeBytecode {
		return 0, nil
	}
	return d, nil
}

// positions copies the source position table in field off of obj (a
// BytecodeArray or a Code); nil when V8 has not built it (it does so
// lazily for bytecode) or it is unreadable.
func (r *reader) positions(obj uint64, off int64) []byte {
	spt, err := r.word(obj, off)
	if err != nil || !isHeap(spt) {
		return nil
	}
	lw, err := r.word(spt, r.l.arrayLength)
	if err != nil || !isSmi(lw) || smi(lw) <= 0 || smi(lw) > maxSPTBytes {
		return nil
	}
	b := make([]byte, smi(lw))
	if r.m.Read(spt-1+uint64(r.l.arrayData), b) != nil {
		return nil
	}
	return b
}

// lineEnds is the offsets of the line ends of the Script script: V8's
// own table when it built one, else counted in the source.
func (r *reader) lineEnds(script uint64) ([]int32, error) {
	le, err := r.word(script, r.l.scriptLineEnds)
	if err != nil {
		return nil, err
	}
	if t, err := r.typeOf(le); err == nil && t == r.l.typeFixedArray {
		lw, err := r.word(le, r.l.arrayLength)
		if err != nil {
			return nil, err
		}
		n := smi(lw)
		if !isSmi(lw) || n < 0 || n > maxLineEnds {
			return nil, badf("line ends %#x of length %d", le, n)
		}
		b := make([]byte, 8*n)
		if err := r.m.Read(le-1+uint64(r.l.arrayData), b); err != nil {
			return nil, err
		}
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(smi(binary.LittleEndian.Uint64(b[8*i:])))
		}
		return out, nil
	}
	src, err := r.word(script, r.l.scriptSource)
	if err != nil {
		return nil, err
	}
	budget := maxStringParts
	u, err := r.units(src, maxSourceUnits, nil, &budget, 0)
	if err != nil {
		return nil, err
	}
	var out []int32
	for i, c := range u {
		if c == '\n' && len(out) < maxLineEnds {
			out = append(out, int32(i))
		}
	}
	return append(out, int32(len(u))), nil
}

// lineCol turns a script offset into a 1-based line and column.
func lineCol(ends []int32, pos int64) (line, col uint32) {
	if pos < 0 || len(ends) == 0 {
		return 0, 0
	}
	i := sort.Search(len(ends), func(i int) bool { return int64(ends[i]) >= pos })
	if i == len(ends) {
		return 0, 0
	}
	start := int64(0)
	if i > 0 {
		start = int64(ends[i-1]) + 1
	}
	return uint32(i + 1), uint32(pos-start) + 1
}

// sourcePosition is the script offset of code offset off by the source
// position table spt; -1 when none.
func sourcePosition(spt []byte, off int64) int64 {
	raw := positionAt(spt, off)
	if raw < 0 {
		return -1
	}
	return scriptOffset(raw)
}

// positionAt decodes V8's source position table (delta-coded entries of
// zigzag varints: the code offset, negative for an expression position,
// then the position) and returns the raw SourcePosition of the last entry
// at or before code offset off; -1 when none.
func positionAt(spt []byte, off int64) int64 {
	var code, pos, best int64 = 0, 0, -1
	for i := 0; i < len(spt); {
		d, n := zigzag(spt[i:])
		if n == 0 {
			break
		}
		i += n
		p, m := zigzag(spt[i:])
		if m == 0 {
			break
		}
		i += m
		if d < 0 {
			d = -d - 1
		}
		code += d
		pos += p
		if code > off {
			break
		}
		best = pos
	}
	return best
}

// zigzag decodes one varint (7 bits a byte, least significant first) as
// a zigzag-coded signed value; n is 0 for a truncated one.
func zigzag(b []byte) (v int64, n int) {
	var u uint64
	for shift := uint(0); n < len(b) && n < 10; shift += 7 {
		c := b[n]
		n++
		u |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return int64(u>>1) ^ -int64(u&1), n
		}
	}
	return 0, 0
}
