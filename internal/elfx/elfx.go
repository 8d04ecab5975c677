// Package elfx opens ELF files for symbolization: it maps the file read-only,
// hands out section contents without copying (decompressing SHF_COMPRESSED and
// legacy .zdebug sections on demand), and exposes the PT_LOAD segments that
// address math needs. Every other package reads ELF bytes through it so that
// bounds checks and corrupt-file handling live in one place.
package elfx

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/profsym/profsym/internal/frame"

	"golang.org/x/sys/unix"
)

// ErrCorrupt marks files that are not well-formed ELF, or whose headers point
// outside the file. It wraps frame.ErrCorruptFile for counting.
var ErrCorrupt = fmt.Errorf("corrupt ELF file: %w", frame.ErrCorruptFile)

// ErrNoSection is returned when a requested section is absent or has no bytes
// in the file (SHT_NOBITS, as in separate debug files).
var ErrNoSection = errors.New("section not present")

// MaxDecompressedSection bounds the size a compressed section may claim, so a
// forged header cannot make us allocate without limit.
const MaxDecompressedSection = 2 << 30

// File is an opened ELF object. It is safe for concurrent use.
type File struct {
	*elf.File
	Path string

	data   []byte // whole file: mmap'd or read
	mapped bool
	osf    *os.File

	mu      sync.Mutex
	decoded map[string][]byte // decompressed sections, by name
	extra   int64             // bytes held in decoded
}

// Open maps path and parses its ELF headers.
func Open(path string) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := osf.Stat()
	if err != nil {
		osf.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		osf.Close()
		return nil, fmt.Errorf("%s: not a regular file: %w", path, ErrCorrupt)
	}
	size := st.Size()
	var data []byte
	mapped := false
	if size > 0 && size < 1<<40 {
		data, err = unix.Mmap(int(osf.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err == nil {
			mapped = true
		}
	}
	if !mapped {
		data, err = io.ReadAll(io.NewSectionReader(osf, 0, size))
		if err != nil {
			osf.Close()
			return nil, err
		}
	}
	f, err := newFile(data, path)
	if err != nil {
		if mapped {
			unix.Munmap(data)
		}
		osf.Close()
		return nil, err
	}
	f.mapped = mapped
	f.osf = osf
	return f, nil
}

// NewFile parses an ELF image held in memory. The slice must stay unchanged
// while the File is in use.
func NewFile(data []byte) (*File, error) { return newFile(data, "") }

func newFile(data []byte, path string) (f *File, err error) {
	defer func() {
		// debug/elf is hardened but not guaranteed panic-free on hostile input.
		if r := recover(); r != nil {
			f, err = nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, r)
		}
	}()
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
	}
	return &File{File: ef, Path: path, data: data, decoded: map[string][]byte{}}, nil
}

// Close releases the mapping. Slices handed out by the File become invalid.
func (f *File) Close() error {
	var err error
	if f.mapped {
		err = unix.Munmap(f.data)
		f.mapped = false
	}
	f.data = nil
	if f.osf != nil {
		if cerr := f.osf.Close(); err == nil {
			err = cerr
		}
		f.osf = nil
	}
	return err
}

// Bytes returns the raw file image.
func (f *File) Bytes() []byte { return f.data }

// SizeBytes is an estimate of the memory the File pins: the mapped image plus
// every decompressed section.
func (f *File) SizeBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(len(f.data)) + f.extra
}

// HasSection reports whether a section with file contents exists.
func (f *File) HasSection(name string) bool {
	s := f.section(name)
	return s != nil && s.Type != elf.SHT_NOBITS
}

// section finds name, accepting the legacy ".zdebug_" spelling of ".debug_".
func (f *File) section(name string) *elf.Section {
	if s := f.Section(name); s != nil {
		return s
	}
	if strings.HasPrefix(name, ".debug_") {
		return f.Section(".zdebug_" + name[len(".debug_"):])
	}
	return nil
}

// SectionData returns the contents of a section, decompressed. Uncompressed
// sections alias the file mapping; decompressed ones are kept for the life of
// the File.
func (f *File) SectionData(name string) ([]byte, error) {
	s := f.section(name)
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, fmt.Errorf("%s: %w", name, ErrNoSection)
	}
	raw, err := f.raw(s)
	if err != nil {
		return nil, err
	}
	compressed := s.Flags&elf.SHF_COMPRESSED != 0
	legacy := strings.HasPrefix(s.Name, ".zdebug_")
	if !compressed && !legacy {
		return raw, nil
	}
	f.mu.Lock()
	if d, ok := f.decoded[s.Name]; ok {
		f.mu.Unlock()
		return d, nil
	}
	f.mu.Unlock()
	var d []byte
	if compressed {
		d, err = decompressSHF(raw, f.Class, f.ByteOrder)
	} else {
		d, err = decompressZdebug(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	f.mu.Lock()
	if prev, ok := f.decoded[s.Name]; ok {
		d = prev
	} else {
		f.decoded[s.Name] = d
		f.extra += int64(len(d))
	}
	f.mu.Unlock()
	return d, nil
}

// raw returns the on-disk bytes of a section, bounds-checked.
func (f *File) raw(s *elf.Section) ([]byte, error) {
	end := s.Offset + s.FileSize
	if end < s.Offset || end > uint64(len(f.data)) {
		return nil, fmt.Errorf("section %s [%#x,+%#x) outside file of %d bytes: %w",
			s.Name, s.Offset, s.FileSize, len(f.data), ErrCorrupt)
	}
	return f.data[s.Offset:end:end], nil
}

func decompressSHF(raw []byte, class elf.Class, bo binary.ByteOrder) ([]byte, error) {
	var typ elf.CompressionType
	var size uint64
	var hdr int
	switch class {
	case elf.ELFCLASS64:
		if len(raw) < 24 {
			return nil, fmt.Errorf("short compression header: %w", ErrCorrupt)
		}
		typ = elf.CompressionType(bo.Uint32(raw[0:]))
		size = bo.Uint64(raw[8:])
		hdr = 24
	default:
		if len(raw) < 12 {
			return nil, fmt.Errorf("short compression header: %w", ErrCorrupt)
		}
		typ = elf.CompressionType(bo.Uint32(raw[0:]))
		size = uint64(bo.Uint32(raw[4:]))
		hdr = 12
	}
	if size > MaxDecompressedSection {
		return nil, fmt.Errorf("compressed section claims %d bytes: %w", size, ErrCorrupt)
	}
	switch typ {
	case elf.COMPRESS_ZLIB:
		return inflate(raw[hdr:], size)
	case elf.COMPRESS_ZSTD:
		return unzstd(raw[hdr:], size)
	default:
		return nil, fmt.Errorf("unknown compression type %d: %w", typ, ErrCorrupt)
	}
}

// decompressZdebug handles GNU's pre-standard ".zdebug_*" sections: "ZLIB",
// a big-endian 64-bit size, then a zlib stream.
func decompressZdebug(raw []byte) ([]byte, error) {
	if len(raw) < 12 || string(raw[:4]) != "ZLIB" {
		return nil, fmt.Errorf("bad .zdebug header: %w", ErrCorrupt)
	}
	size := binary.BigEndian.Uint64(raw[4:])
	if size > MaxDecompressedSection {
		return nil, fmt.Errorf("compressed section claims %d bytes: %w", size, ErrCorrupt)
	}
	return inflate(raw[12:], size)
}

func inflate(src []byte, size uint64) ([]byte, error) {
	zr, err := zlib.NewReader(bytes.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("zlib: %v: %w", err, ErrCorrupt)
	}
	defer zr.Close()
	return readExactly(zr, size)
}

func readExactly(r io.Reader, size uint64) ([]byte, error) {
	out := make([]byte, size)
	if _, err := io.ReadFull(r, out); err != nil {
		return nil, fmt.Errorf("decompress: %v: %w", err, ErrCorrupt)
	}
	return out, nil
}

// Segment is one PT_LOAD program header.
type Segment struct {
	Off, Vaddr, Filesz, Memsz uint64
	Flags                     elf.ProgFlag
}

// Loads returns the PT_LOAD segments in file order.
func (f *File) Loads() []Segment { return LoadsOf(f.File) }

// LoadsOf returns the PT_LOAD segments of any parsed ELF file.
func LoadsOf(ef *elf.File) []Segment {
	var out []Segment
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			out = append(out, Segment{Off: p.Off, Vaddr: p.Vaddr, Filesz: p.Filesz, Memsz: p.Memsz, Flags: p.Flags})
		}
	}
	return out
}

// ReadVaddr returns n bytes of the file image at virtual address addr, through
// the PT_LOAD segment holding it (falling back to allocated sections for
// objects without program headers).
func (f *File) ReadVaddr(addr uint64, n int) ([]byte, error) {
	if n < 0 {
		return nil, ErrCorrupt
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr-p.Vaddr >= p.Filesz {
			continue
		}
		if uint64(n) > p.Filesz-(addr-p.Vaddr) {
			return nil, fmt.Errorf("read %#x+%d crosses end of segment: %w", addr, n, ErrCorrupt)
		}
		return f.slice(p.Off+(addr-p.Vaddr), n)
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || addr < s.Addr || addr-s.Addr >= s.Size {
			continue
		}
		if s.Flags&elf.SHF_COMPRESSED != 0 || uint64(n) > s.Size-(addr-s.Addr) {
			break
		}
		return f.slice(s.Offset+(addr-s.Addr), n)
	}
	return nil, fmt.Errorf("address %#x not backed by file: %w", addr, ErrNoSection)
}

func (f *File) slice(off uint64, n int) ([]byte, error) {
	end := off + uint64(n)
	if end < off || end > uint64(len(f.data)) {
		return nil, fmt.Errorf("read [%#x,+%d) outside file: %w", off, n, ErrCorrupt)
	}
	return f.data[off:end:end], nil
}
