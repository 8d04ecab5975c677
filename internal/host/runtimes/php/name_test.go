package php

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/host/normalize"
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

const (
	memBase = 0x10000
	// Where seedMem puts things (offsets from memBase).
	offEG      = 0x000 // &current_execute_data
	offEx      = 0x100 // the {main} frame
	offEx2     = 0x180 // Chain::mid, called from {main}
	offFunc    = 0x200 // {main}'s op_array
	offFunc2   = 0x300 // Chain::mid's
	offClass   = 0x400
	offStrFile = 0x500
	offStrMid  = 0x600
	offStrCls  = 0x700
	offOpline  = 0x800
	offBuiltin = 0x900 // strlen, 64 bytes at the region's end
	memSize    = 0x940
)

// seedMem lays out a PHP 8.2 process that runs Chain::mid from {main}, and
// a built-in function at the very end of the region.
func seedMem(l *layout) []byte {
	b := make([]byte, memSize)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put32 := func(off uint64, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
	str := func(off uint64, s string) {
		put32(off+uint64(l.strType), isString)
		put(off+uint64(l.strLen), uint64(len(s)))
		copy(b[off+uint64(l.strVal):], s)
	}
	put(offEG, memBase+offEx2)
	put(offEx+uint64(l.exFunc), memBase+offFunc)
	put32(offEx+uint64(l.exInfo), l.callTop)
	put(offEx2+uint64(l.exFunc), memBase+offFunc2)
	put(offEx2+uint64(l.exPrev), memBase+offEx)
	put(offEx2+uint64(l.exOpline), memBase+offOpline)
	b[offFunc], b[offFunc2], b[offBuiltin] = typeUser, typeUser, typeInternal
	put(offFunc+uint64(l.fnFilename), memBase+offStrFile)
	put32(offFunc+uint64(l.fnLineStart), 1)
	put(offFunc2+uint64(l.fnName), memBase+offStrMid)
	put(offFunc2+uint64(l.fnScope), memBase+offClass)
	put(offFunc2+uint64(l.fnFilename), memBase+offStrFile)
	put32(offFunc2+uint64(l.fnLineStart), 68)
	put(offClass+uint64(l.ceName), memBase+offStrCls)
	put(offBuiltin+uint64(l.fnName), memBase+offStrFile) // any string
	str(offStrFile, "/srv/app.php")
	str(offStrMid, "mid")
	str(offStrCls, "Chain")
	put32(offOpline+uint64(l.opLineno), 70)
	return b
}

func mustLayout(t testing.TB, major, minor int) layout {
	l, err := layoutFor(major, minor)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.check(); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestReadFunc(t *testing.T) {
	for _, v := range [][2]int{{8, 2}, {8, 4}} {
		l := mustLayout(t, v[0], v[1])
		m := &fakeMem{base: memBase, b: seedMem(&l)}
		if err := checkLive(m, &l, memBase+offEG, 64); err != nil {
			t.Fatalf("%v: live check: %v", v, err)
		}
		for _, c := range []struct {
			off        uint64
			name, file string
			first      uint32
			builtin    bool
		}{
			{offFunc, "{main}", "/srv/app.php", 1, false},
			{offFunc2, "Chain::mid", "/srv/app.php", 68, false},
			{offBuiltin, "/srv/app.php", "", 0, true},
		} {
			f, err := readFunc(m, &l, memBase+c.off, 0, 64)
			if err != nil {
				t.Fatalf("%v %s: %v", v, c.name, err)
			}
			if f.name != c.name || f.file != c.file || f.first != c.first || f.builtin != c.builtin {
				t.Errorf("%v: %+v, want %+v", v, *f, c)
			}
		}
		// The id the walker records: the same function passes, one
		// whose memory now holds another fails.
		b := m.b[offFunc2:]
		id := funcID(typeUser, le64(b, l.fnName), le64(b, l.fnScope), le64(b, l.fnFilename), 68)
		if _, err := readFunc(m, &l, memBase+offFunc2, id, 64); err != nil {
			t.Errorf("%v: with its id: %v", v, err)
		}
		binary.LittleEndian.PutUint64(m.b[offFunc2+uint64(l.fnName):], memBase+offStrCls)
		if _, err := readFunc(m, &l, memBase+offFunc2, id, 64); !errors.Is(err, runtimes.ErrBadFrame) {
			t.Errorf("%v: a replaced function: %v, want %v", v, err, runtimes.ErrBadFrame)
		}
	}
}

// A {main} frame is named from its filename string: the one sampled
// passes; a string whose hash or length changed since (freed and reused)
// is a bad frame, never another file's name.
func TestReadMain(t *testing.T) {
	l := mustLayout(t, 8, 2)
	m := &fakeMem{base: memBase, b: seedMem(&l)}
	str := uint64(memBase + offStrFile)
	binary.LittleEndian.PutUint64(m.b[offStrFile+uint64(l.strHash):], 0x9e3779b97f4a7c15)
	id := mainID(str, 0x9e3779b97f4a7c15, uint64(len("/srv/app.php")))
	f, err := readMain(m, &l, str, id, 64)
	if err != nil || f.name != mainName || f.file != "/srv/app.php" || f.builtin {
		t.Fatalf("readMain: %+v, %v", f, err)
	}
	if f, err := readMain(m, &l, str, id, 8); err != nil || f.file != "/srv/app" {
		t.Errorf("cut at 8 bytes: %+v, %v", f, err)
	}
	binary.LittleEndian.PutUint64(m.b[offStrFile+uint64(l.strHash):], 1)
	if _, err := readMain(m, &l, str, id, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("another string's hash: %v, want %v", err, runtimes.ErrBadFrame)
	}
	if _, err := readMain(m, &l, memBase+memSize-4, id, 64); err == nil {
		t.Error("a string past the memory read")
	}
	// Freed: ZendMM's free list pointer over the header.
	binary.LittleEndian.PutUint64(m.b[offStrFile+uint64(l.strHash):], 0x9e3779b97f4a7c15)
	binary.LittleEndian.PutUint64(m.b[offStrFile:], 0x00007f3a12345678)
	if _, err := readMain(m, &l, str, id, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("a freed string: %v, want %v", err, runtimes.ErrBadFrame)
	}
	if mainID(str, 1, 2) == mainID(str+8, 1, 2) || mainID(str, 1, 2) == 0 {
		t.Error("mainID ignores the string's address")
	}
}

// A name longer than max is cut; a length past maxString, or a function
// of no known type, is a bad frame.
func TestReadFuncHostile(t *testing.T) {
	l := mustLayout(t, 8, 2)
	b := seedMem(&l)
	binary.LittleEndian.PutUint64(b[offStrFile+uint64(l.strLen):], 0x100)
	m := &fakeMem{base: memBase, b: b}
	f, err := readFunc(m, &l, memBase+offFunc2, 0, 16)
	if err != nil || len(f.name) > 16 || len(f.file) > 16 {
		t.Fatalf("cut names: %+v, %v", f, err)
	}
	binary.LittleEndian.PutUint64(b[offStrMid+uint64(l.strLen):], 1<<40)
	if _, err := readFunc(m, &l, memBase+offFunc2, 0, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("a name of 2^40 bytes: %v", err)
	}
	b[offFunc] = 9
	if _, err := readFunc(m, &l, memBase+offFunc, 0, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("type 9: %v", err)
	}
	// A frame that is its own caller.
	b = seedMem(&l)
	m = &fakeMem{base: memBase, b: b}
	binary.LittleEndian.PutUint64(b[offEx2+uint64(l.exPrev):], memBase+offEx2)
	if err := checkLive(m, &l, memBase+offEG, 64); !errors.Is(err, errLayout) {
		t.Errorf("a loop: %v", err)
	}
}

// funcID must be what bpf/php.h's php_func_id computes: pinned values.
func TestFuncID(t *testing.T) {
	if got := funcID(typeUser, 0x1000, 0x2000, 0x3000, 7); got != funcID(typeUser, 0x1000, 0x2000, 0x3000, 7) || got == 0 {
		t.Fatal("not stable")
	}
	if funcID(typeInternal, 1, 2, 3, 4) != funcID(typeInternal, 1, 2, 5, 6) {
		t.Error("a built-in's id depends on the op_array fields it has not")
	}
	if funcID(typeUser, 1, 2, 3, 4) == funcID(typeUser, 1, 2, 3, 5) {
		t.Error("a user function's id ignores its first line")
	}
}

func TestLayouts(t *testing.T) {
	for v, l := range layouts {
		if err := l.check(); err != nil {
			t.Errorf("%v: %v", v, err)
		}
	}
	if _, err := layoutFor(8, 3); !errors.Is(err, errUnsupported) {
		t.Errorf("8.3: %v", err)
	}
}

func TestNames(t *testing.T) {
	for name, want := range map[string]bool{
		"php": true, "php8.2": true, "php-fpm8.4": true, "php-cgi": true, "libphp8.2.so": true, "libphp.so": true,
		"phpize": false, "php8.2.ini": false, "libphp8.2.so.bak": false, "python3": false, "myphp": false,
	} {
		if got := nameRE.MatchString(name); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	p := &normalize.Process{Mappings: []normalize.Mapping{
		{Path: "/usr/sbin/php-fpm8.2", File: &normalize.FileInfo{}},
		{Path: "/usr/lib/libphp8.2.so", File: &normalize.FileInfo{}},
	}}
	if c, ok := findCandidate(p); !ok || !c.lib || !strings.HasSuffix(c.m.Path, "libphp8.2.so") {
		t.Errorf("candidate %+v %v, want the library", c, ok)
	}
}

// FuzzReadFunc feeds readFunc and checkLive hostile memory: no panic, no
// hang, bounded names.
func FuzzReadFunc(f *testing.F) {
	l := mustLayout(f, 8, 2)
	f.Add(seedMem(&l), uint16(offFunc2))
	f.Add(seedMem(&l), uint16(offBuiltin))
	f.Fuzz(func(t *testing.T, b []byte, off uint16) {
		m := &fakeMem{base: memBase, b: b}
		fi, err := readFunc(m, &l, memBase+uint64(off), 0, 32)
		if err == nil && (len(fi.name) > 32 || len(fi.file) > 32) {
			t.Fatalf("names past the bound: %d, %d", len(fi.name), len(fi.file))
		}
		_ = checkLive(m, &l, memBase+uint64(off), 32)
		str := memBase + uint64(off)
		hash, _ := m.U64(str + uint64(l.strHash))
		n, _ := m.U64(str + uint64(l.strLen))
		if fi, err := readMain(m, &l, str, mainID(str, hash, n), 32); err == nil && len(fi.file) > 32 {
			t.Fatalf("file name past the bound: %d", len(fi.file))
		}
	})
}
