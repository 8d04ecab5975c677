package cpython

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// maxLineTable bounds a line table read from a process. Real ones stay far
// below (a 10,000-line module body: ~20 KiB of 3.11 location entries).
const maxLineTable = 256 << 10

// memory is a process's memory (runtimes.Mem; a fake one in fuzz tests).
// What it returns is whatever the process put there.
type memory interface {
	Read(addr uint64, p []byte) error
	U64(addr uint64) (uint64, error)
	CString(addr uint64, max int) (string, error)
}

// codeInfo is what naming one code object's frames needs.
type codeInfo struct {
	name, file string
	first      int32
	lines      []byte // line table; nil when it could not be read
	lineErr    error  // why lines is nil
}

func (c *codeInfo) cost() int64 { return int64(len(c.name)+len(c.file)+len(c.lines)) + 96 }

// codeID is the hash the BPF walker records beside a code object (bpf/
// cpython.h): of its file and name pointers and its first line.
func codeID(filename, name uint64, first uint32) uint32 {
	return runtimes.ObjectID(filename, name, uint64(first))
}

// freed reports whether an object's first word, its reference count,
// says the object was freed: pymalloc keeps its free list there (a pointer
// into an arena, mmapped high, or 0 at the end; glibc's free lists
// overwrite ob_type as well). A live count stays below 2^32, immortal ones
// too (3.12, 3.13); 3.14 keeps flags in the top 16 bits, never in bits
// 32-47.
func freed(refcnt uint64) bool {
	return refcnt == 0 || refcnt>>32&0xffff != 0
}

// readCode reads the code object at addr. want is the code id the walker
// recorded (0: none): a code object with another id is not the one that
// ran (it was freed and its memory reused), and fails with ErrBadFrame.
func readCode(m memory, l *layout, a addrs, addr uint64, want uint32, maxName int) (*codeInfo, error) {
	var hdr [256]byte
	n := max(l.codeSize(), l.coQualname+8, l.coLines+8)
	if n > uint64(len(hdr)) {
		return nil, fmt.Errorf("code object fields past %d bytes: %w", len(hdr), errLayout)
	}
	if err := m.Read(addr, hdr[:n]); err != nil {
		return nil, err
	}
	if typ := le64(hdr[:], 8); typ != a.codeType || freed(le64(hdr[:], 0)) {
		return nil, fmt.Errorf("%#x is no (live) code object (type %#x): %w", addr, typ, runtimes.ErrBadFrame)
	}
	fileP, nameP := le64(hdr[:], l.coFilename), le64(hdr[:], l.coName)
	first := binary.LittleEndian.Uint32(hdr[l.coFirstline:])
	if id := codeID(fileP, nameP, first); want != 0 && id != want {
		return nil, fmt.Errorf("code object %#x replaced since it was sampled: %w", addr, runtimes.ErrBadFrame)
	}
	if l.coQualname != 0 {
		nameP = le64(hdr[:], l.coQualname)
	}
	c := &codeInfo{first: int32(first)}
	var err error
	// A name cut at maxName still names the frame.
	if c.name, err = readString(m, l, a, nameP, maxName); err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
		return nil, fmt.Errorf("code %#x name: %w", addr, err)
	}
	if c.file, err = readString(m, l, a, fileP, maxName); err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
		return nil, fmt.Errorf("code %#x file: %w", addr, err)
	}
	c.lines, c.lineErr = readBytes(m, a, l, le64(hdr[:], l.coLines))
	return c, nil
}

// PyASCIIObject: ob_refcnt, ob_type, length, hash, then the state bits
// (interned:2, kind:3, compact:1, ascii:1, ...).
const (
	strLength = 16
	strState  = 32
)

// readString reads a str object as UTF-8, cut at maxBytes (the cut is
// reported with frame.ErrLimitExceeded beside the string).
func readString(m memory, l *layout, a addrs, addr uint64, maxBytes int) (string, error) {
	var hdr [40]byte
	if err := m.Read(addr, hdr[:]); err != nil {
		return "", err
	}
	if typ := le64(hdr[:], 8); typ != a.unicodeType || freed(le64(hdr[:], 0)) {
		return "", fmt.Errorf("%#x is no (live) str (type %#x): %w", addr, typ, runtimes.ErrBadFrame)
	}
	length := le64(hdr[:], strLength)
	state := binary.LittleEndian.Uint32(hdr[strState:])
	kind, compact, ascii := uint64(state>>2&7), state>>5&1 != 0, state>>6&1 != 0
	if !compact || kind != 1 && kind != 2 && kind != 4 || length >= 1<<31 {
		return "", fmt.Errorf("str %#x: state %#x, length %d: %w", addr, state, length, runtimes.ErrBadFrame)
	}
	data := addr + l.compactData
	if ascii {
		data = addr + l.asciiData
	}
	// At most maxBytes code points: each is at least one UTF-8 byte.
	n := min(length, uint64(maxBytes))
	buf := make([]byte, n*kind)
	if err := m.Read(data, buf); err != nil {
		return "", err
	}
	var sb strings.Builder
	cut := n < length
	for i := uint64(0); i < n; i++ {
		var r rune
		switch kind {
		case 1:
			r = rune(buf[i])
		case 2:
			r = rune(binary.LittleEndian.Uint16(buf[2*i:]))
		default:
			r = rune(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		if !utf8.ValidRune(r) {
			r = utf8.RuneError
		}
		if sb.Len()+utf8.RuneLen(r) > maxBytes {
			cut = true
			break
		}
		sb.WriteRune(r)
	}
	if cut {
		return sb.String(), fmt.Errorf("str %#x of %d characters cut at %d bytes: %w", addr, length, maxBytes, frame.ErrLimitExceeded)
	}
	return sb.String(), nil
}

// readBytes reads a bytes object (a line table), at most maxLineTable.
func readBytes(m memory, a addrs, l *layout, addr uint64) ([]byte, error) {
	var hdr [24]byte
	if l.bytesSize+8 > uint64(len(hdr)) {
		return nil, errLayout
	}
	if err := m.Read(addr, hdr[:]); err != nil {
		return nil, err
	}
	if typ := le64(hdr[:], 8); typ != a.bytesType || freed(le64(hdr[:], 0)) {
		return nil, fmt.Errorf("line table %#x is no (live) bytes object (type %#x): %w", addr, typ, runtimes.ErrBadFrame)
	}
	size := le64(hdr[:], l.bytesSize)
	if size > maxLineTable {
		return nil, fmt.Errorf("line table of %d bytes: %w", size, frame.ErrLimitExceeded)
	}
	out := make([]byte, size)
	if err := m.Read(addr+l.bytesData, out); err != nil && size > 0 {
		return nil, err
	}
	return out, nil
}
