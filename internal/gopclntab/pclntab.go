// Package gopclntab resolves addresses in Go binaries through the runtime's
// own symbol table, .gopclntab, which survives `go build -ldflags='-s -w'`
// (no DWARF, no .symtab). It returns the function, file:line and the inline
// tree at a pc, so calls the compiler inlined come back as separate frames.
//
// The parser works on plain byte slices (see Parse) so that it can be fuzzed;
// New wires it to an ELF file, finding runtime.moduledata to learn the
// addresses a stripped binary no longer names (text start, go:func.*).
//
// Supported table versions: Go 1.16–1.17 (magic 0xfffffffa), 1.18–1.19
// (0xfffffff0) and 1.20 onwards (0xfffffff1), either byte order, 4- or 8-byte
// pointers. Go 1.2–1.15 tables (0xfffffffb) are reported as no debug info.
package gopclntab

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/frame"
)

// Table versions, named after the first Go release that wrote them.
const (
	ver116 = 116
	ver118 = 118
	ver120 = 120
)

const (
	magic116 = 0xfffffffa
	magic118 = 0xfffffff0
	magic120 = 0xfffffff1
	magic12  = 0xfffffffb
)

// Indexes of the tables that carry the inline tree (internal/abi).
const (
	pcdataInlTreeIndex = 2
	funcdataInlTree    = 3
)

// Limits that keep hostile input from costing unbounded time.
const (
	maxInlineDepth = 256     // a real inline chain is a handful of frames
	maxPCSteps     = 1 << 20 // pc-value entries decoded for one lookup
	maxStringLen   = 1 << 16 // function and file names
)

var errCorrupt = fmt.Errorf("gopclntab: %w", frame.ErrCorruptFile)

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errCorrupt}, args...)...)
}

// Image is what the parser needs from a program: the .gopclntab bytes plus,
// for inline trees, the read-only data that holds the funcdata.
type Image struct {
	// Pclntab is the table, starting at its header.
	Pclntab []byte
	// TextStart is runtime.text, the base of function entry offsets. Zero
	// means the header's textStart (Go 1.18–1.25; Go 1.26 writes zero there,
	// so a caller must supply it for those binaries).
	TextStart uint64
	// GoFunc is runtime.moduledata.gofunc (the go:func.* symbol), the base of
	// Go 1.18+ funcdata offsets. Zero disables inline frames for those.
	GoFunc uint64
	// Data holds the program image from virtual address DataAddr; it must
	// cover the funcdata (inline trees) for inline frames to resolve.
	Data     []byte
	DataAddr uint64
}

// Table is a parsed .gopclntab. It is safe for concurrent use.
type Table struct {
	version   int
	big       bool
	ptrSize   int
	quantum   uint64 // pc step unit (minLC)
	nfunc     int
	textStart uint64
	gofunc    uint64
	data      []byte
	dataAddr  uint64

	funcnametab []byte
	cutab       []byte
	filetab     []byte
	pctab       []byte
	pclntable   []byte
	ftabSize    int // bytes per functab entry
	funcSize    int // fixed bytes of a _func
	inlSize     int // bytes per inlinedCall

	whole []byte    // the table from its header
	offs  [5]uint64 // header offsets of funcnametab, cutab, filetab, pctab, pclntable

	mu    sync.RWMutex
	names map[uint32]string // funcnametab offset -> name
	files map[uint32]string // filetab offset -> path

	cacheOnce  sync.Once
	cache      []cacheSet // sized to the function count, at most cacheSets
	cacheBytes atomic.Int64
	nameBytes  int64 // bytes of interned strings, under mu
}

// Parse validates the header of img.Pclntab and returns a Table over it. It
// copies nothing: the slices must stay valid while the Table is used.
func Parse(img Image) (*Table, error) {
	b := img.Pclntab
	if len(b) < 8 {
		return nil, corrupt("table of %d bytes", len(b))
	}
	t := &Table{gofunc: img.GoFunc, data: img.Data, dataAddr: img.DataAddr}
	le := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
	be := uint32(b[3]) | uint32(b[2])<<8 | uint32(b[1])<<16 | uint32(b[0])<<24
	// The magics are not byte-swap symmetric, so the one that matches
	// tells the byte order.
	switch {
	case le == magic116 || le == magic118 || le == magic120:
		t.version = versionOf(le)
	case be == magic116 || be == magic118 || be == magic120:
		t.version, t.big = versionOf(be), true
	case le == magic12 || be == magic12:
		return nil, fmt.Errorf("gopclntab: Go 1.2–1.15 table format is not supported: %w", frame.ErrNoDebugInfo)
	default:
		return nil, corrupt("bad magic %#x", le)
	}
	if b[4] != 0 || b[5] != 0 {
		return nil, corrupt("bad header padding")
	}
	switch b[6] {
	case 1, 2, 4:
		t.quantum = uint64(b[6])
	default:
		return nil, corrupt("bad pc quantum %d", b[6])
	}
	t.ptrSize = int(b[7])
	if t.ptrSize != 4 && t.ptrSize != 8 {
		return nil, corrupt("bad pointer size %d", b[7])
	}
	nwords := 8 // nfunc, nfiles, textStart, 5 offsets
	if t.version == ver116 {
		nwords = 7 // no textStart
	}
	hdr := 8 + nwords*t.ptrSize
	if len(b) < hdr {
		return nil, corrupt("short header")
	}
	w := func(i int) uint64 { return t.word(b[8+i*t.ptrSize:]) }
	nfunc := w(0)
	first := 2 // word index of funcnameOffset
	if t.version != ver116 {
		t.textStart = w(2)
		if img.TextStart != 0 {
			t.textStart = img.TextStart
		}
		first = 3
	}
	var off [5]uint64
	for i := range off {
		off[i] = w(first + i)
		if off[i] < uint64(hdr) || off[i] > uint64(len(b)) {
			return nil, corrupt("header offset %d (%#x) outside table of %d bytes", i, off[i], len(b))
		}
	}
	t.whole, t.offs = b, off
	// Each table ends where the next starts when the linker's usual order
	// holds; trimming makes stray offsets fail bounds checks sooner.
	tabs := [5]*[]byte{&t.funcnametab, &t.cutab, &t.filetab, &t.pctab, &t.pclntable}
	for i, p := range tabs {
		*p = b[off[i]:]
		if i < 4 && off[i] <= off[i+1] {
			*p = (*p)[:off[i+1]-off[i]]
		}
	}
	switch t.version {
	case ver116:
		t.ftabSize, t.funcSize, t.inlSize = 2*t.ptrSize, t.ptrSize+36, 20
	case ver118:
		t.ftabSize, t.funcSize, t.inlSize = 8, 40, 20
	default:
		t.ftabSize, t.funcSize, t.inlSize = 8, 44, 16
	}
	// functab has nfunc entries plus an end sentinel.
	if entries := uint64(len(t.pclntable) / t.ftabSize); nfunc == 0 || entries == 0 || nfunc > entries-1 {
		return nil, corrupt("%d functions do not fit the function table", nfunc)
	}
	t.nfunc = int(nfunc)
	// Entries must ascend; checking the ends catches most garbage cheaply,
	// and lookups check the pair they land on.
	if t.entry(0) > t.entry(t.nfunc) {
		return nil, corrupt("function table not sorted")
	}
	t.names = map[uint32]string{}
	t.files = map[uint32]string{}
	return t, nil
}

func versionOf(magic uint32) int {
	switch magic {
	case magic116:
		return ver116
	case magic118:
		return ver118
	}
	return ver120
}

func (t *Table) u32(b []byte) uint32 {
	_ = b[3]
	if t.big {
		return uint32(b[3]) | uint32(b[2])<<8 | uint32(b[1])<<16 | uint32(b[0])<<24
	}
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func (t *Table) word(b []byte) uint64 {
	if t.ptrSize == 4 {
		return uint64(t.u32(b))
	}
	_ = b[7]
	lo, hi := t.u32(b), t.u32(b[4:])
	if t.big {
		lo, hi = hi, lo
	}
	return uint64(lo) | uint64(hi)<<32
}

// u32at reads a uint32 at off in b, reporting false when out of range.
func (t *Table) u32at(b []byte, off uint64) (uint32, bool) {
	if off > uint64(len(b)) || uint64(len(b))-off < 4 {
		return 0, false
	}
	return t.u32(b[off:]), true
}

// entry returns the address of functab entry i; i <= nfunc is checked by
// Parse's sizing.
func (t *Table) entry(i int) uint64 {
	e := t.pclntable[i*t.ftabSize:]
	if t.version == ver116 {
		return t.word(e)
	}
	return t.textStart + uint64(t.u32(e))
}

func (t *Table) funcOff(i int) uint64 {
	e := t.pclntable[i*t.ftabSize:]
	if t.version == ver116 {
		return t.word(e[t.ptrSize:])
	}
	return uint64(t.u32(e[4:]))
}

// NumFuncs is the number of functions in the table.
func (t *Table) NumFuncs() int { return t.nfunc }

// TextRange is the [start, end) address range the function table covers.
func (t *Table) TextRange() (uint64, uint64) { return t.entry(0), t.entry(t.nfunc) }

// SizeBytes estimates the heap the Table holds: interned names and the
// decoded-table cache. The table and data bytes it aliases are not counted:
// they belong to the caller (for New, the elfx.File's mapping).
func (t *Table) SizeBytes() int64 {
	t.mu.RLock()
	n := t.nameBytes + int64(len(t.names)+len(t.files))*48
	t.mu.RUnlock()
	return n + t.cacheBytes.Load()
}

// GoVersionMin returns the oldest Go release that writes this table format
// ("go1.16", "go1.18" or "go1.20"); the exact version lives in buildinfo.
func (t *Table) GoVersionMin() string {
	return fmt.Sprintf("go1.%d", t.version-100)
}

// fn is the decoded fixed part of one _func.
type fn struct {
	idx       int
	entry     uint64
	end       uint64
	nameOff   uint32
	pcfile    uint32
	pcln      uint32
	cuOffset  uint32
	startLine int32
	pcsp      uint32
	flag      uint8
	inlPC     uint32 // pcdata offset of the inline index table, 0 if none
	inlTree   uint64 // address of the inline tree, 0 if none
}

// find returns the functab index covering pc, or -1.
func (t *Table) find(pc uint64) int {
	if pc < t.entry(0) || pc >= t.entry(t.nfunc) {
		return -1
	}
	lo, hi := 0, t.nfunc // entry(lo) <= pc < entry(hi)
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if t.entry(m) <= pc {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// decodeFunc reads the _func of functab entry i.
func (t *Table) decodeFunc(i int) (fn, error) {
	f := fn{idx: i, entry: t.entry(i), end: t.entry(i + 1)}
	if f.end < f.entry {
		return f, corrupt("function table not sorted at %d", i)
	}
	off := t.funcOff(i)
	if off > uint64(len(t.pclntable)) || uint64(len(t.pclntable))-off < uint64(t.funcSize) {
		return f, corrupt("function %d record at %#x outside table", i, off)
	}
	b := t.pclntable[off:]
	var p int // offset of the fields after entry
	if t.version == ver116 {
		if t.word(b) != f.entry {
			return f, corrupt("function %d entry mismatch", i)
		}
		p = t.ptrSize
	} else {
		if t.textStart+uint64(t.u32(b)) != f.entry {
			return f, corrupt("function %d entry mismatch", i)
		}
		p = 4
	}
	f.nameOff = t.u32(b[p:])
	f.pcsp = t.u32(b[p+12:])
	f.pcfile = t.u32(b[p+16:])
	f.pcln = t.u32(b[p+20:])
	npcdata := uint64(t.u32(b[p+24:]))
	f.cuOffset = t.u32(b[p+28:])
	if t.version == ver120 {
		f.startLine = int32(t.u32(b[p+32:]))
	}
	f.flag = b[t.funcSize-3] // Go 1.16 wrote padding here, so 0
	nfuncdata := uint64(b[t.funcSize-1])
	pcdata := uint64(t.funcSize)
	if npcdata > 1<<16 || uint64(len(b))-pcdata < npcdata*4 {
		return f, corrupt("function %d pcdata outside table", i)
	}
	if npcdata > pcdataInlTreeIndex {
		f.inlPC = t.u32(b[pcdata+pcdataInlTreeIndex*4:])
	}
	if nfuncdata <= funcdataInlTree || f.inlPC == 0 {
		f.inlPC = 0
		return f, nil
	}
	fd := pcdata + npcdata*4
	if t.version == ver116 {
		// Go 1.16/1.17 funcdata are pointer-aligned absolute addresses.
		fd = (fd + uint64(t.ptrSize) - 1) &^ uint64(t.ptrSize-1)
		if uint64(len(b)) < fd || (uint64(len(b))-fd)/uint64(t.ptrSize) < nfuncdata {
			return f, corrupt("function %d funcdata outside table", i)
		}
		f.inlTree = t.word(b[fd+funcdataInlTree*uint64(t.ptrSize):])
	} else {
		if uint64(len(b))-fd < nfuncdata*4 {
			return f, corrupt("function %d funcdata outside table", i)
		}
		o := t.u32(b[fd+funcdataInlTree*4:])
		if o != ^uint32(0) && t.gofunc != 0 {
			f.inlTree = t.gofunc + uint64(o)
		}
	}
	if f.inlTree == 0 {
		f.inlPC = 0
	}
	return f, nil
}

// errNotCovered reports a pc past the end of a function's pc-value table:
// alignment padding between functions, which no source line covers.
var errNotCovered = errors.New("pc not covered")

// pcvalue returns the value of the pc-value table at tab for pc within f,
// and the first pc past the run holding that value. A zero tab means no
// table (value -1).
func (t *Table) pcvalue(f *fn, tab uint32, pc uint64) (int32, uint64, error) {
	if tab == 0 {
		return -1, f.end, nil
	}
	if uint64(tab) >= uint64(len(t.pctab)) {
		return 0, 0, corrupt("pc-value table offset %#x outside table", tab)
	}
	p := t.pctab[tab:]
	val := int32(-1)
	cur := f.entry
	for n := 0; n < maxPCSteps; n++ {
		uv, k := uvarint(p)
		if k <= 0 {
			return 0, 0, corrupt("truncated pc-value table at %#x", tab)
		}
		if uv == 0 && n > 0 {
			return 0, 0, errNotCovered
		}
		p = p[k:]
		val += int32(-(uv & 1) ^ (uv >> 1))
		pd, k := uvarint(p)
		if k <= 0 {
			return 0, 0, corrupt("truncated pc-value table at %#x", tab)
		}
		p = p[k:]
		cur += uint64(pd) * t.quantum
		if pc < cur {
			return val, cur, nil
		}
		if cur >= f.end {
			// Past the function: the table cannot be describing pc.
			return 0, 0, errNotCovered
		}
	}
	return 0, 0, corrupt("pc-value table at %#x too long", tab)
}

// uvarint decodes a little-endian base-128 uint32 of at most 5 bytes. It
// returns k <= 0 on truncation or overlong encodings.
func uvarint(p []byte) (uint32, int) {
	if len(p) > 0 && p[0] < 0x80 {
		return uint32(p[0]), 1
	}
	var v uint32
	for i := 0; i < 5 && i < len(p); i++ {
		b := p[i]
		v |= uint32(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, i + 1
		}
	}
	return 0, -1
}

// cstring returns the NUL-terminated string at off in b.
func cstring(b []byte, off uint64) ([]byte, bool) {
	if off >= uint64(len(b)) {
		return nil, false
	}
	s := b[off:]
	if len(s) > maxStringLen {
		s = s[:maxStringLen]
	}
	for i, c := range s {
		if c == 0 {
			return s[:i], true
		}
	}
	return nil, false
}

// funcName returns the name at nameOff in funcnametab, interned so warm
// lookups do not allocate and results never alias the mapped file.
func (t *Table) funcName(nameOff uint32) (string, error) {
	t.mu.RLock()
	s, ok := t.names[nameOff]
	t.mu.RUnlock()
	if ok {
		return s, nil
	}
	b, ok := cstring(t.funcnametab, uint64(nameOff))
	if !ok {
		return "", corrupt("function name offset %#x outside table", nameOff)
	}
	s = string(b)
	t.mu.Lock()
	t.names[nameOff] = s
	t.nameBytes += int64(len(s))
	t.mu.Unlock()
	return s, nil
}

// fileName returns the path of file number fileno in f's compilation unit.
func (t *Table) fileName(f *fn, fileno int32) (string, error) {
	if fileno < 0 {
		return "", nil
	}
	fo, ok := t.u32at(t.cutab, (uint64(f.cuOffset)+uint64(fileno))*4)
	if !ok {
		return "", corrupt("file index %d outside CU table", fileno)
	}
	if fo == ^uint32(0) {
		return "", nil // the linker marks files it dropped this way
	}
	t.mu.RLock()
	s, ok := t.files[fo]
	t.mu.RUnlock()
	if ok {
		return s, nil
	}
	b, ok := cstring(t.filetab, uint64(fo))
	if !ok {
		return "", corrupt("file offset %#x outside table", fo)
	}
	s = string(b)
	t.mu.Lock()
	t.files[fo] = s
	t.nameBytes += int64(len(s))
	t.mu.Unlock()
	return s, nil
}

// inlinedCall is one decoded FUNCDATA_InlTree entry.
type inlinedCall struct {
	nameOff   uint32
	parentPC  int32
	startLine int32
}

func (t *Table) inlEntry(f *fn, ix int32) (inlinedCall, error) {
	var c inlinedCall
	addr := f.inlTree + uint64(ix)*uint64(t.inlSize)
	if addr < t.dataAddr || addr-t.dataAddr > uint64(len(t.data)) || uint64(len(t.data))-(addr-t.dataAddr) < uint64(t.inlSize) {
		return c, corrupt("inline tree entry %d at %#x outside data", ix, addr)
	}
	b := t.data[addr-t.dataAddr:]
	if t.version == ver120 {
		c.nameOff = t.u32(b[4:])
		c.parentPC = int32(t.u32(b[8:]))
		c.startLine = int32(t.u32(b[12:]))
	} else {
		c.nameOff = t.u32(b[12:])
		c.parentPC = int32(t.u32(b[16:]))
	}
	if c.parentPC < 0 || uint64(c.parentPC) >= f.end-f.entry {
		return c, corrupt("inline tree entry %d parent pc %#x outside function", ix, c.parentPC)
	}
	return c, nil
}

// Lookup appends the frames at pc to dst, innermost first and the physical
// function last, and returns the extended slice. A pc that no function
// covers (outside the text, or in padding after a function's code) leaves
// dst unchanged with a nil error. With inlines false only the physical
// function is returned, with its own file:line at pc.
//
// StartAddress is the physical function's entry for every frame, inlined
// ones included: the table does not record where an inlined body begins.
// StartFile is the frame's file at pc, which is the function's own file
// except across //line directives. StartLine of inlined frames needs Go 1.20
// tables; older ones leave it zero.
func (t *Table) Lookup(pc uint64, inlines bool, dst []frame.Frame) ([]frame.Frame, error) {
	i := t.find(pc)
	if i < 0 {
		return dst, nil
	}
	c, err := t.cached(i)
	if err != nil {
		return dst, err
	}
	f := &c.f
	if pc < f.entry || pc >= f.end {
		return dst, corrupt("function table not sorted near %#x", pc)
	}
	// Coverage is decided by the line table: past its end is padding. The
	// only functions without one are the linker's zero-size markers
	// (go:textfipsstart): named at their address, as DWARF does, and
	// padding after it.
	if f.pcln == 0 {
		if pc != f.entry {
			return dst, nil
		}
		return append(dst, frame.Frame{Name: c.name, StartLine: uint32(max(f.startLine, 0)), StartAddress: f.entry}), nil
	}
	if _, err := t.value(c, &c.lines, f.pcln, pc); err != nil {
		if err == errNotCovered {
			return dst, nil
		}
		return dst, err
	}
	n0 := len(dst)
	cur := pc
	if inlines && f.inlPC != 0 {
		for depth := 0; ; depth++ {
			ix, err := c.inl(t, cur)
			if err != nil {
				return dst[:n0], fixCover(err)
			}
			if ix < 0 {
				break
			}
			if depth >= maxInlineDepth {
				return dst[:n0], corrupt("inline chain deeper than %d at %#x", maxInlineDepth, pc)
			}
			call, err := t.inlEntry(f, ix)
			if err != nil {
				return dst[:n0], err
			}
			name, err := t.funcName(call.nameOff)
			if err != nil {
				return dst[:n0], err
			}
			file, line, err := c.fileLine(t, cur)
			if err != nil {
				return dst[:n0], fixCover(err)
			}
			dst = append(dst, frame.Frame{
				Name: name, File: file, Line: line,
				StartFile: file, StartLine: uint32(max(call.startLine, 0)), StartAddress: f.entry,
			})
			cur = f.entry + uint64(call.parentPC)
		}
	}
	file, line, err := c.fileLine(t, cur)
	if err != nil {
		return dst[:n0], fixCover(err)
	}
	dst = append(dst, frame.Frame{
		Name: c.name, File: file, Line: line,
		StartFile: file, StartLine: uint32(max(f.startLine, 0)), StartAddress: f.entry,
	})
	return dst, nil
}

// fixCover turns "not covered" on a pc the line table did cover (a parent
// pc, or another table ending early) into corruption.
func fixCover(err error) error {
	if err == errNotCovered {
		return corrupt("pc-value tables disagree on function extent")
	}
	return err
}
