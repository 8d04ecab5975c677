package dwarf

import (
	"cmp"
	"slices"
)

// lineHeader is a decoded line-program header with the file table already
// turned into the full paths llvm-symbolizer prints.
type lineHeader struct {
	version    uint16
	addrSize   int
	minInst    uint8
	lineBase   int8
	lineRange  uint8
	opcodeBase uint8
	stdLens    []byte
	progStart  int
	progEnd    int
	// files is indexed by the raw file number the program and DIEs use:
	// from 0 in DWARF 5, from 1 before (files[0] is then unused).
	files []string
}

// row is one line-table row. Only what a frame reports is kept.
type row struct {
	addr uint64
	file uint32
	line uint32
	col  uint32
	disc uint32
}

// sequence is a run of rows [first,last) covering [lo,hi).
type sequence struct {
	lo, hi      uint64
	first, last int32
}

const (
	lnctPath           = 1
	lnctDirectoryIndex = 2

	lnsCopy             = 1
	lnsAdvancePC        = 2
	lnsAdvanceLine      = 3
	lnsSetFile          = 4
	lnsSetColumn        = 5
	lnsNegateStmt       = 6
	lnsSetBasicBlock    = 7
	lnsConstAddPC       = 8
	lnsFixedAdvancePC   = 9
	lnsSetPrologueEnd   = 10
	lnsSetEpilogueBegin = 11
	lnsSetISA           = 12

	lneEndSequence      = 1
	lneSetAddress       = 2
	lneSetDiscriminator = 4
)

// maxLineEntries bounds directory and file tables; real ones have at most
// tens of thousands of entries.
const maxLineEntries = 1 << 20

// linesOf parses u's line-program header once.
func (t *Table) linesOf(u *unit) (*lineHeader, error) {
	s := u.state()
	s.filesOnce.Do(func() {
		h, err := t.headOf(u)
		if err != nil {
			s.filesErr = err
			return
		}
		if !h.hasStmt {
			s.lines = &lineHeader{}
			if t.link != nil {
				// A split unit without a line table of its own: its
				// skeleton's names its files, as llvm reads them.
				s.lines, s.filesErr = t.link.skelT.linesOf(t.link.skelU)
			}
			return
		}
		s.lines, s.filesErr = t.parseLineHeader(u, h)
	})
	return s.lines, s.filesErr
}

// fileName is the full path of file number idx of u's line table, or ""
// if there is no such file (llvm then prints an empty name too).
func (t *Table) fileName(u *unit, idx uint64) (string, error) {
	lh, err := t.linesOf(u)
	if err != nil {
		return "", err
	}
	if idx < uint64(len(lh.files)) {
		return lh.files[idx], nil
	}
	return "", nil
}

func (t *Table) parseLineHeader(u *unit, h *unitHead) (*lineHeader, error) {
	b := buf{data: t.sec.line}
	b.seek(h.stmtList)
	length, offSize := b.unitLength()
	if b.err != nil || length > uint64(b.left()) {
		return nil, corruptf("line table at %#x: bad length", h.stmtList)
	}
	b.data = b.data[:b.off+int(length)]
	lh := &lineHeader{addrSize: int(u.shape.addrSize), progEnd: len(b.data)}
	lh.version = b.u16()
	if lh.version < 2 || lh.version > 5 {
		return nil, corruptf("line table at %#x: version %d", h.stmtList, lh.version)
	}
	if lh.version >= 5 {
		lh.addrSize = int(b.u8())
		b.u8() // segment selector size
		if lh.addrSize != 4 && lh.addrSize != 8 {
			return nil, corruptf("line table at %#x: address size %d", h.stmtList, lh.addrSize)
		}
	}
	hlen := b.uN(offSize)
	if hlen > uint64(b.left()) {
		return nil, corruptf("line table at %#x: header length", h.stmtList)
	}
	lh.progStart = b.off + int(hlen)
	lh.minInst = b.u8()
	if lh.version >= 4 {
		b.u8() // maximum_operations_per_instruction: VLIW only, ignored
	}
	b.u8() // default_is_stmt
	lh.lineBase = int8(b.u8())
	lh.lineRange = b.u8()
	lh.opcodeBase = b.u8()
	if lh.opcodeBase == 0 {
		return nil, corruptf("line table at %#x: opcode_base 0", h.stmtList)
	}
	n := int(lh.opcodeBase) - 1
	if n > b.left() {
		b.fail()
	} else {
		lh.stdLens = b.data[b.off : b.off+n]
		b.off += n
	}
	if b.err != nil {
		return nil, corruptf("line table at %#x: truncated header", h.stmtList)
	}
	compDir := h.compDir
	if lh.version >= 5 {
		shape := unitShape{version: 5, addrSize: uint8(lh.addrSize), offSize: uint8(offSize)}
		dirs, err := t.v5Entries(&b, u, h, shape, nil)
		if err != nil {
			return nil, err
		}
		if _, err := t.v5Entries(&b, u, h, shape, func(name []byte, dir uint64) {
			lh.files = append(lh.files, joinFile(5, name, dir, dirs, compDir))
		}); err != nil {
			return nil, err
		}
	} else {
		var dirs [][]byte
		for {
			d := b.cstr()
			if b.err != nil || len(d) == 0 {
				break
			}
			if len(dirs) >= maxLineEntries {
				b.fail()
				break
			}
			dirs = append(dirs, d)
		}
		lh.files = append(lh.files, "")
		for b.err == nil {
			name := b.cstr()
			if len(name) == 0 {
				break
			}
			dir := b.uleb()
			b.skipLEB() // mtime
			b.skipLEB() // length
			if len(lh.files) >= maxLineEntries {
				b.fail()
				break
			}
			lh.files = append(lh.files, joinFile(lh.version, name, dir, dirs, compDir))
		}
	}
	if b.err != nil {
		return nil, corruptf("line table at %#x: truncated file table", h.stmtList)
	}
	if lh.progStart > lh.progEnd || lh.progStart < b.off && lh.version >= 5 {
		// Before DWARF 5 the header may carry vendor bytes we skip; a
		// program starting inside the tables we just read is corrupt.
		return nil, corruptf("line table at %#x: header_length", h.stmtList)
	}
	return lh, nil
}

// v5Entries reads a DWARF 5 entry-format list and its entries. With
// onFile nil it returns the path of each entry (the directory table);
// otherwise it calls onFile with each entry's path and directory index.
func (t *Table) v5Entries(b *buf, u *unit, h *unitHead, shape unitShape, onFile func([]byte, uint64)) ([][]byte, error) {
	nfmt := int(b.u8())
	type pair struct{ typ, form uint64 }
	var fmts [256]pair
	for i := 0; i < nfmt; i++ {
		fmts[i] = pair{b.uleb(), b.uleb()}
		if fmts[i].form > 0xffff {
			b.fail()
		}
	}
	count := b.uleb()
	if b.err != nil || count > maxLineEntries || count > uint64(b.left()) && nfmt > 0 {
		return nil, corruptf("line table: bad entry format")
	}
	var out [][]byte
	for i := uint64(0); i < count && b.err == nil; i++ {
		var path []byte
		var dir uint64
		for _, f := range fmts[:nfmt] {
			form := uint16(f.form)
			switch f.typ {
			case lnctPath:
				path, _ = t.readString(b, shape, h, form)
			case lnctDirectoryIndex:
				dir = t.readUnsigned(b, shape, form, 0)
			default:
				shape.skipForm(b, form)
			}
		}
		if onFile != nil {
			onFile(path, dir)
		} else {
			out = append(out, path)
		}
	}
	if b.err != nil {
		return nil, corruptf("line table: truncated entries")
	}
	return out, nil
}

// joinFile builds the path llvm's Prologue::getFileNameByIndex returns for
// AbsoluteFilePath: an absolute name as is; otherwise comp_dir (unless the
// include directory is absolute, or in DWARF 5 the entry uses directory 0,
// which already is the compilation directory), the include directory and
// the name, joined the way llvm::sys::path::append joins.
func joinFile(version uint16, name []byte, dir uint64, dirs [][]byte, compDir string) string {
	if isAbs(name) {
		return string(name)
	}
	var inc []byte
	if version >= 5 {
		if dir < uint64(len(dirs)) {
			inc = dirs[dir]
		}
	} else if dir > 0 && dir <= uint64(len(dirs)) {
		inc = dirs[dir-1]
	}
	out := make([]byte, 0, len(compDir)+len(inc)+len(name)+2)
	if (version < 5 || dir != 0) && compDir != "" && !isAbs(inc) {
		out = appendPath(out, []byte(compDir))
	}
	out = appendPath(out, inc)
	out = appendPath(out, name)
	return string(out)
}

// appendPath is llvm::sys::path::append for one POSIX component.
func appendPath(p, c []byte) []byte {
	if len(p) > 0 && p[len(p)-1] == '/' {
		i := 0
		for i < len(c) && c[i] == '/' {
			i++
		}
		return append(p, c[i:]...)
	}
	if len(p) > 0 && !(len(c) > 0 && c[0] == '/') {
		p = append(p, '/')
	}
	return append(p, c...)
}

// isAbs is llvm's isPathAbsoluteOnWindowsOrPosix, less UNC names.
func isAbs(p []byte) bool {
	if len(p) > 0 && p[0] == '/' {
		return true
	}
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/') &&
		(p[0]|0x20 >= 'a' && p[0]|0x20 <= 'z')
}

// runLineProgram executes lh's program, appending its rows and sequences.
// Sequences whose address is the linker's tombstone (all ones, for code
// that was discarded) are dropped, as llvm does.
func (t *Table) runLineProgram(lh *lineHeader, rows []row, seqs []sequence) ([]row, []sequence, error) {
	if lh.progEnd == 0 {
		return rows, seqs, nil
	}
	b := buf{data: t.sec.line[:lh.progEnd], off: lh.progStart}
	tomb := uint64(1)<<(8*uint(lh.addrSize)) - 1
	if lh.addrSize == 8 {
		tomb = ^uint64(0)
	}
	var (
		addr       uint64
		file       uint32 = 1
		line       uint32 = 1
		col, disc  uint32
		tombstoned bool
		seqStart   = len(rows)
	)
	minInst := uint64(lh.minInst)
	// Every row takes at least one byte of program; real programs spend
	// three to five. Sizing for that up front, and doubling past it, keeps
	// append from copying a large unit's rows over and over (it grows big
	// slices by a quarter at a time: a fifth of a cold run was that copying).
	rows = slices.Grow(rows, min((lh.progEnd-lh.progStart)/3, 1<<20))
	emit := func() {
		if !tombstoned {
			if len(rows) == cap(rows) {
				rows = slices.Grow(rows, len(rows))
			}
			rows = append(rows, row{addr: addr, file: file, line: line, col: col, disc: disc})
		}
		disc = 0
	}
	endSeq := func() {
		if !tombstoned && len(rows) > seqStart && rows[seqStart].addr < addr {
			s := rows[seqStart:]
			if !slices.IsSortedFunc(s, cmpRowAddr) {
				slices.SortStableFunc(s, cmpRowAddr)
			}
			seqs = append(seqs, sequence{lo: s[0].addr, hi: addr, first: int32(seqStart), last: int32(len(rows))})
		} else {
			rows = rows[:seqStart]
		}
		seqStart = len(rows)
		addr, file, line, col, disc, tombstoned = 0, 1, 1, 0, 0, false
	}
	for b.off < len(b.data) {
		op := b.u8()
		if op >= lh.opcodeBase {
			if lh.lineRange == 0 {
				return rows, seqs, corruptf("line table: line_range 0")
			}
			adj := op - lh.opcodeBase
			addr += uint64(adj/lh.lineRange) * minInst
			line += uint32(int32(lh.lineBase) + int32(adj%lh.lineRange))
			emit()
			continue
		}
		switch op {
		case 0:
			n := b.uleb()
			if n == 0 || n > uint64(b.left()) {
				b.fail()
				break
			}
			next := b.off + int(n)
			switch b.u8() {
			case lneEndSequence:
				endSeq()
			case lneSetAddress:
				addr = b.uN(int(n - 1))
				tombstoned = addr == tomb
			case lneSetDiscriminator:
				disc = uint32(b.uleb())
			}
			b.seek(uint64(next))
		case lnsCopy:
			emit()
		case lnsAdvancePC:
			addr += b.uleb() * minInst
		case lnsAdvanceLine:
			line += uint32(b.sleb())
		case lnsSetFile:
			file = uint32(b.uleb())
		case lnsSetColumn:
			col = uint32(b.uleb())
		case lnsNegateStmt, lnsSetBasicBlock, lnsSetPrologueEnd, lnsSetEpilogueBegin:
		case lnsConstAddPC:
			if lh.lineRange == 0 {
				return rows, seqs, corruptf("line table: line_range 0")
			}
			addr += uint64((255-lh.opcodeBase)/lh.lineRange) * minInst
		case lnsFixedAdvancePC:
			addr += uint64(b.u16())
		case lnsSetISA:
			b.skipLEB()
		default:
			// An opcode this reader does not know: skip its operands.
			for i := 0; i < int(lh.stdLens[op-1]); i++ {
				b.skipLEB()
			}
		}
		if b.err != nil {
			return rows, seqs, corruptf("line table: truncated program")
		}
	}
	// A final sequence without DW_LNE_end_sequence is dropped, as llvm does.
	return rows[:seqStart], seqs, nil
}

func cmpRowAddr(a, b row) int { return cmp.Compare(a.addr, b.addr) }
