package buildid

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"strconv"

	"github.com/profsym/profsym/internal/elfx"
)

// maxBuildID bounds a GNU build id; real ones are 8 to 64 bytes (sha1 is 20).
// A larger descriptor is not an id anyone could look up.
const maxBuildID = 256

// maxNoteRegions bounds how many note sections, and how many PT_NOTE
// segments, are scanned. Real files have a handful; a forged one could list
// thousands overlapping the whole file and make the scan quadratic.
const maxNoteRegions = 64

// GNU returns the NT_GNU_BUILD_ID of f: from the .note.gnu.build-id section,
// or, for files whose section headers were stripped, from any PT_NOTE
// segment. Absence wraps ErrNotFound.
func GNU(f *elfx.File) ([]byte, error) {
	return findNote(f, ".note.gnu.build-id", "GNU", ntGNUBuildID)
}

// findNote looks for a note first in the named section, then in every other
// SHT_NOTE section, then in PT_NOTE segments (which cover stripped files).
func findNote(f *elfx.File, section, name string, typ uint32) ([]byte, error) {
	var found []byte
	var firstErr error
	visit := func(data []byte, align uint64) bool {
		err := ParseNotes(data, f.ByteOrder, align, func(n Note) bool {
			if n.Name == name && n.Type == typ && len(n.Desc) > 0 && len(n.Desc) <= maxBuildID {
				found = bytes.Clone(n.Desc)
				return false
			}
			return true
		})
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return found != nil
	}
	if s := f.Section(section); s != nil && s.Type == elf.SHT_NOTE {
		if data, err := f.SectionData(section); err == nil && visit(data, s.Addralign) {
			return found, nil
		} else if err != nil && !errors.Is(err, elfx.ErrNoSection) && firstErr == nil {
			firstErr = err
		}
	}
	visited := 0
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE || s.Name == section || s.Flags&elf.SHF_COMPRESSED != 0 {
			continue
		}
		if visited++; visited > maxNoteRegions {
			break
		}
		if data, err := rawRange(f, s.Offset, s.FileSize); err == nil && visit(data, s.Addralign) {
			return found, nil
		}
	}
	visited = 0
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		if visited++; visited > maxNoteRegions {
			break
		}
		data, err := rawRange(f, p.Off, p.Filesz)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if visit(data, p.Align) {
			return found, nil
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, fmt.Errorf("%s note %q type %d: %w", f.Path, name, typ, ErrNotFound)
}

// rawRange returns file bytes [off, off+n), bounds-checked.
func rawRange(f *elfx.File, off, n uint64) ([]byte, error) {
	data := f.Bytes()
	end := off + n
	if end < off || end > uint64(len(data)) {
		return nil, fmt.Errorf("range [%#x,+%#x) outside file of %d bytes: %w", off, n, len(data), elfx.ErrCorrupt)
	}
	return data[off:end:end], nil
}

// goBuildPrefix and goBuildEnd delimit the build id string that the Go linker
// used to place at the very start of the text segment, before it switched
// ELF output to a note (Go 1.9+ writes both the note and, on some targets,
// this string).
var (
	goBuildPrefix = []byte("\xff Go build ID: \"")
	goBuildEnd    = []byte("\"\n \xff")
)

// goRawSearch is how much of the file is scanned for the raw string. The Go
// toolchain's own reader (cmd/internal/buildid) scans the first 32 KiB of the
// file, which covers the start of .text in binaries of that era.
const goRawSearch = 32 << 10

// Go returns the Go build id of f ("actionID/contentID" pairs joined by
// slashes, as `go tool buildid` prints it): from the "Go\x00\x00" note of
// type 4 (section .note.go.buildid, or a PT_NOTE segment when sections are
// stripped), else from the quoted string at the start of the text.
func Go(f *elfx.File) (string, error) {
	if id, err := findNote(f, ".note.go.buildid", "Go", ntGoBuildID); err == nil {
		return string(id), nil
	}
	data := f.Bytes()
	// Prefer the start of .text, where the linker put the string; fall back
	// to the head of the file like cmd/internal/buildid.
	var regions [][]byte
	if s := f.Section(".text"); s != nil && s.Type != elf.SHT_NOBITS {
		if b, err := rawRange(f, s.Offset, min(s.FileSize, goRawSearch)); err == nil {
			regions = append(regions, b)
		}
	}
	regions = append(regions, data[:min(len(data), goRawSearch)])
	for _, r := range regions {
		if id, ok := rawGoID(r); ok {
			return id, nil
		}
	}
	return "", fmt.Errorf("%s Go build id: %w", f.Path, ErrNotFound)
}

// rawGoID extracts the id from `\xff Go build ID: "..."\n \xff` in b.
func rawGoID(b []byte) (string, bool) {
	i := bytes.Index(b, goBuildPrefix)
	if i < 0 {
		return "", false
	}
	rest := b[i+len(goBuildPrefix):]
	j := bytes.Index(rest, goBuildEnd)
	if j < 0 {
		return "", false
	}
	// The id is written as a Go quoted string; unquote as the toolchain does.
	id, err := strconv.Unquote("\"" + string(rest[:j]) + "\"")
	if err != nil || id == "" {
		return "", false
	}
	return id, true
}
