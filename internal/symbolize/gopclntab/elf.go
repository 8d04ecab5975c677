package gopclntab

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// New finds the pclntab of f and runtime.moduledata, which gives the text
// start (Go 1.26 no longer writes it in the header) and go:func.* (the base
// of inline tree offsets). Without moduledata, lookups still work where the
// text start is known, but without inline frames.
//
// The pclntab is found by its section (.gopclntab), else by the symbols
// runtime.pclntab and runtime.firstmoduledata (external linking puts the
// table in .data.rel.ro), else, when section headers or symbols are gone,
// by one pass over the read-only segments for its header's magic.
//
// It returns an error wrapping frame.ErrNoDebugInfo when f has no pclntab.
func New(f *elfx.File) (*Table, error) {
	img := f.Bytes()
	var tab []byte
	var tabAddr uint64
	var syms [2]uint64 // runtime.pclntab, runtime.firstmoduledata; 0 when unknown
	if s := f.Section(".gopclntab"); s != nil && s.Type != elf.SHT_NOBITS {
		b, err := f.SectionData(".gopclntab")
		if err != nil {
			return nil, err
		}
		tab, tabAddr = b, s.Addr
	} else {
		copy(syms[:], symbolValues(f, img, "runtime.pclntab", "runtime.firstmoduledata"))
		if b, ok := tableAt(f, img, syms[0]); ok {
			tab, tabAddr = b, syms[0]
		} else if b, addr, ok := scanForTable(f, img); ok {
			tab, tabAddr = b, addr
		} else {
			return nil, fmt.Errorf("gopclntab: no Go symbol table: %w", frame.ErrNoDebugInfo)
		}
	}
	t, err := Parse(Image{Pclntab: tab})
	if err != nil {
		return nil, err
	}
	md, mdOK := findModuledata(f, img, t, tabAddr, syms[1])
	text := t.textStart
	if mdOK && md.text != 0 {
		text = md.text
	}
	if text == 0 && t.version != ver116 {
		// No header field and no moduledata: with the internal linker the
		// Go text starts the .text section.
		if s := f.Section(".text"); s != nil {
			text = s.Addr
		}
	}
	in := Image{Pclntab: tab, TextStart: text}
	if t.version == ver116 {
		// Funcdata are absolute pointers into read-only data, which the
		// internal linker puts in the segment holding the pclntab.
		in.Data, in.DataAddr = segmentAt(f, img, tabAddr)
	} else if mdOK {
		in.GoFunc = md.gofunc
		in.Data, in.DataAddr = segmentAt(f, img, md.gofunc)
	}
	return Parse(in)
}

// segmentAt returns the file-backed bytes of the PT_LOAD segment holding
// addr, or of the allocated section holding it when there are no segments.
func segmentAt(f *elfx.File, img []byte, addr uint64) ([]byte, uint64) {
	for _, p := range f.Loads() {
		if addr >= p.Vaddr && addr-p.Vaddr < p.Filesz && p.Off <= uint64(len(img)) && p.Filesz <= uint64(len(img))-p.Off {
			return img[p.Off : p.Off+p.Filesz], p.Vaddr
		}
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type != elf.SHT_NOBITS && s.Flags&elf.SHF_COMPRESSED == 0 &&
			addr >= s.Addr && addr-s.Addr < s.Size && s.Offset <= uint64(len(img)) && s.Size <= uint64(len(img))-s.Offset {
			return img[s.Offset : s.Offset+s.Size], s.Addr
		}
	}
	return nil, 0
}

// fileToVaddr maps a file offset to its virtual address through PT_LOAD.
func fileToVaddr(f *elfx.File, off uint64) (uint64, []byte, bool) {
	img := f.Bytes()
	for _, p := range f.Loads() {
		if off >= p.Off && off-p.Off < p.Filesz && p.Off+p.Filesz <= uint64(len(img)) {
			return p.Vaddr + (off - p.Off), img[off : p.Off+p.Filesz], true
		}
	}
	return 0, nil, false
}

// scans counts the calls of scanForTable, for tests.
var scans atomic.Int64

// tableAt returns the file bytes from addr to the end of its segment when a
// plausible pclntab starts there.
func tableAt(f *elfx.File, img []byte, addr uint64) ([]byte, bool) {
	if addr == 0 {
		return nil, false
	}
	for _, p := range f.Loads() {
		if addr < p.Vaddr || addr-p.Vaddr >= p.Filesz || p.Off > uint64(len(img)) || p.Filesz > uint64(len(img))-p.Off {
			continue
		}
		cand := img[p.Off+(addr-p.Vaddr) : p.Off+p.Filesz]
		if t, err := Parse(Image{Pclntab: cand, TextStart: 1}); err == nil && plausible(t) {
			return cand, true
		}
	}
	return nil, false
}

// symbolValues returns the values of the named symbols of .symtab (0 for
// those it does not find) without decoding the table: debug/elf's Symbols
// allocates every name, and a Go binary has tens of thousands. A name is
// found where a string table entry is exactly it.
func symbolValues(f *elfx.File, img []byte, names ...string) []uint64 {
	out := make([]uint64, len(names))
	var symtab *elf.Section
	for _, s := range f.Sections {
		if s.Type == elf.SHT_SYMTAB {
			symtab = s
			break
		}
	}
	if symtab == nil || int(symtab.Link) >= len(f.Sections) {
		return out
	}
	strtab := f.Sections[symtab.Link]
	raw := func(s *elf.Section) []byte {
		if s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_COMPRESSED != 0 ||
			s.Offset > uint64(len(img)) || s.FileSize > uint64(len(img))-s.Offset {
			return nil
		}
		return img[s.Offset : s.Offset+s.FileSize]
	}
	syms, strs := raw(symtab), raw(strtab)
	if syms == nil || strs == nil || strtab.Type != elf.SHT_STRTAB {
		return out
	}
	// String table offsets of each name (a name may be stored more than once).
	offs := map[uint32]int{}
	for i, n := range names {
		pat := []byte("\x00" + n + "\x00")
		for at := 0; len(offs) < 64; {
			k := bytes.Index(strs[at:], pat)
			if k < 0 {
				break
			}
			offs[uint32(at+k+1)] = i
			at += k + 1
		}
	}
	if len(offs) == 0 {
		return out
	}
	size, valOff := 24, 8 // Elf64_Sym: name, info, other, shndx, value, size
	if f.Class == elf.ELFCLASS32 {
		size, valOff = 16, 4 // Elf32_Sym: name, value, size, info, other, shndx
	}
	for e := syms; len(e) >= size; e = e[size:] {
		if i, ok := offs[f.ByteOrder.Uint32(e)]; ok && out[i] == 0 {
			if size == 24 {
				out[i] = f.ByteOrder.Uint64(e[valOff:])
			} else {
				out[i] = uint64(f.ByteOrder.Uint32(e[valOff:]))
			}
		}
	}
	return out
}

// scanForTable looks for a pclntab header, for binaries whose section
// headers or symbols were removed: one pass over each read-only segment,
// then the RELRO ranges (external linking), then executable segments (old
// linkers put read-only data in the text segment), for the bytes every
// magic shares, checking the magic and alignment where they occur.
func scanForTable(f *elfx.File, img []byte) ([]byte, uint64, bool) {
	scans.Add(1)
	type region struct{ off, size, addr uint64 }
	var ro, relro, exec []region
	for _, p := range f.Progs {
		r := region{p.Off, p.Filesz, p.Vaddr}
		switch {
		case p.Type == elf.PT_GNU_RELRO:
			relro = append(relro, r)
		case p.Type != elf.PT_LOAD:
		case p.Flags&elf.PF_W != 0:
		case p.Flags&elf.PF_X != 0:
			exec = append(exec, r)
		default:
			ro = append(ro, r)
		}
	}
	// The magic is 0xfffffffX then two zero bytes: find the common part.
	big := f.Data == elf.ELFDATA2MSB
	common, lead := []byte{0xff, 0xff, 0xff, 0, 0}, 1 // little endian: X ff ff ff 00 00
	if big {
		common, lead = []byte{0xff, 0xff, 0xff}, 0 // ff ff ff X 00 00
	}
	for _, rs := range [][]region{ro, relro, exec} {
		for _, r := range rs {
			if r.off > uint64(len(img)) || r.size > uint64(len(img))-r.off {
				continue
			}
			seg := img[r.off : r.off+r.size]
			for i := lead; i < len(seg); {
				k := bytes.Index(seg[i:], common)
				if k < 0 {
					break
				}
				at := i + k - lead
				i += k + 1
				if at%4 != 0 || len(seg)-at < 8 {
					continue // the header is pointer-aligned
				}
				var m uint32
				if big {
					m = binary.BigEndian.Uint32(seg[at:])
				} else {
					m = binary.LittleEndian.Uint32(seg[at:])
				}
				if (m != magic120 && m != magic118 && m != magic116) || seg[at+4] != 0 || seg[at+5] != 0 {
					continue
				}
				cand := seg[at:]
				if t, err := Parse(Image{Pclntab: cand, TextStart: 1}); err == nil && plausible(t) {
					return cand, r.addr + uint64(at), true
				}
			}
		}
	}
	return nil, 0, false
}

// plausible checks a candidate table beyond its header: the first and last
// functions must decode and have names.
func plausible(t *Table) bool {
	for _, i := range []int{0, t.nfunc - 1} {
		f, err := t.decodeFunc(i)
		if err != nil {
			return false
		}
		if b, ok := cstring(t.funcnametab, uint64(f.nameOff)); !ok || len(b) == 0 {
			return false
		}
	}
	return true
}

type moduledata struct {
	addr   uint64
	text   uint64
	gofunc uint64
}

// Word indexes in runtime.moduledata; every field up to gofunc is a pointer,
// a uintptr or a slice (three words), so they hold for 4- and 8-byte words.
const (
	mdFuncnametab = 1
	mdFtab        = 16
	mdText        = 22
	mdGoFunc118   = 38 // Go 1.18–1.19
	mdGoFunc120   = 40 // Go 1.20+: covctrs, ecovctrs came before it
	mdScanWords   = 64
)

// findModuledata locates runtime.moduledata: its first word points at the
// pclntab header and its slices point into the pclntab. It checks symAddr
// (runtime.firstmoduledata's value, 0 if unknown), then scans the writable
// data (where the linker puts it) for that pointer.
func findModuledata(f *elfx.File, img []byte, t *Table, tabAddr, symAddr uint64) (moduledata, bool) {
	ps := t.ptrSize
	var want [8]byte
	if t.big {
		binary.BigEndian.PutUint64(want[:], tabAddr)
	} else {
		binary.LittleEndian.PutUint64(want[:], tabAddr)
	}
	pat := want[:ps]
	if t.big && ps == 4 {
		pat = want[4:]
	}
	// The linker's own sections first (Go 1.26 gives moduledata one), then
	// all writable data, for files without section headers.
	var regions [][2]uint64 // file offset, size
	if symAddr != 0 {
		for _, p := range f.Loads() {
			if symAddr >= p.Vaddr && symAddr-p.Vaddr < p.Filesz {
				off := p.Off + (symAddr - p.Vaddr)
				regions = append(regions, [2]uint64{off, min(uint64(mdScanWords*ps), p.Off+p.Filesz-off)})
			}
		}
	}
	for _, name := range []string{".go.module", ".noptrdata", ".data.rel.ro"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			regions = append(regions, [2]uint64{s.Offset, s.FileSize})
		}
	}
	for _, p := range f.Loads() {
		if p.Flags&elf.PF_W != 0 {
			regions = append(regions, [2]uint64{p.Off, p.Filesz})
		}
	}
	for _, r := range regions {
		if r[0] > uint64(len(img)) || r[1] > uint64(len(img))-r[0] {
			continue
		}
		seg := img[r[0] : r[0]+r[1]]
		for i := 0; i < len(seg); {
			k := bytes.Index(seg[i:], pat)
			if k < 0 {
				break
			}
			at := i + k
			i = at + 1
			if (r[0]+uint64(at))%uint64(ps) != 0 || len(seg)-at < mdScanWords*ps {
				continue
			}
			md := seg[at : at+mdScanWords*ps]
			w := func(j int) uint64 { return t.word(md[j*ps:]) }
			if w(mdFuncnametab) != tabAddr+t.offs[0] {
				continue
			}
			if w(mdFtab) != tabAddr+t.offs[4] || w(mdFtab+1) != uint64(t.nfunc+1) {
				continue
			}
			addr, _, _ := fileToVaddr(f, r[0]+uint64(at))
			m := moduledata{addr: addr, text: w(mdText)}
			if t.version != ver116 {
				m.gofunc = pickGoFunc(f, img, t, w, m.text)
			}
			return m, true
		}
	}
	return moduledata{}, false
}

// pickGoFunc chooses moduledata.gofunc. Its word index moved between Go
// releases, so each candidate word that points into loaded data is tried as
// the base of the inline trees of a sample of functions, and the one under
// which the most entries look right wins; the known layouts break ties. When
// functions have inline trees but no candidate explains them, it returns 0:
// no inline frames beats wrong ones.
func pickGoFunc(f *elfx.File, img []byte, t *Table, w func(int) uint64, text uint64) uint64 {
	order := []int{mdGoFunc120, mdGoFunc118}
	if t.version == ver118 {
		order = []int{mdGoFunc118, mdGoFunc120}
	}
	for j := mdText + 2; j < mdScanWords; j++ {
		if j != mdGoFunc118 && j != mdGoFunc120 {
			order = append(order, j)
		}
	}
	var best uint64
	bestScore, trees := 0, 0
	for _, j := range order {
		cand := w(j)
		if cand == 0 {
			continue
		}
		data, base := segmentAt(f, img, cand)
		if data == nil {
			continue
		}
		tt, err := Parse(Image{Pclntab: t.whole, TextStart: text, GoFunc: cand, Data: data, DataAddr: base})
		if err != nil {
			continue
		}
		s, n := inlineScore(tt)
		trees = max(trees, n)
		if s > bestScore {
			best, bestScore = cand, s
		}
	}
	if trees == 0 {
		return w(order[0]) // nothing to check against (built with -l)
	}
	return best
}

// inlineScore samples functions that have an inline tree and counts those
// whose first entry names a function; it also returns how many it sampled.
func inlineScore(t *Table) (score, seen int) {
	const samples = 64
	step := t.nfunc/512 + 1
	for i := 0; i < t.nfunc && seen < samples; i += step {
		f, err := t.decodeFunc(i)
		if err != nil || f.inlTree == 0 {
			continue
		}
		seen++
		c, err := t.inlEntry(&f, 0)
		if err != nil {
			continue
		}
		// A name starts right after another name's NUL.
		if b, ok := cstring(t.funcnametab, uint64(c.nameOff)); ok && len(b) > 0 &&
			(c.nameOff == 0 || t.funcnametab[c.nameOff-1] == 0) {
			score++
		}
	}
	return score, seen
}
