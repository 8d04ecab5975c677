package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// memory is a process's memory (runtimes.Mem; a fake one in fuzz tests).
// What it returns is whatever the process put there.
type memory interface {
	Read(addr uint64, p []byte) error
	U64(addr uint64) (uint64, error)
}

// Frame kinds the walker records (bpf/ruby.h).
const (
	KindIseq  = uint8(bpf.ProfileRubyFrameKindFRAME_RUBY_ISEQ)
	KindCFunc = uint8(bpf.ProfileRubyFrameKindFRAME_RUBY_CFUNC)
)

// An iseq frame's aux (RUBY_IDX_SHIFT in bpf/ruby.h).
const (
	idxShift   = 47
	addrMask   = 1<<idxShift - 1
	idxUnknown = 1<<(64-idxShift) - 1
)

// Object type tags and flags (ruby/internal/value_type.h, fl_type.h,
// internal/imemo.h).
const (
	tMask       = 0x1f
	tClass      = 0x02
	tModule     = 0x03
	tString     = 0x05
	tArray      = 0x07
	tIClass     = 0x1c
	tImemo      = 0x1a
	imemoShift  = 12
	imemoMask   = 0xf
	imemoMent   = 6
	imemoIseq   = 7
	flNoEmbed   = 1 << 13 // RSTRING_NOEMBED, RARRAY_EMBED_FLAG's place
	flSingleton = 1 << 12 // FL_SINGLETON (FL_USER0) of a class
)

// iseq types (enum rb_iseq_type).
const (
	iseqTop    = 0
	iseqMethod = 1
	iseqBlock  = 2
	iseqClass  = 3
	iseqMain   = 7
)

// Bounds of what one frame's naming reads.
const (
	maxLineEntries = 1 << 20 // line table entries of one iseq
	maxClassIvars  = 16      // class instance variables looked at (3.1)
	maxNesting     = 8       // "Outer::Inner" parts
)

// iseqInfo is what naming one iseq frame needs.
type iseqInfo struct {
	name, file string
	first      uint32
	line       uint32
	id         ident // of the object named
}

// ident tells an object apart from another that took its slot after a
// free (Ruby's objects carry no id of their own): the pointers it holds to
// memory of its own. An iseq's body, instruction array, label and path; a
// method entry's definition, owner and method id.
type ident [4]uint64

// identOf reads the ident of the object of a frame of kind at ptr (its
// flags word in the same read); false when it is no longer such an object.
func identOf(m memory, l *layout, kind uint8, ptr uint64) (ident, bool) {
	if ptr == 0 || ptr&7 != 0 {
		return ident{}, false
	}
	if kind == KindCFunc {
		b := make([]byte, max(l.meDef, l.meOwner, meCalledID)+8)
		if m.Read(ptr, b) != nil || !imemoOf(le64(b, 0), imemoMent) {
			return ident{}, false
		}
		return ident{le64(b, l.meDef), le64(b, l.meOwner), le64(b, meCalledID)}, true
	}
	h := make([]byte, l.iseqBody+8)
	if m.Read(ptr, h) != nil || !imemoOf(le64(h, 0), imemoIseq) {
		return ident{}, false
	}
	body := le64(h, l.iseqBody)
	b := make([]byte, max(l.bodyEncoded, l.bodyLocation+16)+8)
	if m.Read(body, b) != nil {
		return ident{}, false
	}
	return iseqIdent(l, body, b), true
}

// iseqIdent is the ident of the iseq whose body at addr holds b.
func iseqIdent(l *layout, body uint64, b []byte) ident {
	return ident{body, le64(b, l.bodyEncoded), le64(b, l.bodyLocation+16), le64(b, l.bodyLocation)}
}

func (f *iseqInfo) cost() int64 { return int64(len(f.name)+len(f.file)) + 64 }

func le64(b []byte, off uint16) uint64 {
	if int(off)+8 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func le32(b []byte, off uint16) uint32 {
	if int(off)+4 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint32(b[off:])
}

// isImemo reports whether the object at addr is an internal object of
// type typ (an iseq, a method entry) and returns its flags.
func isImemo(m memory, addr uint64, typ uint64) bool {
	if addr == 0 || addr&7 != 0 {
		return false
	}
	fl, err := m.U64(addr)
	return err == nil && imemoOf(fl, typ)
}

// imemoOf reports whether flags are those of an internal object of type
// typ.
func imemoOf(fl, typ uint64) bool { return fl&tMask == tImemo && fl>>imemoShift&imemoMask == typ }

// bodyRead is how much of an iseq body naming reads.
func (l *layout) bodyRead() int {
	return int(max(l.bodyLocation+32, l.bodySucc+8, l.bodyInsnSize+4, l.bodyInsnInfo+8))
}

// readIseq names the iseq frame (iseq, aux) of a process: "Class#method",
// "block in Class#method", "<main>", its file and the line of the
// instruction the walker recorded. An iseq or method entry that is no
// longer one, or an index outside the iseq, is ErrBadFrame.
func readIseq(m memory, l *layout, iseq, aux uint64, maxName int) (*iseqInfo, error) {
	if !isImemo(m, iseq, imemoIseq) {
		return nil, fmt.Errorf("iseq %#x is no iseq: %w", iseq, runtimes.ErrBadFrame)
	}
	body, err := m.U64(iseq + uint64(l.iseqBody))
	if err != nil {
		return nil, err
	}
	b := make([]byte, l.bodyRead())
	if err := m.Read(body, b); err != nil {
		return nil, fmt.Errorf("iseq body %#x: %w", body, err)
	}
	typ := le32(b, l.bodyType)
	size := uint64(le32(b, l.bodySize))
	idx := aux >> idxShift
	if idx != idxUnknown && idx >= size {
		return nil, fmt.Errorf("iseq %#x: instruction %d of %d: %w", iseq, idx, size, runtimes.ErrBadFrame)
	}
	loc := l.bodyLocation
	label, err := readString(m, l, le64(b, loc+16), maxName)
	if err != nil {
		return nil, fmt.Errorf("iseq %#x label: %w", iseq, err)
	}
	baseLabel, err := readString(m, l, le64(b, loc+8), maxName)
	if err != nil {
		return nil, fmt.Errorf("iseq %#x base label: %w", iseq, err)
	}
	file, err := readPath(m, l, le64(b, loc), maxName)
	if err != nil {
		return nil, fmt.Errorf("iseq %#x path: %w", iseq, err)
	}
	fi := &iseqInfo{name: label, file: file, id: iseqIdent(l, body, b)}
	if fl := le64(b, loc+24); fl&1 == 1 && int64(fl)>>1 > 0 && int64(fl)>>1 < 1<<31 {
		fi.first = uint32(int64(fl) >> 1) // a Fixnum
	}
	// Methods and the blocks in them are named with their class, as
	// Ruby 3.4 prints them: the method entry is the method's.
	if me := aux & addrMask; (typ == iseqMethod || typ == iseqBlock) && me != 0 && isImemo(m, me, imemoMent) {
		if q := qualifier(m, l, me, maxName); q != "" && strings.HasSuffix(label, baseLabel) {
			fi.name = truncate(label[:len(label)-len(baseLabel)]+q+baseLabel, maxName)
		}
	}
	if idx != idxUnknown {
		if line, err := lineAt(m, l, b, idx); err == nil {
			fi.line = line
		}
	}
	return fi, nil
}

// qualifier is "Class#" or "Class." for the method entry me (its owner; a
// singleton class's object), "" when the class has no name.
func qualifier(m memory, l *layout, me uint64, maxName int) string {
	owner, err := m.U64(me + uint64(l.meOwner))
	if err != nil {
		return ""
	}
	fl, err := m.U64(owner)
	if err != nil {
		return ""
	}
	if t := fl & tMask; t != tClass && t != tModule && t != tIClass {
		return ""
	}
	if fl&flSingleton != 0 {
		if obj := attached(m, l, owner); obj != 0 {
			if n := className(m, l, obj, maxName); n != "" {
				return n + "."
			}
		}
		return ""
	}
	if n := className(m, l, owner, maxName); n != "" {
		return n + "#"
	}
	return ""
}

// constPathRE is what a class path looks like.
var constPathRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9_]*(::[A-Z][A-Za-z0-9_]*)*$`)

// className is the path of the class or module at klass ("Chain",
// "Net::HTTP"), "" when it has none or it cannot be read.
func className(m memory, l *layout, klass uint64, maxName int) string {
	if l.classExtInline {
		s, err := readString(m, l, mustU64(m, klass+uint64(l.classExt)+uint64(l.extClasspath)), maxName)
		if err != nil || !constPathRE.MatchString(s) {
			return ""
		}
		return s
	}
	for _, rec := range ivars(m, l, klass) {
		if s, err := readString(m, l, rec, maxName); err == nil && constPathRE.MatchString(s) {
			return s // __classpath__, the first one a named class gets
		}
	}
	return ""
}

// attached is the object a singleton class is the class of (a class for
// "Class.method"), 0 when unknown.
func attached(m memory, l *layout, klass uint64) uint64 {
	if l.classExtInline {
		return mustU64(m, klass+uint64(l.classExt)+uint64(l.extAttached))
	}
	for _, rec := range ivars(m, l, klass) { // __attached__
		if fl, err := m.U64(rec); err == nil && rec&7 == 0 && (fl&tMask == tClass || fl&tMask == tModule) {
			return rec
		}
	}
	return 0
}

// ivars are the values of a class's first instance variables (3.1: its
// ext's iv_tbl, an st_table of {hash, key, record} entries).
func ivars(m memory, l *layout, klass uint64) []uint64 {
	ext := mustU64(m, klass+uint64(l.classExt))
	tbl := mustU64(m, ext+uint64(l.extIvTbl))
	if tbl == 0 {
		return nil
	}
	var hdr [56]byte
	if m.Read(tbl, hdr[:]) != nil {
		return nil
	}
	n := min(le64(hdr[:], 40), maxClassIvars) // entries_bound
	entries := le64(hdr[:], 48)
	if n == 0 || entries == 0 {
		return nil
	}
	buf := make([]byte, 24*n)
	if m.Read(entries, buf) != nil {
		return nil
	}
	out := make([]uint64, 0, n)
	for i := range n {
		out = append(out, binary.LittleEndian.Uint64(buf[24*i+16:]))
	}
	return out
}

func mustU64(m memory, addr uint64) uint64 {
	if addr == 0 {
		return 0
	}
	v, err := m.U64(addr)
	if err != nil {
		return 0
	}
	return v
}

// lineAt is the line of instruction idx of the iseq whose body is b: its
// line table's entry found through the succinct bit vector Ruby keeps
// (iseq.c succ_index_lookup; the positions array is freed once built).
func lineAt(m memory, l *layout, b []byte, idx uint64) (uint32, error) {
	n := uint64(le32(b, l.bodyInsnSize))
	entries := le64(b, l.bodyInsnInfo)
	if n == 0 || entries == 0 {
		return 0, errors.New("no line table")
	}
	if n > maxLineEntries {
		return 0, fmt.Errorf("%d line entries: %w", n, frame.ErrLimitExceeded)
	}
	var i uint64
	if n > 1 {
		// The pc points past the instruction running (or called from).
		if idx > 0 {
			idx--
		}
		succ := le64(b, l.bodySucc)
		if succ == 0 {
			return 0, errors.New("no line index")
		}
		rank, err := succLookup(m, l, succ, idx)
		if err != nil {
			return 0, err
		}
		if rank == 0 || uint64(rank) > n {
			return 0, fmt.Errorf("line index %d of %d", rank, n)
		}
		i = uint64(rank) - 1
	}
	var e [4]byte
	if err := m.Read(entries+i*uint64(l.insnEntry), e[:]); err != nil {
		return 0, err
	}
	line := binary.LittleEndian.Uint32(e[:])
	if int32(line) <= 0 {
		return 0, fmt.Errorf("line %d", int32(line))
	}
	return line, nil
}

// succLookup is the number of line table entries that start at or before
// instruction x (a rank in Ruby's succinct bit vector).
func succLookup(m memory, l *layout, tbl, x uint64) (uint32, error) {
	imm := uint64(l.succImmediate)
	if x < imm {
		v, err := m.U64(tbl + x/9*8)
		if err != nil {
			return 0, err
		}
		return uint32(v>>(x%9*7)) & 0x7f, nil
	}
	blk := (x - imm) / 512
	bit := (x - imm) % 512
	small := bit / 64
	base := tbl + uint64(l.succPart) + blk*uint64(l.succBlock)
	buf := make([]byte, l.succBlock)
	if err := m.Read(base, buf); err != nil {
		return 0, err
	}
	rank := le32(buf, 0)
	ranks := le64(buf, l.succBlockRanks)
	var sp uint32
	if small > 0 {
		sp = uint32(ranks>>((small-1)*9)) & 0x1ff
	}
	word := le64(buf, l.succBlockBits+uint16(small*8))
	return rank + sp + uint32(bits.OnesCount64(word<<(63-bit%64))), nil
}

// readPath is the file of an iseq's pathobj: a String, or an Array of
// the path and the real path (the real path preferred).
func readPath(m memory, l *layout, obj uint64, maxName int) (string, error) {
	fl, err := m.U64(obj)
	if err != nil {
		return "", err
	}
	switch fl & tMask {
	case tString:
		return readString(m, l, obj, maxName)
	case tArray:
		var ptr uint64
		if fl&flNoEmbed != 0 { // RARRAY_EMBED_FLAG: embedded
			ptr = obj + 16
		} else if ptr, err = m.U64(obj + 32); err != nil {
			return "", err
		}
		var two [16]byte
		if err := m.Read(ptr, two[:]); err != nil {
			return "", err
		}
		if s, err := readString(m, l, binary.LittleEndian.Uint64(two[8:]), maxName); err == nil && s != "" {
			return s, nil
		}
		return readString(m, l, binary.LittleEndian.Uint64(two[:]), maxName)
	}
	return "", fmt.Errorf("path object %#x of type %#x: %w", obj, fl&tMask, runtimes.ErrBadFrame)
}

// readString reads the RString at obj, cut at maxName bytes.
func readString(m memory, l *layout, obj uint64, maxName int) (string, error) {
	if obj == 0 || obj&7 != 0 {
		return "", fmt.Errorf("string %#x: %w", obj, runtimes.ErrBadFrame)
	}
	var hdr [32]byte
	if err := m.Read(obj, hdr[:]); err != nil {
		return "", err
	}
	fl := le64(hdr[:], 0)
	if fl&tMask != tString {
		return "", fmt.Errorf("object %#x of type %#x is no string: %w", obj, fl&tMask, runtimes.ErrBadFrame)
	}
	var n, ptr uint64
	switch {
	case fl&flNoEmbed != 0:
		n, ptr = le64(hdr[:], 16), le64(hdr[:], 24)
	case l.strEmbedLenInFlags:
		n, ptr = fl>>14&0x1f, obj+uint64(l.strEmbed)
	default:
		n, ptr = le64(hdr[:], 16), obj+uint64(l.strEmbed)
	}
	if n > 1<<30 {
		return "", fmt.Errorf("string %#x of %d bytes: %w", obj, n, runtimes.ErrBadFrame)
	}
	cut := min(n, uint64(maxName))
	buf := make([]byte, cut)
	if err := m.Read(ptr, buf); err != nil {
		return "", err
	}
	return truncate(string(buf), maxName), nil
}

// truncate cuts s at maxName bytes, on a rune boundary, and makes it
// valid UTF-8.
func truncate(s string, maxName int) string {
	if len(s) > maxName {
		s = s[:maxName]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// readCFunc names the C function frame of method entry me:
// "Class#name" (the name from the global symbol table at symbols), or
// "Class#<cfunc>" when the table was not found.
func readCFunc(m memory, l *layout, me, symbols uint64, maxName int) (string, error) {
	if !isImemo(m, me, imemoMent) {
		return "", fmt.Errorf("method entry %#x is no method entry: %w", me, runtimes.ErrBadFrame)
	}
	q := qualifier(m, l, me, maxName)
	if q == "" {
		q = "?#"
	}
	name := "<cfunc>"
	if id, err := m.U64(me + meCalledID); err == nil {
		if n, err := idName(m, l, symbols, id, maxName); err == nil && n != "" {
			name = n
		}
	}
	return truncate(q+name, maxName), nil
}
