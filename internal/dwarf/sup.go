package dwarf

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// SupLink is what a file records of its supplementary file: the dwz common
// file that holds DWARF several binaries share (`dwz -m`). GNU's form is
// the .gnu_debugaltlink section, DWARF 5's the .debug_sup section.
type SupLink struct {
	// Name is the file name as recorded: untrusted, an absolute path
	// (/usr/lib/debug/.dwz/...), one relative to the recording file, or a
	// bare name. Finding the file is the caller's job (internal/locate).
	Name string
	// BuildID identifies the file: its GNU build id (.gnu_debugaltlink),
	// or the checksum both files' .debug_sup record (DWARF5 set), which
	// `dwz -5` writes into a file without a build id note.
	BuildID []byte
	DWARF5  bool
}

// maxSupName bounds the recorded name (PATH_MAX).
const maxSupName = 4096

// ReadSupLink returns f's link to a supplementary file, if it has one.
func ReadSupLink(f *elfx.File) (SupLink, bool, error) {
	if d, err := f.SectionData(".gnu_debugaltlink"); err == nil {
		l, err := ParseAltLink(d)
		return l, err == nil, err
	} else if !errors.Is(err, elfx.ErrNoSection) {
		return SupLink{}, false, err
	}
	d, err := f.SectionData(".debug_sup")
	if errors.Is(err, elfx.ErrNoSection) {
		return SupLink{}, false, nil
	}
	if err != nil {
		return SupLink{}, false, err
	}
	l, isSup, err := ParseDebugSup(d)
	if err != nil || isSup {
		// A supplementary file itself links nowhere.
		return SupLink{}, false, err
	}
	return l, true, nil
}

// SupChecksum returns the checksum a supplementary file's own .debug_sup
// records (is_supplementary set), if it has one.
func SupChecksum(f *elfx.File) ([]byte, bool) {
	d, err := f.SectionData(".debug_sup")
	if err != nil {
		return nil, false
	}
	l, isSup, err := ParseDebugSup(d)
	if err != nil || !isSup {
		return nil, false
	}
	return l.BuildID, true
}

// ParseAltLink decodes .gnu_debugaltlink: the NUL-terminated file name,
// then the file's build id.
func ParseAltLink(d []byte) (SupLink, error) {
	n := bytes.IndexByte(d, 0)
	if n < 0 {
		return SupLink{}, corruptf(".gnu_debugaltlink: no NUL after the name")
	}
	return supLink(d[:n], d[n+1:], false)
}

// ParseDebugSup decodes DWARF 5's .debug_sup: version (2), is_supplementary
// (1), the NUL-terminated file name, then a ULEB128 length and that many
// bytes of checksum, which the two files must share. isSup is set in the
// supplementary file itself, which names no other (l.Name is empty).
func ParseDebugSup(d []byte) (l SupLink, isSup bool, err error) {
	b := buf{data: d}
	ver := b.u16()
	isSup = b.u8() != 0
	name := b.cstr()
	n := b.uleb()
	if b.err != nil || ver != 5 {
		return SupLink{}, false, corruptf(".debug_sup: version %d or truncated header", ver)
	}
	if n > uint64(b.left()) {
		return SupLink{}, false, corruptf(".debug_sup: checksum of %d bytes runs past the section", n)
	}
	l, err = supLink(name, d[b.off:b.off+int(n)], isSup)
	l.DWARF5 = err == nil
	return l, isSup, err
}

func supLink(name, id []byte, self bool) (SupLink, error) {
	if len(name) == 0 && !self || len(name) > maxSupName {
		return SupLink{}, corruptf("supplementary file name of %d bytes", len(name))
	}
	if len(id) < frame.MinBuildIDBytes || len(id) > frame.MaxBuildIDBytes {
		return SupLink{}, fmt.Errorf("supplementary file build id of %d bytes: %w", len(id), frame.ErrInvalidBuildID)
	}
	return SupLink{Name: string(name), BuildID: bytes.Clone(id)}, nil
}
