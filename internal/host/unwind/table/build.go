package table

import (
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

var errLimit = fmt.Errorf("unwind table: more rows than the configured limit: %w", frame.ErrLimitExceeded)

// maxCFISection bounds the CFI sections read (after decompression). The
// largest .eh_frame of a real shared library is tens of MB.
const maxCFISection = 1 << 30

// seg is one covered address range of a source (an FDE, a Go function).
// Rows are written in a second pass, in address order, straight into the
// table: kind other than KindNormal is the segment's only row; otherwise
// the source's gen runs the segment's program (ref says where it is).
type seg struct {
	start, end uint64
	ref        int32
	kind       Kind
}

// source is one kind of unwind information: its indexed segments and the
// generator of their rows.
type source struct {
	name  string
	segs  []seg
	gen   func(g *seg, em *emitter) error
	stats *Stats
	used  bool // contributed rows to the table
}

type builder struct {
	f    *elfx.File
	max  int
	regs archRegs
	text [][2]uint64 // executable address ranges
	// code is where code without CFI may hide: the executable sections, or
	// text when section headers are gone (an executable segment may also
	// hold read-only data, which is not scanned).
	codeRanges [][2]uint64
	big        bool
	ptrSz      int
	// code returns n bytes of the file image at a virtual address, or nil.
	code  func(addr uint64, n int) []byte
	srcs  []*source
	stats Stats
	// sig is the machine's rt_sigreturn trampoline, nop the no-op a
	// C library may put before it (see isSigreturn).
	sig, nop []byte
}

func newBuilder(f *elfx.File, opt Options) (*builder, error) {
	b := &builder{f: f, max: opt.MaxRows, big: f.Data == elf.ELFDATA2MSB, ptrSz: 8}
	if b.max <= 0 {
		b.max = DefaultMaxRows
	}
	if f.Class == elf.ELFCLASS32 {
		b.ptrSz = 4
	}
	reads := 0
	b.code = func(addr uint64, n int) []byte {
		// Code is read a few bytes at a time all over the file, and each
		// read maps the pages around it (the kernel's fault-around, 64 KiB).
		if reads++; reads%dropEveryRead == 0 {
			f.DropPages()
		}
		c, err := f.ReadVaddr(addr, n)
		if err != nil {
			return nil
		}
		return c
	}
	switch f.Machine {
	case elf.EM_X86_64:
		b.regs = archRegs{fp: 6, sp: 7, cfa: X86CFARegister}
		b.sig, b.nop = rtSigreturn, []byte{0x90}
	case elf.EM_AARCH64:
		// x29, sp; the return address may stay in x30 (the link register).
		b.regs = archRegs{fp: 29, sp: 31, lr: true}
		b.sig, b.nop = arm64Sigreturn, []byte{0x1f, 0x20, 0x03, 0xd5}
	default:
		return nil, fmt.Errorf("%w: %v", ErrUnsupportedArch, f.Machine)
	}
	if f.Type == elf.ET_REL {
		return nil, fmt.Errorf("relocatable object: %w", ErrNoUnwindInfo)
	}
	for _, p := range f.Loads() {
		if p.Flags&elf.PF_X != 0 && p.Memsz > 0 && p.Vaddr+p.Memsz > p.Vaddr {
			b.text = append(b.text, [2]uint64{p.Vaddr, p.Vaddr + p.Memsz})
		}
	}
	if len(f.Loads()) == 0 {
		for _, s := range f.Sections {
			if s.Flags&elf.SHF_EXECINSTR != 0 && s.Size > 0 && s.Addr+s.Size > s.Addr {
				b.text = append(b.text, [2]uint64{s.Addr, s.Addr + s.Size})
			}
		}
	}
	b.text = unionRanges(b.text)
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_EXECINSTR != 0 && s.Type != elf.SHT_NOBITS && s.Size > 0 && s.Addr+s.Size > s.Addr {
			b.codeRanges = append(b.codeRanges, [2]uint64{s.Addr, s.Addr + s.Size})
		}
	}
	if len(b.codeRanges) == 0 {
		b.codeRanges = b.text
	} else {
		b.codeRanges = unionRanges(b.codeRanges)
	}
	return b, nil
}

// unionRanges sorts ranges and merges those that overlap or touch, so that
// a lookup is one binary search however many segments a file claims.
func unionRanges(rs [][2]uint64) [][2]uint64 {
	slices.SortFunc(rs, func(a, c [2]uint64) int { return cmp.Compare(a[0], c[0]) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// inText reports whether [start, end) lies within one executable range.
func (b *builder) inText(start, end uint64) bool {
	i, _ := slices.BinarySearchFunc(b.text, start, func(t [2]uint64, pc uint64) int { return cmp.Compare(t[0], pc+1) })
	return i > 0 && start >= b.text[i-1][0] && end <= b.text[i-1][1]
}

func (b *builder) newSource(name string) *source {
	return &source{name: name, stats: &b.stats}
}

func (b *builder) build(sink Sink) (Info, error) {
	var srcs []*source // by priority: earlier sources win where they overlap
	var errs []error
	add := func(s *source, err error) error {
		if errors.Is(err, errLimit) {
			return err
		}
		if err != nil {
			errs = append(errs, err)
		}
		if s != nil && len(s.segs) > 0 {
			srcs = append(srcs, s)
		}
		return nil
	}
	// Go's own tables describe Go code best; CFI describes the rest (cgo,
	// C and assembly objects). .debug_frame only fills what .eh_frame leaves.
	// Each pass leaves the file's pages it read out of the resident set.
	for _, src := range []func() (*source, error){b.gopclntab, b.ehFrame, b.debugFrame} {
		err := add(src())
		b.dropPages()
		if err != nil {
			return Info{}, err
		}
	}
	if len(srcs) == 0 {
		if len(errs) > 0 {
			return Info{}, fmt.Errorf("unwind table: %w: %w", frame.ErrCorruptFile, errors.Join(errs...))
		}
		return Info{}, ErrNoUnwindInfo
	}
	if len(errs) > 0 && b.stats.FirstError == "" {
		b.stats.FirstError = errs[0].Error()
	}
	pieces := b.merge(srcs)
	if syn := b.synthesize(pieces); syn != nil {
		b.srcs = append(b.srcs, syn)
		pieces = b.mergeInto(pieces, syn)
	}
	b.dropPages()
	n, err := b.emit(pieces, sink)
	if err != nil {
		return Info{}, err
	}
	var names []string
	for _, n := range []string{"eh_frame", "debug_frame", "gopclntab"} {
		for _, s := range srcs {
			if s.name == n && s.used {
				names = append(names, n)
			}
		}
	}
	return Info{Arch: b.f.Machine, Source: strings.Join(names, "+"), Rows: n, Stats: b.stats}, nil
}

// piece is a part of a source's segment that made it into the table: the
// segment is b.srcs[src].segs[seg]. Indexes, not pointers, so that the GC
// need not scan the pieces (one or more per FDE).
type piece struct {
	start, end uint64
	seg        int32
	src        int32
}

// merge resolves overlaps: within a source the earlier-starting range wins;
// across sources the one earlier in srcs wins. The result is sorted and
// non-overlapping.
func (b *builder) merge(srcs []*source) []piece {
	b.srcs = srcs
	var covered []piece
	for _, s := range srcs {
		covered = b.mergeInto(covered, s)
	}
	return covered
}

// mergeInto adds the parts of s's segments not yet covered.
func (b *builder) mergeInto(covered []piece, s *source) []piece {
	slices.SortStableFunc(s.segs, func(x, y seg) int { return cmp.Compare(x.start, y.start) })
	src := int32(slices.Index(b.srcs, s))
	add := make([]piece, 0, len(s.segs))
	var reach uint64 // end of s's own ranges so far
	j := 0
	for i := range s.segs {
		g := &s.segs[i]
		a := g.start
		if a < reach {
			if g.end <= reach {
				b.stats.DroppedFDEs++
				continue
			}
			a = reach
		}
		reach = g.end
		for j < len(covered) && covered[j].end <= a {
			j++
		}
		for k := j; a < g.end; {
			if k < len(covered) && covered[k].start <= a {
				a = max(a, covered[k].end)
				k++
				continue
			}
			e := g.end
			if k < len(covered) && covered[k].start < e {
				e = covered[k].start
			}
			add = append(add, piece{start: a, end: e, src: src, seg: int32(i)})
			a = e
		}
	}
	if len(add) == 0 {
		return covered
	}
	s.used = true
	if len(covered) == 0 {
		return add
	}
	// Merge from the back, in place: later sources add few pieces, so the
	// table's pieces are not copied when their array has room.
	n := len(covered)
	out := slices.Grow(covered, len(add))[:n+len(add)]
	i, k := n-1, len(add)-1
	for w := len(out) - 1; k >= 0; w-- {
		if i >= 0 && out[i].start > add[k].start {
			out[w] = out[i]
			i--
		} else {
			out[w] = add[k]
			k--
		}
	}
	return out
}

// alignPad is the function alignment of x86-64 compilers.
const alignPad = 16

// emitter writes rows into the table. Sources hand it a segment's rows in
// address order; it keeps those of the current piece (the last one at or
// before the piece's start moves to the start), merges rows that unwind
// alike, enforces the row limit and hands finished rows to the sink.
type emitter struct {
	// buf holds the rows not handed on yet: those of the current piece,
	// which a malformed program drops, and the one before them, which the
	// next row may merge into or replace.
	buf        []Row
	sink       Sink
	sent       int // rows handed to the sink
	max        int
	start, end uint64 // the current piece
	pending    Row    // last row at or before start, not yet written
	hasPending bool
	wrote      bool // a row of this piece was written
	done       bool // the generator may stop: rows past the piece end
}

func (e *emitter) put(r Row) error {
	if n := len(e.buf); n > 0 {
		last := &e.buf[n-1]
		if last.sameRule(&r) {
			return nil
		}
		if last.PC == r.PC {
			*last = r
			return nil
		}
	}
	if e.sent+len(e.buf) >= e.max {
		return errLimit
	}
	e.buf = append(e.buf, r)
	return nil
}

// flush hands on every row but the last, or all of them with all set.
func (e *emitter) flush(all bool) error {
	n := len(e.buf)
	if !all {
		n--
	}
	if n <= 0 {
		return nil
	}
	if err := e.sink(e.buf[:n]); err != nil {
		return err
	}
	e.sent += n
	e.buf = e.buf[:copy(e.buf, e.buf[n:])]
	return nil
}

func (e *emitter) begin(start, end uint64) {
	e.start, e.end = start, end
	e.hasPending, e.wrote, e.done = false, false, false
}

// row takes the next row of the current segment.
func (e *emitter) row(r Row) error {
	switch {
	case r.PC >= e.end:
		e.done = true
		return nil
	case r.PC <= e.start:
		e.pending, e.hasPending = r, true
		return nil
	}
	if e.hasPending {
		if err := e.flushPending(); err != nil {
			return err
		}
	}
	if !e.wrote {
		// Rows must start at the piece start; a generator that skipped it
		// leaves nothing known there.
		if err := e.put(Row{PC: e.start, Kind: KindFallback}); err != nil {
			return err
		}
	}
	e.wrote = true
	return e.put(r)
}

func (e *emitter) flushPending() error {
	p := e.pending
	p.PC = e.start
	e.hasPending, e.wrote = false, true
	return e.put(p)
}

// finish ends the current piece.
func (e *emitter) finish() error {
	if e.hasPending {
		return e.flushPending()
	}
	if !e.wrote {
		e.wrote = true
		return e.put(Row{PC: e.start, Kind: KindFallback})
	}
	return nil
}

// dropPages leaves the file's pages read so far out of the resident set.
func (b *builder) dropPages() {
	if b.f != nil {
		b.f.DropPages()
	}
}

// dropEvery: the pieces written (or FDEs indexed) between two calls of
// File.DropPages, and dropEveryRead the reads of code bytes, so that a big
// file's build keeps a few MB of it resident (the CFI or pcsp read for those
// pieces, 64 KiB around each code read), not all it read.
const (
	dropEvery     = 4096
	dropEveryRead = 2048
)

// emit writes the pieces' rows in order (pass 2), a KindFallback row in
// each gap (except alignment padding) and after the last piece, and returns
// how many it handed to sink. A segment whose program turns out malformed
// falls back as a whole.
func (b *builder) emit(pieces []piece, sink Sink) (int, error) {
	em := &emitter{max: b.max, sink: sink, buf: make([]Row, 0, 64)}
	var prevEnd uint64
	for i := range pieces {
		p := &pieces[i]
		// Alignment padding before a 16-byte aligned function is never
		// executed: the previous row may run across it, which saves a row
		// per function. Any larger gap may hold code without CFI.
		pad := p.start-prevEnd < alignPad && p.start%alignPad == 0
		if i > 0 && p.start > prevEnd && !pad {
			if err := em.put(Row{PC: prevEnd, Kind: KindFallback}); err != nil {
				return 0, err
			}
		}
		if err := em.flush(false); err != nil {
			return 0, err
		}
		if i%dropEvery == dropEvery-1 {
			b.dropPages()
		}
		n0 := len(em.buf)
		em.begin(p.start, p.end)
		var err error
		src := b.srcs[p.src]
		if g := &src.segs[p.seg]; g.kind != KindNormal {
			err = em.row(Row{PC: g.start, Kind: g.kind})
		} else {
			err = src.gen(g, em)
		}
		if err == nil {
			err = em.finish()
		}
		if err != nil {
			if errors.Is(err, errLimit) {
				return 0, err
			}
			b.stats.BadFDEs++
			if b.stats.FirstError == "" {
				b.stats.FirstError = err.Error()
			}
			em.buf = em.buf[:n0]
			em.begin(p.start, p.end)
			if err := em.put(Row{PC: p.start, Kind: KindFallback}); err != nil {
				return 0, err
			}
		}
		prevEnd = p.end
	}
	if err := em.put(Row{PC: prevEnd, Kind: KindFallback}); err != nil {
		return 0, err
	}
	if err := em.flush(true); err != nil {
		return 0, err
	}
	return em.sent, nil
}

// rtSigreturn is the x86-64 signal return trampoline of glibc and musl
// (__restore_rt) and Go (runtime.sigreturn__sigaction):
// mov $15 (rt_sigreturn), %rax; syscall.
var rtSigreturn = []byte{0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05}

// arm64Sigreturn is musl's and the vdso's: mov x8, #139; svc #0.
var arm64Sigreturn = []byte{0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4}

// isSigreturn reports whether a short code range is a signal trampoline,
// possibly after the nop that glibc puts before it so that unwinders
// looking up "return address - 1" land in the same FDE.
func (b *builder) isSigreturn(start, end uint64) bool {
	n := end - start
	if n < uint64(len(b.sig)) || n > 16 {
		return false
	}
	code := b.code(start, int(n))
	if code == nil {
		return false
	}
	return bytes.HasPrefix(code, b.sig) || (bytes.HasPrefix(code, b.nop) && bytes.HasPrefix(code[len(b.nop):], b.sig))
}

// synthesize covers what no source describes but is known by its code: a
// signal trampoline without CFI (musl's __restore_rt), and an entry point
// without CFI (_start of some C libraries), which ends the stack.
func (b *builder) synthesize(pieces []piece) *source {
	s := b.newSource("synthetic")
	s.gen = func(*seg, *emitter) error { return nil }
	// Gaps between covered ranges, within code.
	for _, t := range b.codeRanges {
		a := t[0]
		i, _ := slices.BinarySearchFunc(pieces, a, func(p piece, pc uint64) int { return cmp.Compare(p.end, pc+1) })
		for a < t[1] {
			e := t[1]
			if i < len(pieces) && pieces[i].start <= a {
				a = max(a, pieces[i].end)
				i++
				continue
			}
			if i < len(pieces) && pieces[i].start < e {
				e = pieces[i].start
			}
			b.scanGap(s, a, e)
			a = e
		}
	}
	if entry := b.f.Entry; entry != 0 && b.inText(entry, entry+1) && !coveredAt(pieces, entry) {
		size := b.entrySize()
		if size == 0 {
			// Without a symbol, the uncovered code from the entry up to the
			// next CFI, if short: startup code is a few dozen bytes, and
			// everything else a C toolchain emits has CFI.
			i, _ := slices.BinarySearchFunc(pieces, entry, func(p piece, pc uint64) int { return cmp.Compare(p.end, pc+1) })
			if i < len(pieces) && pieces[i].start-entry <= maxEntryGap {
				size = pieces[i].start - entry
			}
		}
		if size > 0 && b.inText(entry, entry+size) {
			s.segs = append(s.segs, seg{start: entry, end: entry + size, kind: KindEnd})
		}
	}
	if len(s.segs) == 0 {
		return nil
	}
	return s
}

// maxSynthetic bounds the trampolines taken from code bytes: a libc has one.
const maxSynthetic = 1024

// scanGap marks rt_sigreturn trampolines found in [a, e).
func (b *builder) scanGap(s *source, a, e uint64) {
	const maxScan = 1 << 28
	if e-a < uint64(len(b.sig)) || e-a > maxScan {
		return
	}
	code := b.code(a, int(e-a))
	if code == nil {
		return
	}
	for off := 0; ; {
		k := bytes.Index(code[off:], b.sig)
		if k < 0 {
			return
		}
		if b.f.Machine == elf.EM_AARCH64 && (a+uint64(off+k))%4 != 0 {
			off += k + 1 // not an instruction boundary
			continue
		}
		pc := a + uint64(off+k)
		start := pc
		if n := len(b.nop); off+k >= n && bytes.Equal(code[off+k-n:off+k], b.nop) {
			start -= uint64(n) // cover the nop a "return address - 1" lookup lands on
		}
		s.segs = append(s.segs, seg{start: start, end: pc + uint64(len(b.sig)), kind: KindSignal})
		if len(s.segs) >= maxSynthetic {
			return
		}
		off += k + len(b.sig)
	}
}

func coveredAt(pieces []piece, pc uint64) bool {
	i, _ := slices.BinarySearchFunc(pieces, pc, func(p piece, pc uint64) int { return cmp.Compare(p.end, pc+1) })
	return i < len(pieces) && pieces[i].start <= pc
}

// maxEntryGap bounds the code after an entry point without CFI or symbol
// that is taken for startup code.
const maxEntryGap = 256

// entrySize is the size of the function symbol at the entry point, 0 when
// the symbol tables do not say.
func (b *builder) entrySize() uint64 {
	for _, read := range []func() ([]elf.Symbol, error){b.f.Symbols, b.f.DynamicSymbols} {
		syms, err := read()
		if err != nil {
			continue
		}
		for _, s := range syms {
			if s.Value == b.f.Entry && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
				return min(s.Size, 4096)
			}
		}
	}
	return 0
}

// deref reads a pointer of the file image (DW_EH_PE_indirect).
func (b *builder) deref(addr uint64, size int) (uint64, bool) {
	p := b.code(addr, size)
	if p == nil {
		return 0, false
	}
	r := reader{b: p, big: b.big}
	if size == 4 {
		return uint64(r.u32()), true
	}
	return r.u64(), true
}

func (b *builder) newParser(sec *section, out *source) *cfiParser {
	p := &cfiParser{
		sec: sec, regs: b.regs, out: out, cies: map[int]*cie{}, maxSegs: b.max,
		sigreturn: b.isSigreturn, inText: b.inText, drop: b.dropPages,
	}
	out.gen = p.rows
	return p
}

// debugFrame reads .debug_frame.
func (b *builder) debugFrame() (*source, error) {
	s := b.f.Section(".debug_frame")
	if s == nil {
		s = b.f.Section(".zdebug_frame")
	}
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if s.Size > maxCFISection {
		return nil, fmt.Errorf(".debug_frame of %d bytes: %w", s.Size, frame.ErrLimitExceeded)
	}
	data, err := b.f.SectionData(".debug_frame")
	if err != nil {
		return nil, fmt.Errorf(".debug_frame: %w", err)
	}
	return b.readDebugFrame(data)
}

// readDebugFrame parses .debug_frame bytes.
func (b *builder) readDebugFrame(data []byte) (*source, error) {
	sec := &section{name: ".debug_frame", data: data, debug: true, ptrSize: b.ptrSz, big: b.big, deref: b.deref}
	b.stats.SourceBytes += len(data)
	out := b.newSource("debug_frame")
	out.segs = make([]seg, 0, min(len(data)/48+1, b.max))
	p := b.newParser(sec, out)
	if _, err := p.walk(); err != nil {
		if errors.Is(err, errLimit) {
			return nil, err
		}
		p.note(err)
		if len(out.segs) == 0 {
			return nil, err
		}
	}
	return out, nil
}
