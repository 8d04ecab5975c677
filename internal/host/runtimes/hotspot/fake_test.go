package hotspot

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// fakeMem is a process's memory for tests: one region at base. Reads
// outside it fail as /proc/PID/mem reads of unmapped memory do.
type fakeMem struct {
	base  uint64
	b     []byte
	reads int
	bytes int
	gone  bool // the process exited
}

func (m *fakeMem) Read(addr uint64, p []byte) error {
	m.reads++
	m.bytes += len(p)
	if m.gone {
		return runtimes.ErrProcessGone
	}
	if len(p) > runtimes.MaxRead {
		return frame.ErrLimitExceeded
	}
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return fmt.Errorf("read %d bytes at %#x: %w", len(p), addr, runtimes.ErrBadFrame)
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

func (m *fakeMem) U64(addr uint64) (uint64, error) {
	var b [8]byte
	err := m.Read(addr, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

func (m *fakeMem) U32(addr uint64) (uint32, error) {
	var b [4]byte
	err := m.Read(addr, b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

func (m *fakeMem) U16(addr uint64) (uint16, error) {
	var b [2]byte
	err := m.Read(addr, b[:])
	return binary.LittleEndian.Uint16(b[:]), err
}

func (m *fakeMem) CString(addr uint64, max int) (string, error) {
	var out []byte
	for len(out) < max {
		var c [1]byte
		if err := m.Read(addr+uint64(len(out)), c[:]); err != nil {
			return "", err
		}
		if c[0] == 0 {
			return string(out), nil
		}
		out = append(out, c[0])
	}
	return string(out), frame.ErrLimitExceeded
}

func (m *fakeMem) Close() error { return nil }

// arena lays out a fake process image in a fakeMem.
type arena struct {
	m   *fakeMem
	top uint64
}

func newArena(base uint64, size int) *arena {
	return &arena{m: &fakeMem{base: base, b: make([]byte, size)}, top: base}
}

// alloc reserves n bytes, 16-byte aligned.
func (a *arena) alloc(n int) uint64 {
	at := a.top
	a.top += uint64(n+15) &^ 15
	if a.top-a.m.base > uint64(len(a.m.b)) {
		a.m.b = append(a.m.b, make([]byte, a.top-a.m.base-uint64(len(a.m.b)))...)
	}
	return at
}

func (a *arena) put(addr uint64, b []byte) { copy(a.m.b[addr-a.m.base:], b) }
func (a *arena) u64(addr, v uint64)        { binary.LittleEndian.PutUint64(a.m.b[addr-a.m.base:], v) }

func (a *arena) u32(addr uint64, v uint32) { binary.LittleEndian.PutUint32(a.m.b[addr-a.m.base:], v) }

func (a *arena) u16(addr uint64, v uint16) { binary.LittleEndian.PutUint16(a.m.b[addr-a.m.base:], v) }

func (a *arena) cstring(s string) uint64 {
	at := a.alloc(len(s) + 1)
	a.put(at, []byte(s))
	return at
}

// u5 encodes v as HotSpot's UNSIGNED5 with x excluded bytes.
func u5(x byte, v uint32) []byte {
	l := uint32(256 - int(x) - u5H)
	var out []byte
	for i := 0; ; i++ {
		if v < l || i == 4 {
			return append(out, byte(v+uint32(x)))
		}
		v -= l
		out = append(out, byte(l+v%u5H+uint32(x)))
		v >>= 6
	}
}

func u5s(x byte, v int32) []byte { return u5(x, uint32(v<<1^v>>31)) }

// lineTable encodes (bci, line) pairs as a compressed line number table.
func lineTable(x byte, pairs ...[2]int) []byte {
	var out bytes.Buffer
	bci, line := 0, 0
	for _, p := range pairs {
		db, dl := p[0]-bci, p[1]-line
		if db >= 0 && db < 32 && dl >= 0 && dl < 8 && db<<3|dl != 0xff && db<<3|dl != 0 {
			out.WriteByte(byte(db<<3 | dl))
		} else {
			out.WriteByte(0xff)
			out.Write(u5s(x, int32(db)))
			out.Write(u5s(x, int32(dl)))
		}
		bci, line = p[0], p[1]
	}
	out.WriteByte(0)
	return out.Bytes()
}

// jdk17 is the layout of Debian's OpenJDK 17.0.21 (its tables), for
// tests that build JVM structures by hand.
func jdk17() *layout {
	return &layout{
		version: 17, arch: "amd64",
		blobName: 96, blobSize: 12, blobCodeBegin: 32, blobCodeEnd: 40, blobHeader: 104,
		blobFrameComplete: 20, blobFrameSize: 28, nmSize: 352, completeWidth: 4, blobDataOffset: 24,
		nmCompileID: 304, nmOrigPCOffset: 300, nmDeoptHandler: 128,
		nmMethod: 112, nmScopesData: 120, nmMetadataOff: 260, nmScopesPCsOff: 268, nmDepsOff: 272,
		scopesPointer: true, metaWidth: 4,
		pcDescSize: 16, pcDescPCOffset: 0, pcDescScope: 4, heapBlockSize: 16,
		methodConst: 8, constMethodSize: 48, cmCodeSize: 32, cmConstants: 8, cmNameIndex: 34, cmSigIndex: 36,
		cmFlags: 28, cmHasLineTable: 1, cpHolder: 24, cpSize: 72, cpLength: 60, cpSourceFile: 54, klassName: 24,
		symLength: 4, symBody: 6,
		ifSenderSP: -1, ifMethod: -3, ifBCP: -8, stubs: map[string]uint64{},
	}
}

// fakeJVM builds Java structures in an arena with the JDK 17 layout, or
// another JDK's.
type fakeJVM struct {
	*arena
	l *layout
}

func newFakeJVM() *fakeJVM { return newFakeJVMOf(jdk17()) }

func newFakeJVMOf(l *layout) *fakeJVM {
	return &fakeJVM{arena: newArena(0x7f0000000000, 1<<20), l: l}
}

// tablesLayout is the layout the dumped tables of JDK v give.
func tablesLayout(t testing.TB, v int) *layout {
	t.Helper()
	l, err := buildImage(readDump(t, v), v).layout()
	if err != nil {
		t.Fatalf("JDK %d: %v", v, err)
	}
	return l
}

func (j *fakeJVM) symbol(s string) uint64 {
	at := j.alloc(int(j.l.symBody) + len(s))
	j.u16(at+j.l.symLength, uint16(len(s)))
	j.put(at+j.l.symBody, []byte(s))
	return at
}

// method builds a Method of class (internal form) in file, with code
// bytes of bytecode and a line table of pairs. It returns the Method*.
func (j *fakeJVM) method(class, file, name string, code int, pairs ...[2]int) uint64 {
	l := j.l
	klass := j.alloc(512)
	j.u64(klass+l.klassName, j.symbol(class))
	const entries = 8
	cp := j.alloc(int(l.cpSize) + 8*entries)
	j.u64(cp+l.cpHolder, klass)
	j.u32(cp+l.cpLength, entries)
	j.u64(cp+l.cpSize+8*1, j.symbol(name))
	j.u64(cp+l.cpSize+8*2, j.symbol("(J)J"))
	j.u64(cp+l.cpSize+8*3, j.symbol(file))
	if l.cpSourceFile != 0 {
		j.u16(cp+l.cpSourceFile, 3)
	} else {
		j.u16(klass+l.ikSourceFile, 3)
	}
	lt := lineTable(l.u5x(), pairs...)
	cm := j.alloc(int(l.constMethodSize) + code + len(lt))
	j.u64(cm+l.cmConstants, cp)
	j.u16(cm+l.cmNameIndex, 1)
	j.u16(cm+l.cmSigIndex, 2)
	j.u16(cm+l.cmCodeSize, uint16(code))
	if len(pairs) > 0 {
		j.u16(cm+l.cmFlags, uint16(l.cmHasLineTable))
	}
	j.put(cm+l.constMethodSize+uint64(code), lt)
	m := j.alloc(88)
	j.u64(m+l.methodConst, cm)
	return m
}

// scope is one scope of a fake nmethod: a method and a bci, with its
// caller (-1: none) as an index into the same list.
type scope struct {
	method uint64
	bci    int
	caller int
}

// nmethod builds an nmethod whose PcDescs map pc offsets to scopes.
func (j *fakeJVM) nmethod(owner uint64, id uint32, scopes []scope, pcs map[int32]int) uint64 {
	l := j.l
	x := l.u5x()
	// Metadata: the scopes' methods; scopes data after it, callers first.
	var meta []uint64
	index := map[uint64]int{}
	for _, s := range scopes {
		if _, ok := index[s.method]; !ok {
			meta = append(meta, s.method)
			index[s.method] = len(meta)
		}
	}
	var data bytes.Buffer
	data.WriteByte(0) // offset 0 means no scope
	offs := make([]int, len(scopes))
	for i, s := range scopes {
		offs[i] = data.Len()
		sender := uint32(0)
		if s.caller >= 0 {
			sender = uint32(offs[s.caller])
		}
		data.Write(u5(x, sender))
		data.Write(u5(x, uint32(index[s.method])))
		data.Write(u5(x, uint32(s.bci+1)))
		data.Write(u5(x, 0)) // locals, expressions, monitors: none
		data.Write(u5(x, 0))
		data.Write(u5(x, 0))
	}
	var keys []int32
	for k := range pcs {
		keys = append(keys, k)
	}
	sortInt32(keys)
	hdr := int(l.nmSize)
	codeOff := hdr
	codeLen := 256
	metaOff := codeOff + codeLen
	dataOff := metaOff + 8*len(meta)
	pcsOff := dataOff + (data.Len()+7)&^7
	depsOff := pcsOff + int(l.pcDescSize)*(len(keys)+1)
	nm := j.alloc(depsOff + 16)
	if l.codeOffsets {
		j.u32(nm+l.blobCodeBegin, uint32(codeOff))
		j.u32(nm+l.blobCodeEnd, uint32(codeOff+codeLen))
	} else {
		j.u64(nm+l.blobCodeBegin, nm+uint64(codeOff))
		j.u64(nm+l.blobCodeEnd, nm+uint64(codeOff+codeLen))
	}
	j.u32(nm+l.blobSize, uint32(depsOff+16))
	j.u32(nm+l.nmCompileID, id)
	j.u64(nm+l.nmMethod, owner)
	putw := func(at uint64, w uint8, v int) {
		if w == 2 {
			j.u16(at, uint16(v))
		} else {
			j.u32(at, uint32(v))
		}
	}
	// Where each part goes: the nmethod (8-22), or immutable data (PcDescs,
	// scopes data) and mutable data (relocations, metadata; 25+).
	metaAt, dataAt, pcsAt := nm+uint64(metaOff), nm+uint64(dataOff), nm+uint64(pcsOff)
	switch {
	case l.nmDebug == nmInBlob:
		if l.scopesPointer {
			j.u64(nm+l.nmScopesData, nm+uint64(dataOff))
		} else {
			j.u32(nm+l.nmScopesData, uint32(dataOff))
		}
		putw(nm+l.nmMetadataOff, l.metaWidth, metaOff)
		j.u32(nm+l.nmScopesPCsOff, uint32(pcsOff))
		j.u32(nm+l.nmDepsOff, uint32(depsOff))
	case l.mutableData:
		pcsLen := int(l.pcDescSize) * (len(keys) + 1)
		imm := j.alloc(16 + pcsLen + data.Len() + 4)
		pcsAt, dataAt = imm+16, imm+16+uint64(pcsLen)
		j.u64(nm+l.nmImmutableData, imm)
		j.u32(nm+l.nmImmutableSize, uint32(16+pcsLen+data.Len()+4))
		j.u32(nm+l.nmScopesPCsOff, 16)
		j.u32(nm+l.nmScopesData, uint32(16+pcsLen))
		const relocs = 24
		mut := j.alloc(relocs + 8*len(meta))
		metaAt = mut + relocs
		j.u64(nm+l.blobMutable, mut)
		j.u32(nm+l.blobRelocSize, relocs)
		j.u32(nm+l.blobMutableSize, uint32(relocs+8*len(meta)))
	default:
		panic("no fake nmethod for this layout")
	}
	for i, m := range meta {
		j.u64(metaAt+uint64(8*i), m)
	}
	j.put(dataAt, data.Bytes())
	// The first PcDesc is HotSpot's sentinel at -1.
	at := pcsAt
	j.u32(at+l.pcDescPCOffset, 0xffffffff)
	for i, k := range keys {
		d := at + uint64(i+1)*l.pcDescSize
		j.u32(d+l.pcDescPCOffset, uint32(k))
		if s := pcs[k]; s >= 0 {
			j.u32(d+l.pcDescScope, uint32(offs[s]))
		}
	}
	return nm
}

func sortInt32(s []int32) {
	for i := 1; i < len(s); i++ {
		for k := i; k > 0 && s[k] < s[k-1]; k-- {
			s[k], s[k-1] = s[k-1], s[k]
		}
	}
}

// proc is a ready process over the fake memory.
func (j *fakeJVM) proc(pid int) *proc {
	return attached(&proc{pid: pid, mem: j.m, l: j.l, codeLo: j.m.base, codeHi: j.m.base + uint64(len(j.m.b))})
}

// attached marks pr as an attached process, as attach does last.
func attached(pr *proc) *proc {
	pr.ready.Store(true)
	return pr
}
