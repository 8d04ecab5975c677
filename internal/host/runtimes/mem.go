package runtimes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/profsym/profsym/internal/frame"
)

// MaxRead bounds one read of process memory.
const MaxRead = 1 << 20

// Mem reads one process's memory through /proc/PID/mem. What it reads is
// whatever the process put there: every length and pointer taken from it
// is checked by the caller, and every read here is bounded.
type Mem struct {
	pid int
	f   *os.File
}

// OpenMem opens pid's memory under procRoot ("" means /proc).
func OpenMem(procRoot string, pid int) (*Mem, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mem"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrProcessGone)
		}
		return nil, err
	}
	return &Mem{pid: pid, f: f}, nil
}

// Close releases the file.
func (m *Mem) Close() error { return m.f.Close() }

// Read fills p from addr, or fails: a short read is an error.
func (m *Mem) Read(addr uint64, p []byte) error {
	if len(p) > MaxRead {
		return fmt.Errorf("read of %d bytes at %#x: %w", len(p), addr, frame.ErrLimitExceeded)
	}
	if addr == 0 || addr > 1<<63 || addr+uint64(len(p)) < addr {
		return fmt.Errorf("read at %#x: %w", addr, ErrBadFrame)
	}
	n, err := m.f.ReadAt(p, int64(addr))
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if _, serr := os.Stat(m.f.Name()); serr != nil {
		return fmt.Errorf("pid %d: %w", m.pid, ErrProcessGone)
	}
	return fmt.Errorf("pid %d: reading %d bytes at %#x: %v: %w", m.pid, len(p), addr, err, ErrBadFrame)
}

// U64 reads a native-endian 64-bit word.
func (m *Mem) U64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// U32 reads a native-endian 32-bit word.
func (m *Mem) U32(addr uint64) (uint32, error) {
	var b [4]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint32(b[:]), nil
}

// U16 reads a native-endian 16-bit word.
func (m *Mem) U16(addr uint64) (uint16, error) {
	var b [2]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint16(b[:]), nil
}

// CString reads a NUL-terminated string of at most max bytes; a longer
// one is cut there and reported with frame.ErrLimitExceeded next to it.
func (m *Mem) CString(addr uint64, max int) (string, error) {
	const chunk = 256
	var out []byte
	buf := make([]byte, chunk)
	for len(out) < max {
		n := min(chunk, max-len(out))
		// A read that crosses into an unmapped page fails as a whole:
		// retry up to the page end.
		if err := m.Read(addr, buf[:n]); err != nil {
			pageLeft := int(4096 - addr%4096)
			if pageLeft >= n {
				return "", err
			}
			n = pageLeft
			if err := m.Read(addr, buf[:n]); err != nil {
				return "", err
			}
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		out = append(out, buf[:n]...)
		addr += uint64(n)
	}
	return string(out), fmt.Errorf("string at %#x longer than %d bytes: %w", addr, max, frame.ErrLimitExceeded)
}
