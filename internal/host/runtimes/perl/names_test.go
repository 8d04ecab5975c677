package perl

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// fakeMem is a process memory of one region at base: reads outside fail.
type fakeMem struct {
	base uint64
	b    []byte
}

func (m *fakeMem) Read(addr uint64, p []byte) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return runtimes.ErrBadFrame
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

func (m *fakeMem) U64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (m *fakeMem) CString(addr uint64, maxBytes int) (string, error) {
	var out []byte
	for i := 0; i < maxBytes; i++ {
		var c [1]byte
		if err := m.Read(addr+uint64(i), c[:]); err != nil {
			return "", err
		}
		if c[0] == 0 {
			return string(out), nil
		}
		out = append(out, c[0])
	}
	return string(out), frame.ErrLimitExceeded
}

const base = 0x10000

// Where seedMem puts things, from base.
const (
	offCV, offCVBody, offGV, offGVBody = 0x000, 0x100, 0x200, 0x300
	offHV, offHVBody, offHEK, offPkg   = 0x400, 0x500, 0x600, 0x700
	offFile, offCop, offInterp, offSI  = 0x800, 0x900, 0xa00, 0x1c00
	offSI2                             = 0x1d00
	seedSize                           = 0x2000
)

// seedMem lays out one sane 5.36 sub, Pkg::leaf of /x/t.pl, with a COP on
// line 12 of that file and an interpreter with a sort stackinfo over the
// main one.
func seedMem() []byte {
	l := layout536
	b := make([]byte, seedSize)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put32 := func(off uint64, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
	sv := func(off, body uint64, flags uint32) { put(off, body); put32(off+8, 1); put32(off+12, flags) }
	sv(offCV, base+offCVBody, uint32(l.typeCV))
	put(offCVBody+uint64(l.xcvGV), base+offGV)
	put(offCVBody+uint64(l.xcvFile), base+offFile)
	sv(offGV, base+offGVBody, uint32(l.typeGV))
	put(offGVBody+uint64(l.xgvNameHEK), base+offHEK)
	put(offGVBody+uint64(l.xgvStash), base+offHV)
	sv(offHV, base+offHVBody, uint32(l.typeHV)|l.svfOOK)
	put(offHVBody+uint64(l.hvAux)+uint64(l.auxName), base+offPkg)
	put32(offHEK+uint64(l.hekLen), 4)
	copy(b[offHEK+uint64(l.hekKey):], "leaf")
	put32(offPkg+uint64(l.hekLen), 3)
	copy(b[offPkg+uint64(l.hekKey):], "Pkg")
	copy(b[offFile:], "/x/t.pl\x00")
	put32(offCop+uint64(l.copLine), 12)
	put(offCop+uint64(l.copFile), base+offFile)
	put(offInterp+uint64(l.iStackinfo), base+offSI2)
	for _, si := range []uint64{offSI, offSI2} {
		put32(si+uint64(l.siCxix), 0xffffffff)
		put32(si+uint64(l.siCxmax), 3)
		put32(si+uint64(l.siType), 1)
	}
	put32(offSI2+uint64(l.siType), 6) // PERLSI_SORT
	put(offSI2+uint64(l.siPrev), base+offSI)
	return b
}

func seedID(b []byte) uint32 {
	l := layout536
	gv := binary.LittleEndian.Uint64(b[offCVBody+uint64(l.xcvGV):])
	file := binary.LittleEndian.Uint64(b[offCVBody+uint64(l.xcvFile):])
	return subID(gv, file)
}

func TestReadSub(t *testing.T) {
	b := seedMem()
	m := &fakeMem{base: base, b: b}
	l := layout536
	n, err := readSub(m, &l, base+offCV, seedID(b), 64)
	if err != nil || n.name != "Pkg::leaf" || n.file != "/x/t.pl" {
		t.Fatalf("readSub: %+v, %v", n, err)
	}
	// A CV freed and reused by another sub: its GV is another.
	if _, err := readSub(m, &l, base+offCV, seedID(b)+1, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("another id: %v, want %v", err, runtimes.ErrBadFrame)
	}
	// Freed: no type.
	b[offCV+12] = 0xff
	if _, err := readSub(m, &l, base+offCV, seedID(b), 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("freed CV: %v, want %v", err, runtimes.ErrBadFrame)
	}
}

func TestReadSubLongName(t *testing.T) {
	b := seedMem()
	l := layout536
	binary.LittleEndian.PutUint32(b[offHEK+uint64(l.hekLen):], 200)
	copy(b[offHEK+uint64(l.hekKey):], strings.Repeat("n", 200))
	m := &fakeMem{base: base, b: b}
	n, err := readSub(m, &l, base+offCV, seedID(b), 32)
	if err != nil || len(n.name) > 32 || !strings.HasPrefix(n.name, "Pkg::nnn") {
		t.Fatalf("readSub: %+v, %v", n, err)
	}
	// A HEK that says it is longer than anything Perl makes.
	binary.LittleEndian.PutUint32(b[offHEK+uint64(l.hekLen):], 1<<30)
	if _, err := readSub(m, &l, base+offCV, seedID(b), 32); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("a 1 GiB name: %v, want %v", err, runtimes.ErrBadFrame)
	}
}

func TestReadCop(t *testing.T) {
	b := seedMem()
	m := &fakeMem{base: base, b: b}
	l := layout536
	n, err := readCop(m, &l, base+offCop, 12, "main", 64)
	if err != nil || n.name != "main" || n.file != "/x/t.pl" {
		t.Fatalf("readCop: %+v, %v", n, err)
	}
	if _, err := readCop(m, &l, base+offCop, 13, "main", 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("another line: %v, want %v", err, runtimes.ErrBadFrame)
	}
}

func TestCheckLive(t *testing.T) {
	b := seedMem()
	m := &fakeMem{base: base, b: b}
	l := layout536
	if err := checkLive(m, &l, base+offInterp); err != nil {
		t.Fatalf("checkLive: %v", err)
	}
	// A chain that loops.
	binary.LittleEndian.PutUint64(b[offSI+uint64(l.siPrev):], base+offSI2)
	if err := checkLive(m, &l, base+offInterp); !errors.Is(err, errUnsupported) {
		t.Errorf("a loop: %v, want %v", err, errUnsupported)
	}
	// The outermost one is not the main one.
	b = seedMem()
	binary.LittleEndian.PutUint32(b[offSI+uint64(l.siType):], 6)
	if err := checkLive(&fakeMem{base: base, b: b}, &l, base+offInterp); !errors.Is(err, errUnsupported) {
		t.Errorf("no main stackinfo: %v, want %v", err, errUnsupported)
	}
}

// TestSubIDMatchesWalker pins subID to bpf/perl.h's hash (mix of
// unwind.h over xcv_gv_u, xcv_file, folded to 32 bits, 0 made 1).
func TestSubIDMatchesWalker(t *testing.T) {
	mix := func(h, v uint64) uint64 {
		h ^= v
		h *= 0x100000001b3
		return h ^ h>>29
	}
	gv, file := uint64(0x55aa00001000), uint64(0x55aa00002000)
	h := mix(mix(0xcbf29ce484222325, gv), file)
	if want := uint32(h ^ h>>32); subID(gv, file) != want || want == 0 {
		t.Fatalf("subID %#x, want %#x", subID(gv, file), want)
	}
}

// TestLayoutsToWalker checks every layout fits the walker's bounds.
func TestLayoutsToWalker(t *testing.T) {
	for minor, l := range layouts {
		p := l.bpf(1, 2)
		if p.Valid != 1 || p.CxSize == 0 || p.CxSize > uint16(bpf.ProfilePerlLimitsPERL_CX_READ) {
			t.Errorf("5.%d: %+v", minor, p)
		}
		for _, off := range []uint16{p.CxOldcop, p.CxRetop, p.CxOldsubix, p.CxCv} {
			if off+8 > p.CxSize {
				t.Errorf("5.%d: a context field at %d past the context's %d bytes", minor, off, p.CxSize)
			}
		}
	}
	if _, err := layoutOf(38); !errors.Is(err, errUnsupported) {
		t.Errorf("5.38: %v, want %v", err, errUnsupported)
	}
}

// FuzzNames reads subs, COPs and interpreters from fuzzed memory: no
// panic, no name past its bound.
func FuzzNames(f *testing.F) {
	f.Add(seedMem(), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, id uint32) {
		if len(b) > 1<<16 {
			return
		}
		m := &fakeMem{base: base, b: b}
		l := layout536
		for _, addr := range []uint64{base + offCV, base, base + 8} {
			want := id
			if len(b) == seedSize && want == 0 {
				want = seedID(b)
			}
			if n, err := readSub(m, &l, addr, want, 48); err == nil && (len(n.name) > 48 || len(n.file) > 48) {
				t.Fatalf("name %d bytes, file %d", len(n.name), len(n.file))
			}
			if n, err := readCop(m, &l, addr+offCop, id, "main", 48); err == nil && len(n.file) > 48 {
				t.Fatalf("file %d bytes", len(n.file))
			}
		}
		_ = checkLive(m, &l, base+offInterp)
	})
}
