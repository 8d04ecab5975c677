package cpython

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// addrs are an interpreter's objects in one process.
type addrs struct {
	runtime, codeType, frameType, unicodeType, bytesType uint64
	// tss is where a thread's PyThreadState is from its thread pointer
	// (findTSS); 0: not found, the walker searches the thread lists.
	tss int64
	// tpSelf is the thread pointer less pthread_self(), the value of a
	// thread state's thread_id (threadSelf).
	tpSelf uint64
}

func (fi *fileInfo) addrs(bias uint64) addrs {
	return addrs{
		runtime: fi.runtime + bias, codeType: fi.codeType + bias, frameType: fi.frameType + bias,
		unicodeType: fi.unicodeType + bias, bytesType: fi.bytesType + bias,
	}
}

// errNotReady: the interpreter has not set itself up yet (no interpreter
// or thread state, no frame anywhere): attach again later.
var errNotReady = errors.New("interpreter not initialized yet")

// Bounds of what attach reads.
const (
	maxMembers      = 64   // PyMemberDef entries of a type
	maxThreadStates = 4096 // thread states of one interpreter
	maxCheckThreads = 64   // threads whose frame chains are checked
	maxCheckFrames  = 256  // frames checked per chain
)

// members reads the names and offsets a type lists in tp_members: the
// interpreter's own account of where its objects' fields are.
func members(m memory, l *layout, typ uint64) (map[string]uint64, error) {
	arr, err := m.U64(typ + l.typeMembers)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for i := uint64(0); i < maxMembers && arr != 0; i++ {
		e := arr + i*l.memberSize
		name, err := m.U64(e + l.memberName)
		if err != nil {
			return nil, err
		}
		if name == 0 {
			return out, nil
		}
		s, err := m.CString(name, 64)
		if err != nil {
			return nil, err
		}
		off, err := m.U64(e + l.memberOffset)
		if err != nil {
			return nil, err
		}
		out[s] = off
	}
	return out, nil
}

// fromMembers completes l with the code object's (and 3.9's frame
// object's) field offsets as the interpreter's types list them, and checks
// those the layout already has against them.
func fromMembers(m memory, l *layout, a addrs) error {
	code, err := members(m, l, a.codeType)
	if err != nil {
		return fmt.Errorf("PyCode_Type members: %w", err)
	}
	lines := "co_linetable"
	if l.lines == linesLnotab {
		lines = "co_lnotab"
	}
	fields := map[string]*uint64{
		"co_filename": &l.coFilename, "co_name": &l.coName,
		"co_firstlineno": &l.coFirstline, lines: &l.coLines,
	}
	if l.minor >= 11 {
		fields["co_qualname"] = &l.coQualname
	}
	if err := take(code, fields, l.minor >= 13); err != nil {
		return fmt.Errorf("PyCode_Type: %w", err)
	}
	if l.minor >= 11 {
		// The code units start where the fixed part ends.
		basic, err := m.U64(a.codeType + l.typeBasic)
		if err != nil {
			return err
		}
		if basic != l.coCode {
			return fmt.Errorf("PyCode_Type.tp_basicsize %d, co_code_adaptive at %d: %w", basic, l.coCode, errLayout)
		}
	}
	if l.kind == uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS) {
		frame, err := members(m, l, a.frameType)
		if err != nil {
			return fmt.Errorf("PyFrame_Type members: %w", err)
		}
		fields := map[string]*uint64{"f_back": &l.fBack, "f_code": &l.fCode}
		if l.minor <= 9 {
			fields["f_lasti"] = &l.fInstr // a getter from 3.10
		}
		if err := take(frame, fields, false); err != nil {
			return fmt.Errorf("PyFrame_Type: %w", err)
		}
	}
	return l.check()
}

// take sets each field from the members list; with onlyCheck, fields the
// layout knows from _Py_DebugOffsets must agree instead.
func take(ms map[string]uint64, fields map[string]*uint64, onlyCheck bool) error {
	for name, dst := range fields {
		v, ok := ms[name]
		switch {
		case !ok && onlyCheck:
		case !ok:
			return fmt.Errorf("no member %s: %w", name, errLayout)
		case onlyCheck && v != *dst:
			return fmt.Errorf("member %s at %d, debug offsets say %d: %w", name, v, *dst, errLayout)
		case v != *dst && *dst != 0:
			return fmt.Errorf("member %s at %d, %d expected for this version: %w", name, v, *dst, errLayout)
		default:
			*dst = v
		}
	}
	return nil
}

// checkLive checks the layout against the live process: the interpreter's
// thread list links back to it, thread ids look like thread pointers, and
// every frame of (up to maxCheckThreads) threads' chains runs a code object
// whose name and file are strings. It returns errNotReady when there is
// nothing to check yet.
func checkLive(m memory, l *layout, a addrs) error {
	interp, err := m.U64(a.runtime + l.interpHead)
	if err != nil {
		return err
	}
	if interp == 0 {
		return errNotReady
	}
	ts, err := m.U64(interp + l.threadsHead)
	if err != nil {
		return err
	}
	if ts == 0 {
		return errNotReady
	}
	seen := map[uint64]bool{}
	var threads []uint64
	for ; ts != 0; ts, err = m.U64(ts + l.tsNext) {
		if err != nil {
			return err
		}
		if seen[ts] || len(seen) >= maxThreadStates {
			return fmt.Errorf("thread state list loops or runs past %d: %w", maxThreadStates, errLayout)
		}
		seen[ts] = true
		back, err := m.U64(ts + l.tsInterp)
		if err != nil {
			return err
		}
		if back != interp {
			return fmt.Errorf("thread state %#x belongs to interpreter %#x, not %#x: %w", ts, back, interp, errLayout)
		}
		id, err := m.U64(ts + l.tsThreadID)
		if err != nil {
			return err
		}
		// pthread_self(): a user address, 0 while the thread is created.
		if id >= runtimes.UserTop || id != 0 && id < 1<<16 {
			return fmt.Errorf("thread state %#x: thread id %#x is no thread pointer: %w", ts, id, errLayout)
		}
		threads = append(threads, ts)
	}
	frames := 0
	for _, ts := range threads[:min(len(threads), maxCheckThreads)] {
		n, err := checkChain(m, l, a, ts)
		if err != nil {
			return err
		}
		frames += n
	}
	if frames == 0 {
		return errNotReady
	}
	return nil
}

// checkChain follows one thread's frame chain and returns how many code
// objects it checked.
func checkChain(m memory, l *layout, a addrs, ts uint64) (int, error) {
	f, err := m.U64(ts + l.tsFrame)
	if err != nil {
		return 0, err
	}
	if l.cframe && f != 0 {
		if f, err = m.U64(f + l.cframeFrame); err != nil {
			return 0, err
		}
	}
	n := 0
	seen := map[uint64]bool{}
	for i := 0; f != 0 && i < maxCheckFrames; i++ {
		if seen[f] {
			return n, fmt.Errorf("frame chain of thread state %#x loops at %#x: %w", ts, f, errLayout)
		}
		seen[f] = true
		var b [bpf.ProfileCpythonLimitsCPY_FRAME_READ]byte
		buf := b[:l.frameSize()]
		if err := m.Read(f, buf); err != nil {
			return n, err
		}
		next := le64(buf, l.fBack)
		if l.kind == uint32(bpf.ProfileCpythonLayoutCPY_ENTRY_SHIM) && uint64(buf[l.fEntry]) >= l.entryVal {
			f = next
			continue
		}
		code := le64(buf, l.fCode) & l.codeMask
		if err := checkCode(m, l, a, code); err != nil {
			return n, fmt.Errorf("frame %#x: %w", f, err)
		}
		n++
		f = next
	}
	return n, nil
}

// checkCode checks that code is a code object whose name and file are
// strings.
func checkCode(m memory, l *layout, a addrs, code uint64) error {
	typ, err := m.U64(code + 8)
	if err != nil {
		return err
	}
	if typ != a.codeType {
		return fmt.Errorf("f_code %#x is no code object (type %#x): %w", code, typ, errLayout)
	}
	for _, off := range []uint64{l.coName, l.coFilename} {
		s, err := m.U64(code + off)
		if err != nil {
			return err
		}
		if t, err := m.U64(s + 8); err != nil || t != a.unicodeType {
			return fmt.Errorf("code %#x: field at %d is no string: %w", code, off, errLayout)
		}
	}
	return nil
}

func le64(b []byte, off uint64) uint64 {
	if off+8 > uint64(len(b)) {
		return 0
	}
	return uint64(b[off]) | uint64(b[off+1])<<8 | uint64(b[off+2])<<16 | uint64(b[off+3])<<24 |
		uint64(b[off+4])<<32 | uint64(b[off+5])<<40 | uint64(b[off+6])<<48 | uint64(b[off+7])<<56
}

// Bounds of findTSS: what it searches around a thread pointer, struct
// pthread above it and the static TLS blocks below (the executable's first,
// then the libraries' loaded with it).
const (
	tssThreads = 16   // threads searched
	tssBelow   = 4096 // bytes searched below a thread pointer
	tssAbove   = 2048 // and from it up
	tssChunk   = 256  // read at a time: the search stops at the first unreadable
)

// findTSS finds where, from a thread's thread pointer, CPython keeps the
// thread's own thread state: the value of its pthread key (autoTLSkey in
// 3.6, autoTSSkey from 3.7), which glibc keeps in struct pthread for a key
// below 32, or a thread-local (3.15's _Py_tss_gilstate), the same offset in
// every thread. The thread pointer is the thread state's thread_id
// (pthread_self()) plus a.tpSelf. It returns the offset at which
// the most of the listed threads (up to tssThreads, the first
// interpreter's) find their own thread state (a thread being started has
// its id before its key's value), preferring struct pthread's among equals
// (a key's value stays while the thread waits; 3.12+'s _Py_tss_tstate,
// in the static TLS blocks, is NULL then), then the nearest; 0 when there is none (musl
// keeps keys elsewhere; a large key is in a second-level block): the
// walker then searches the lists. The walker checks the thread id of what
// it finds on every use, so a wrong offset costs a search, never a wrong
// thread.
func findTSS(m memory, l *layout, a addrs) int64 {
	interp, err := m.U64(a.runtime + l.interpHead)
	if err != nil || interp == 0 {
		return 0
	}
	ts, err := m.U64(interp + l.threadsHead)
	if err != nil {
		return 0
	}
	votes := map[int64]int{}
	buf := make([]byte, tssChunk)
	for n := 0; ts != 0 && n < tssThreads; n++ {
		id, err := m.U64(ts + l.tsThreadID)
		if err != nil {
			return 0
		}
		if tp := id + a.tpSelf; tp > tssBelow && tp < runtimes.UserTop {
			search := func(from, to int64, step int64) {
				for off := from; off != to; off += step {
					start := off
					if step < 0 {
						start = off - tssChunk
					}
					if m.Read(uint64(int64(tp)+start), buf) != nil {
						return
					}
					for i := 0; i+8 <= len(buf); i += 8 {
						// Not 0: the thread pointer's first word is itself.
						if o := start + int64(i); o != 0 && binary.LittleEndian.Uint64(buf[i:]) == ts {
							votes[o]++
						}
					}
				}
			}
			search(0, tssAbove, tssChunk)
			search(0, -tssBelow, -tssChunk)
		}
		if ts, err = m.U64(ts + l.tsNext); err != nil {
			return 0
		}
	}
	// Among equals: struct pthread's (above the thread pointer on x86-64,
	// below it on arm64), then the nearest.
	inPthread := func(o int64) bool {
		if a.tpSelf == 0 {
			return o > 0
		}
		return o < 0 && o >= -int64(a.tpSelf)
	}
	dist := func(o int64) int64 { return max(o, -o) }
	best := int64(0)
	for o, n := range votes {
		switch {
		case best == 0 || n > votes[best]:
			best = o
		case n < votes[best]:
		case inPthread(o) != inPthread(best):
			if inPthread(o) {
				best = o
			}
		case dist(o) < dist(best):
			best = o
		}
	}
	return best
}
