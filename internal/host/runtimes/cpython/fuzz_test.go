package cpython

import (
	"encoding/binary"
	"errors"
	"testing"

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

func (m *fakeMem) CString(addr uint64, max int) (string, error) {
	var out []byte
	for i := 0; i < max; i++ {
		var c [1]byte
		if err := m.Read(addr+uint64(i), c[:]); err != nil {
			return "", err
		}
		if c[0] == 0 {
			return string(out), nil
		}
		out = append(out, c[0])
	}
	return string(out), errors.New("long")
}

const fuzzBase = 0x10000

// fuzzAddrs puts the type objects at fixed places of the region, so that
// fuzzed pointers can name them.
var fuzzAddrs = addrs{runtime: fuzzBase, codeType: fuzzBase + 0x100, frameType: fuzzBase + 0x200,
	unicodeType: fuzzBase + 0x300, bytesType: fuzzBase + 0x400}

// seedMem lays out one sane 3.11 interpreter: runtime, interpreter,
// thread state, cframe, one frame, its code object, a str and a bytes.
func seedMem() []byte {
	b := make([]byte, 0x2000)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put(40, fuzzBase+0x800)        // interpreters.head
	put(0x800+16, fuzzBase+0x900)  // threads.head
	put(0x900+16, fuzzBase+0x800)  // interp
	put(0x900+56, fuzzBase+0xa00)  // cframe
	put(0x900+152, 0x7f0000001000) // thread_id
	put(0xa00+8, fuzzBase+0xb00)   // current_frame
	put(0xb00+32, fuzzBase+0xc00)  // f_code
	put(0xc00, 1)
	put(0xc00+8, fuzzAddrs.codeType) // code: ob_type
	put(0xc00+112, fuzzBase+0xd00)   // co_filename
	put(0xc00+120, fuzzBase+0xd00)   // co_name
	put(0xc00+128, fuzzBase+0xd00)   // co_qualname
	put(0xc00+136, fuzzBase+0xe00)   // co_linetable
	put(0xd00, 3)
	put(0xd00+8, fuzzAddrs.unicodeType) // str
	put(0xd00+16, 4)                    // length
	put(0xd00+32, 1<<2|1<<5|1<<6)       // compact ASCII
	copy(b[0xd00+48:], "leaf")          // data
	put(0xe00, 1)
	put(0xe00+8, fuzzAddrs.bytesType)      // bytes
	put(0xe00+16, 2)                       // ob_size
	copy(b[0xe00+32:], []byte{0x80, 0x00}) // one entry
	return b
}

// FuzzProcessMemory runs attach's checks and the namer over process memory
// the fuzzer writes: no panic, no unbounded allocation, names within the
// bound.
func FuzzProcessMemory(f *testing.F) {
	f.Add(seedMem()[:0xf00], uint64(fuzzBase+0xc00))
	f.Fuzz(func(t *testing.T, b []byte, code uint64) {
		if len(b) > 1<<16 {
			return
		}
		m := &fakeMem{base: fuzzBase, b: b}
		l, err := staticLayout(11)
		if err != nil {
			t.Fatal(err)
		}
		_ = checkLive(m, &l, fuzzAddrs)
		if o := findTSS(m, &l, fuzzAddrs); o < -tssBelow || o >= tssAbove {
			t.Fatalf("findTSS = %d, outside [-%d, %d)", o, tssBelow, tssAbove)
		}
		c, err := readCode(m, &l, fuzzAddrs, code, 0, 64)
		if err == nil && (len(c.name) > 64 || len(c.file) > 64 || len(c.lines) > maxLineTable) {
			t.Fatalf("name %d, file %d, table %d bytes", len(c.name), len(c.file), len(c.lines))
		}
		_, _ = members(m, &l, fuzzAddrs.codeType)
	})
}

func TestSeedMemory(t *testing.T) {
	m := &fakeMem{base: fuzzBase, b: seedMem()}
	l, _ := staticLayout(11)
	if err := checkLive(m, &l, fuzzAddrs); err != nil {
		t.Fatal(err)
	}
	c, err := readCode(m, &l, fuzzAddrs, fuzzBase+0xc00, 0, 64)
	if err != nil || c.name != "leaf" || len(c.lines) != 2 {
		t.Fatalf("%+v %v", c, err)
	}
	// A code id other than the object's: replaced since sampled.
	if _, err := readCode(m, &l, fuzzAddrs, fuzzBase+0xc00, 12345, 64); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Fatalf("code id mismatch: %v", err)
	}
	// Freed, its memory not reused yet: pymalloc's free list in its first
	// word.
	for _, rc := range []uint64{0, 0x7f12345678f0} {
		binary.LittleEndian.PutUint64(m.b[0xc00:], rc)
		if _, err := readCode(m, &l, fuzzAddrs, fuzzBase+0xc00, 0, 64); !errors.Is(err, runtimes.ErrBadFrame) {
			t.Fatalf("freed code object (refcount %#x) named: %v", rc, err)
		}
	}
}

// findTSS finds the offset from the thread pointer at which the most
// threads find their own thread state, struct pthread's first among
// equals, ignoring places where only one does, and gives up (0) when no
// thread has any.
func TestFindTSS(t *testing.T) {
	l, err := staticLayout(11)
	if err != nil {
		t.Fatal(err)
	}
	const interp, ts1, ts2, tcb1, tcb2 = 0x100, 0x200, 0x300, 0x2000, 0x3000
	b := make([]byte, 0x3800)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put(l.interpHead, fuzzBase+interp)
	put(interp+l.threadsHead, fuzzBase+ts1)
	put(ts1+l.tsNext, fuzzBase+ts2)
	put(ts1+l.tsThreadID, fuzzBase+tcb1)
	put(ts2+l.tsThreadID, fuzzBase+tcb2)
	for _, c := range [][2]uint64{{tcb1, ts1}, {tcb2, ts2}} {
		put(c[0], fuzzBase+c[0])       // the TCB's self pointer
		put(c[0]+0x318, fuzzBase+c[1]) // the key's value
	}
	put(tcb1+0x40, fuzzBase+ts1) // in one thread only
	put(tcb2+0x50, fuzzBase+ts2)
	put(tcb1-0x20, fuzzBase+ts1) // a thread-local, below
	put(tcb2-0x20, fuzzBase+ts2)
	m := &fakeMem{base: fuzzBase, b: b}
	a := addrs{runtime: fuzzBase}
	if got := findTSS(m, &l, a); got != 0x318 {
		t.Fatalf("findTSS = %#x, want 0x318 (above, preferred)", got)
	}
	put(tcb2+0x318, 0) // the second thread has no key value
	if got := findTSS(m, &l, a); got != -0x20 {
		t.Fatalf("findTSS = %#x, want -0x20 (the thread-local)", got)
	}
	put(tcb2-0x20, 0) // nor a thread-local: being started
	put(tcb2+0x50, 0)
	put(tcb1+0x40, 0)
	if got := findTSS(m, &l, a); got != 0x318 {
		t.Fatalf("findTSS = %#x with one thread started, want 0x318", got)
	}
	put(tcb1+0x318, 0)
	put(tcb1-0x20, 0)
	if got := findTSS(m, &l, a); got != 0 {
		t.Fatalf("findTSS = %#x with no thread state anywhere, want 0", got)
	}
}

// On arm64 a thread state's thread_id (pthread_self()) is tpSelf below the
// thread pointer, struct pthread lies between the two and the static TLS
// blocks above: offsets are from the thread pointer, and struct pthread's
// still comes first among equals.
func TestFindTSSBelowThreadPointer(t *testing.T) {
	l, err := staticLayout(11)
	if err != nil {
		t.Fatal(err)
	}
	const interp, ts1, ts2, tp1, tp2, self = 0x100, 0x200, 0x300, 0x2000, 0x3000, 0x740
	b := make([]byte, 0x3800)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put(l.interpHead, fuzzBase+interp)
	put(interp+l.threadsHead, fuzzBase+ts1)
	put(ts1+l.tsNext, fuzzBase+ts2)
	put(ts1+l.tsThreadID, fuzzBase+tp1-self)
	put(ts2+l.tsThreadID, fuzzBase+tp2-self)
	for _, c := range [][2]uint64{{tp1, ts1}, {tp2, ts2}} {
		put(c[0]-self+0x110, fuzzBase+c[1]) // the key's value, in struct pthread
		put(c[0]+0x30, fuzzBase+c[1])       // a thread-local, above
	}
	m := &fakeMem{base: fuzzBase, b: b}
	a := addrs{runtime: fuzzBase, tpSelf: self}
	if got := findTSS(m, &l, a); got != 0x110-self {
		t.Fatalf("findTSS = %#x, want %#x (struct pthread's, preferred)", got, 0x110-self)
	}
	put(tp2-self+0x110, 0)
	if got := findTSS(m, &l, a); got != 0x30 {
		t.Fatalf("findTSS = %#x, want 0x30 (the thread-local)", got)
	}
	if got := findTSS(m, &l, addrs{runtime: fuzzBase}); got == 0x30 {
		t.Fatal("findTSS found the thread-local with the thread pointer taken for pthread_self()")
	}
}
