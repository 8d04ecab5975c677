// Package addrmap converts between the address spaces a native frame passes
// through: a process's virtual address, the offset in the mapped file, and
// the ELF virtual address (what symbol tables and DWARF use).
package addrmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/profsym/profsym/internal/frame"
)

// MaxLineLen bounds one /proc/PID/maps line: 4 numbers, perms, device and a
// path of at most PATH_MAX (4096) bytes, escaped.
const MaxLineLen = 8192

var errCorrupt = fmt.Errorf("maps: %w", frame.ErrCorruptFile)

// Perms are a mapping's access bits.
type Perms uint8

const (
	Read Perms = 1 << iota
	Write
	Exec
	Shared // 's' instead of 'p'
)

func (p Perms) String() string {
	b := []byte("---p")
	if p&Read != 0 {
		b[0] = 'r'
	}
	if p&Write != 0 {
		b[1] = 'w'
	}
	if p&Exec != 0 {
		b[2] = 'x'
	}
	if p&Shared != 0 {
		b[3] = 's'
	}
	return string(b)
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End, Offset uint64
	Perms              Perms
	DevMajor, DevMinor uint32
	Inode              uint64
	// Path is the file, or a pseudo name ("[heap]", "[vdso]", "[stack]",
	// "[anon:name]"), or empty for anonymous memory. A " (deleted)" suffix
	// is removed and reported in Deleted.
	Path    string
	Deleted bool
}

// IsFile reports whether the mapping is backed by a file (not anonymous or a
// kernel pseudo mapping).
func (m Mapping) IsFile() bool {
	return m.Inode != 0 && m.Path != "" && m.Path[0] == '/'
}

// ParseMaps reads /proc/PID/maps text, calling fn for each mapping. An error
// from fn stops the walk and is returned as is. A malformed or over-long
// line returns an error wrapping frame.ErrCorruptFile.
func ParseMaps(r io.Reader, fn func(Mapping) error) error {
	br := bufio.NewReaderSize(r, 4096)
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", lineNo, err)
		}
		if len(line) == 0 {
			continue
		}
		m, err := ParseLine(line)
		if err != nil {
			return fmt.Errorf("line %d: %w", lineNo, err)
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}

// readLine returns the next line without its newline, refusing lines longer
// than MaxLineLen without buffering them.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > MaxLineLen+1 {
			return nil, fmt.Errorf("line longer than %d bytes: %w", MaxLineLen, errCorrupt)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return line, nil // last line without newline
		default:
			return nil, err
		}
	}
}

const deletedSuffix = " (deleted)"

// ParseLine parses one maps line:
//
//	start-end perms offset major:minor inode [path]
//
// The path is everything after the whitespace that follows the inode, so
// it may contain spaces (the kernel escapes only newlines, as "\012").
func ParseLine(line []byte) (Mapping, error) {
	var m Mapping
	rest := line
	field := func() ([]byte, bool) {
		rest = bytes.TrimLeft(rest, " \t")
		i := bytes.IndexAny(rest, " \t")
		if i < 0 {
			i = len(rest)
		}
		f := rest[:i]
		rest = rest[i:]
		return f, len(f) > 0
	}
	bad := func(what string) (Mapping, error) {
		return Mapping{}, fmt.Errorf("bad %s in %q: %w", what, truncate(line), errCorrupt)
	}
	rng, ok := field()
	if !ok {
		return bad("range")
	}
	dash := bytes.IndexByte(rng, '-')
	if dash < 0 {
		return bad("range")
	}
	var err error
	if m.Start, err = hexU64(rng[:dash]); err != nil {
		return bad("start")
	}
	if m.End, err = hexU64(rng[dash+1:]); err != nil || m.End < m.Start {
		return bad("end")
	}
	perms, ok := field()
	if !ok || len(perms) != 4 {
		return bad("perms")
	}
	for i := 0; i < 3; i++ {
		switch perms[i] {
		case "rwx"[i]:
			m.Perms |= Perms(1) << i
		case '-':
		default:
			return bad("perms")
		}
	}
	switch perms[3] {
	case 's':
		m.Perms |= Shared
	case 'p':
	default:
		return bad("perms")
	}
	off, ok := field()
	if !ok {
		return bad("offset")
	}
	if m.Offset, err = hexU64(off); err != nil {
		return bad("offset")
	}
	dev, ok := field()
	colon := bytes.IndexByte(dev, ':')
	if !ok || colon < 0 {
		return bad("device")
	}
	maj, err1 := strconv.ParseUint(string(dev[:colon]), 16, 32)
	mnr, err2 := strconv.ParseUint(string(dev[colon+1:]), 16, 32)
	if err1 != nil || err2 != nil {
		return bad("device")
	}
	m.DevMajor, m.DevMinor = uint32(maj), uint32(mnr)
	ino, ok := field()
	if !ok {
		return bad("inode")
	}
	if m.Inode, err = strconv.ParseUint(string(ino), 10, 64); err != nil {
		return bad("inode")
	}
	path := bytes.TrimLeft(rest, " \t")
	if bytes.HasSuffix(path, []byte(deletedSuffix)) {
		m.Deleted = true
		path = path[:len(path)-len(deletedSuffix)]
	}
	m.Path = string(path)
	return m, nil
}

func hexU64(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 16 {
		return 0, errCorrupt
	}
	return strconv.ParseUint(string(b), 16, 64)
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}
