package perl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// memory is a process's memory (runtimes.Mem; a fake one in tests). What
// it returns is whatever the process put there.
type memory interface {
	Read(addr uint64, p []byte) error
	U64(addr uint64) (uint64, error)
	CString(addr uint64, maxBytes int) (string, error)
}

type nameKey struct {
	pid  int
	kind uint8
	addr uint64
	id   uint32 // a sub's id (bpf/perl.h), a COP's line
}

// nameInfo is what naming one CV's or COP's frames needs.
type nameInfo struct {
	name, file string
}

func (n *nameInfo) cost() int64 { return int64(len(n.name)+len(n.file)) + 64 }

// subID is the id the BPF walker records beside a CV (bpf/perl.h): a
// hash of its xcv_gv_u and xcv_file pointers.
func subID(gv, file uint64) uint32 {
	return runtimes.ObjectID(gv, file)
}

// maxNameCount bounds a stash's name list (xhv_name_count).
const maxNameCount = 1 << 10

// sv is an SV head: its body and flags.
func readSV(m memory, addr uint64, typ uint8) (body uint64, flags uint32, err error) {
	var b [16]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, 0, err
	}
	body = binary.LittleEndian.Uint64(b[0:])
	refcnt := binary.LittleEndian.Uint32(b[8:])
	flags = binary.LittleEndian.Uint32(b[12:])
	if uint8(flags) != typ || refcnt == 0 || body == 0 {
		return 0, 0, fmt.Errorf("SV at %#x: type %d, %d references, body %#x, want type %d: %w",
			addr, uint8(flags), refcnt, body, typ, runtimes.ErrBadFrame)
	}
	return body, flags, nil
}

// readHEK reads a hash key: its length, then its bytes.
func readHEK(m memory, addr uint64, l *layout, maxBytes int) (string, error) {
	var b [4]byte
	if addr == 0 {
		return "", fmt.Errorf("no HEK: %w", runtimes.ErrBadFrame)
	}
	if err := m.Read(addr+uint64(l.hekLen), b[:]); err != nil {
		return "", err
	}
	n := int32(binary.LittleEndian.Uint32(b[:]))
	if n < 0 || n > 1<<20 {
		return "", fmt.Errorf("HEK at %#x: length %d: %w", addr, n, runtimes.ErrBadFrame)
	}
	var cut error
	if int(n) > maxBytes {
		n, cut = int32(maxBytes), fmt.Errorf("name at %#x longer than %d bytes: %w", addr, maxBytes, frame.ErrLimitExceeded)
	}
	buf := make([]byte, n)
	if err := m.Read(addr+uint64(l.hekKey), buf); err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(buf), "\uFFFD"), cut
}

// stashName is HvNAME of a stash (a package's symbol table).
func stashName(m memory, l *layout, hv uint64, maxBytes int) (string, error) {
	body, flags, err := readSV(m, hv, l.typeHV)
	if err != nil {
		return "", err
	}
	if flags&l.svfOOK == 0 {
		return "", fmt.Errorf("stash at %#x has no aux part: %w", hv, runtimes.ErrBadFrame)
	}
	aux := body + uint64(l.hvAux)
	name, err := m.U64(aux + uint64(l.auxName))
	if err != nil {
		return "", err
	}
	var cb [4]byte
	if err := m.Read(aux+uint64(l.auxNameCount), cb[:]); err != nil {
		return "", err
	}
	count := int32(binary.LittleEndian.Uint32(cb[:]))
	if count != 0 {
		// A list of names (a stash with aliases): the first effective.
		if count > maxNameCount || count < -maxNameCount || name == 0 {
			return "", fmt.Errorf("stash at %#x: %d names: %w", hv, count, runtimes.ErrBadFrame)
		}
		i := uint64(0)
		if count < 0 {
			i = 1
		}
		if name, err = m.U64(name + 8*i); err != nil {
			return "", err
		}
	}
	return readHEK(m, name, l, maxBytes)
}

// readSub names the CV at addr, checking it is still the one the walker
// saw (id).
func readSub(m memory, l *layout, addr uint64, id uint32, maxBytes int) (*nameInfo, error) {
	body, _, err := readSV(m, addr, l.typeCV)
	if err != nil {
		return nil, err
	}
	gv, err := m.U64(body + uint64(l.xcvGV))
	if err != nil {
		return nil, err
	}
	file, err := m.U64(body + uint64(l.xcvFile))
	if err != nil {
		return nil, err
	}
	if got := subID(gv, file); got != id {
		return nil, fmt.Errorf("CV at %#x: id %#x, sampled %#x (freed and reused): %w", addr, got, id, runtimes.ErrBadFrame)
	}
	var fb [4]byte
	if err := m.Read(body+uint64(l.xcvFlags), fb[:]); err != nil {
		return nil, err
	}
	var pkg, sub string
	var cut error
	if binary.LittleEndian.Uint32(fb[:])&l.cvfNamed != 0 {
		// A lexical sub: xcv_gv_u is its name, the package is CvSTASH.
		if sub, err = readHEK(m, gv, l, maxBytes); err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
			return nil, err
		}
		cut = err
		stash, err := m.U64(body + uint64(l.xcvStash))
		if err != nil {
			return nil, err
		}
		if stash != 0 {
			pkg, err = stashName(m, l, stash, maxBytes)
		}
		cut = errors.Join(cut, err)
	} else {
		gbody, _, err := readSV(m, gv, l.typeGV)
		if err != nil {
			return nil, err
		}
		hek, err := m.U64(gbody + uint64(l.xgvNameHEK))
		if err != nil {
			return nil, err
		}
		if sub, err = readHEK(m, hek, l, maxBytes); err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
			return nil, err
		}
		cut = err
		stash, err := m.U64(gbody + uint64(l.xgvStash))
		if err != nil {
			return nil, err
		}
		if stash != 0 {
			pkg, err = stashName(m, l, stash, maxBytes)
		}
		cut = errors.Join(cut, err)
	}
	if cut != nil && !errors.Is(cut, frame.ErrLimitExceeded) {
		return nil, cut
	}
	n := &nameInfo{name: sub}
	if pkg != "" {
		n.name = pkg + "::" + sub
	}
	if len(n.name) > maxBytes {
		n.name = n.name[:maxBytes]
	}
	if file != 0 {
		n.file, _ = m.CString(file, maxBytes) // a file cut or unreadable still names the sub
	}
	return n, nil
}

// readCop names an eval or the main program by the file of the COP at
// addr, checking the COP still has the line the walker saw.
func readCop(m memory, l *layout, addr uint64, line uint32, name string, maxBytes int) (*nameInfo, error) {
	n := &nameInfo{name: name}
	if addr == 0 {
		return n, nil
	}
	var b [4]byte
	if err := m.Read(addr+uint64(l.copLine), b[:]); err != nil {
		return nil, err
	}
	if got := binary.LittleEndian.Uint32(b[:]); got != line {
		return nil, fmt.Errorf("COP at %#x: line %d, sampled %d (freed and reused): %w", addr, got, line, runtimes.ErrBadFrame)
	}
	file, err := m.U64(addr + uint64(l.copFile))
	if err != nil {
		return nil, err
	}
	if file != 0 {
		n.file, _ = m.CString(file, maxBytes)
	}
	return n, nil
}
