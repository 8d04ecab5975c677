package gopclntab

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// New finds the .gopclntab of f (by section name, or by scanning for its
// header when section headers are missing) and runtime.moduledata, which
// gives the text start (Go 1.26 no longer writes it in the header) and
// go:func.* (the base of inline tree offsets). Without moduledata, lookups
// still work where the text start is known, but without inline frames.
//
// It returns an error wrapping frame.ErrNoDebugInfo when f has no pclntab.
func New(f *elfx.File) (*Table, error) {
	img := f.Bytes()
	var tab []byte
	var tabAddr uint64
	if s := f.Section(".gopclntab"); s != nil && s.Type != elf.SHT_NOBITS {
		b, err := f.SectionData(".gopclntab")
		if err != nil {
			return nil, err
		}
		tab, tabAddr = b, s.Addr
	} else {
		b, addr, ok := scanForTable(f, img)
		if !ok {
			return nil, fmt.Errorf("gopclntab: no Go symbol table: %w", frame.ErrNoDebugInfo)
		}
		tab, tabAddr = b, addr
	}
	t, err := Parse(Image{Pclntab: tab})
	if err != nil {
		return nil, err
	}
	md, mdOK := findModuledata(f, img, t, tabAddr)
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

// scanForTable looks for a pclntab header in the loaded, non-writable file
// contents, for binaries whose section headers were removed.
func scanForTable(f *elfx.File, img []byte) ([]byte, uint64, bool) {
	var pats [][]byte
	for _, m := range []uint32{magic120, magic118, magic116} {
		var le, be [4]byte
		binary.LittleEndian.PutUint32(le[:], m)
		binary.BigEndian.PutUint32(be[:], m)
		pats = append(pats, append(le[:], 0, 0), append(be[:], 0, 0))
	}
	for _, p := range f.Loads() {
		if p.Flags&elf.PF_W != 0 || p.Off > uint64(len(img)) || p.Filesz > uint64(len(img))-p.Off {
			continue
		}
		seg := img[p.Off : p.Off+p.Filesz]
		for _, pat := range pats {
			for i := 0; i < len(seg); {
				k := bytes.Index(seg[i:], pat)
				if k < 0 {
					break
				}
				at := i + k
				i = at + 1
				if at%4 != 0 {
					continue // the header is pointer-aligned
				}
				cand := seg[at:]
				if t, err := Parse(Image{Pclntab: cand, TextStart: 1}); err == nil && plausible(t) {
					return cand, p.Vaddr + uint64(at), true
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
// pclntab header and its slices point into the pclntab. It scans the
// writable data (where the linker puts it) for that pointer.
func findModuledata(f *elfx.File, img []byte, t *Table, tabAddr uint64) (moduledata, bool) {
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
