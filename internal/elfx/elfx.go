// Package elfx opens ELF files for symbolization: it maps the file read-only,
// hands out section contents without copying (decompressing SHF_COMPRESSED and
// legacy .zdebug sections on demand), and exposes the PT_LOAD segments that
// address math needs. Every other package reads ELF bytes through it so that
// bounds checks, resource limits and corrupt-file handling live in one place.
//
// Files are untrusted. OpenContext opens only regular files, never blocks on
// a FIFO, gives up when the caller's context ends, refuses files larger than
// Limits.MaxFileBytes, and charges every decompressed byte of a file (all
// sections, MiniDebugInfo included) against Limits.MaxDecompressedBytes.
// A section's claimed size is checked against (and reserved from) that
// budget, and against what its compressed bytes can expand to, before a
// byte is decoded; its buffer is address space that only the decoder's
// writes make resident, so a claim costs no memory the stream does not
// back, and takes at most half of the address space RLIMIT_AS leaves.
// Sections decode in parallel, each once.
package elfx

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/frame"
)

// ErrCorrupt marks files that are not well-formed ELF, or whose headers point
// outside the file. It wraps frame.ErrCorruptFile for counting.
var ErrCorrupt = fmt.Errorf("corrupt ELF file: %w", frame.ErrCorruptFile)

// ErrNoSection is returned when a requested section is absent or has no bytes
// in the file (SHT_NOBITS, as in separate debug files).
var ErrNoSection = errors.New("section not present")

// File is an opened ELF object. It is safe for concurrent use.
type File struct {
	*elf.File
	Path string

	data  []byte // whole file: mmap'd or read
	unmap func([]byte) error
	// drop unmaps the pages of data read so far from this process (see
	// DropPages); nil unless data is a file mapping.
	drop func([]byte)

	budget *budget

	mu          sync.Mutex
	decoded     map[string][]byte    // decompressed sections, by name
	decoding    map[string]*decoding // sections being decompressed, by name
	extra       int64                // bytes held in decoded
	freeOnClose [][]byte             // decoded's buffers, released by Close
}

// decoding is one section's decompression in progress: callers asking for
// it meanwhile wait for its result rather than decode it again.
type decoding struct {
	done chan struct{}
	data []byte
	err  error
}

// budget is the decompression allowance of one file, shared with the files
// embedded in it (MiniDebugInfo), so nesting cannot multiply it.
type budget struct {
	mu    sync.Mutex // guards spent; held only to reserve, so sections decode in parallel
	limit int64
	spent int64
	pool  *Pool // shared with other files, or nil
}

// release frees a decompressed section the File held and gives its bytes
// back to the pool.
func (b *budget) release(buf []byte) {
	sectionMemory.free(buf)
	b.pool.give(int64(cap(buf)))
}

// NewFile parses an ELF image held in memory, with the default limits. The
// slice must stay unchanged while the File is in use.
func NewFile(data []byte) (*File, error) { return NewFileLimits(data, Limits{}) }

// NewFileLimits is NewFile with explicit limits (only MaxDecompressedBytes
// applies: the image is already in memory).
func NewFileLimits(data []byte, lim Limits) (*File, error) {
	lim = lim.withDefaults()
	return newFile(data, "", &budget{limit: lim.MaxDecompressedBytes, pool: lim.Pool})
}

// Embedded parses an ELF image found inside f (the xz-compressed ELF of
// .gnu_debugdata). Its decompression is charged to f's budget.
func (f *File) Embedded(data []byte) (*File, error) {
	return newFile(data, f.Path+"[embedded]", f.budget)
}

func newFile(data []byte, path string, b *budget) (f *File, err error) {
	// debug/elf is hardened but not guaranteed panic-free on hostile input.
	defer contain.Panic(func(r any) { f, err = nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, r) })
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
	}
	return &File{File: ef, Path: path, data: data, budget: b, decoded: map[string][]byte{}}, nil
}

// Close releases the mapping and the decompressed sections. Slices handed
// out by the File become invalid.
func (f *File) Close() error {
	var err error
	if f.unmap != nil && f.data != nil {
		err = f.unmap(f.data)
	}
	f.unmap = nil
	f.drop = nil
	f.data = nil
	f.mu.Lock()
	for _, b := range f.freeOnClose {
		f.budget.release(b)
	}
	f.freeOnClose, f.decoded, f.extra = nil, map[string][]byte{}, 0
	f.mu.Unlock()
	return err
}

// Bytes returns the raw file image.
func (f *File) Bytes() []byte { return f.data }

// DropPages takes the pages of a mapped file image that were read so far
// out of this process's resident set: they stay in the page cache, and
// reading them again maps them back (a minor fault). A long pass over a big
// file calls it now and then, so that the process's RSS grows by what the
// pass read since the last call rather than by all of the file it touched.
// Slices of the image stay valid. No-op for images held in memory.
func (f *File) DropPages() {
	if f.drop != nil && f.data != nil {
		f.drop(f.data)
	}
}

// SizeBytes is an estimate of the memory the File pins: the mapped image plus
// every decompressed section.
func (f *File) SizeBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(len(f.data)) + f.extra
}

// DropDecoded frees the decompressed sections the File holds. Slices
// SectionData returned for compressed sections become invalid: call it
// only when nothing uses them (their reader failed, say).
func (f *File) DropDecoded() {
	f.mu.Lock()
	bufs := f.freeOnClose
	f.freeOnClose, f.decoded, f.extra = nil, map[string][]byte{}, 0
	f.mu.Unlock()
	for _, b := range bufs {
		f.budget.release(b)
	}
}

// HeldBytes is the decompressed section bytes the File holds now (and
// returns to its Pool, if any, on Close).
func (f *File) HeldBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.extra
}

// Charge counts n bytes of heap that a reader of this file builds from it
// (an index whose size the file decides) against the file's
// MaxDecompressedBytes, or fails with an error wrapping
// frame.ErrLimitExceeded when they do not fit what is left. Not against the
// Pool: charged there, one file's index held the pool and starved healthy
// files' sections (TestGatewayHostileInput, with a file of nothing but
// units); the owner of what is kept accounts for it (the symbolizer's cache
// counts Table.SizeBytes).
func (f *File) Charge(n int64, what string) error {
	if n <= 0 {
		return nil
	}
	b := f.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(uint64(n)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	b.spent += n
	return nil
}

// DecompressedBytes is how many bytes decompression of this file (and of
// files embedded in it) has produced so far, against its limit.
func (f *File) DecompressedBytes() (spent, limit int64) {
	f.budget.mu.Lock()
	defer f.budget.mu.Unlock()
	return f.budget.spent, f.budget.limit
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
// the File. A section whose decompressed size would take the file past its
// MaxDecompressedBytes fails with an error wrapping frame.ErrLimitExceeded.
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
	// Once per section: a caller asking while another decodes it waits
	// for that result.
	f.mu.Lock()
	if d, ok := f.decoded[s.Name]; ok {
		f.mu.Unlock()
		return d, nil
	}
	if c, ok := f.decoding[s.Name]; ok {
		f.mu.Unlock()
		<-c.done
		return c.data, c.err
	}
	if f.decoding == nil {
		f.decoding = map[string]*decoding{}
	}
	c := &decoding{done: make(chan struct{})}
	f.decoding[s.Name] = c
	f.mu.Unlock()

	var d []byte
	if compressed {
		d, err = f.decompressSHF(raw)
	} else {
		d, err = f.decompressZdebug(raw)
	}
	if err != nil {
		err = fmt.Errorf("%s %s: %w", f.Path, s.Name, err)
	}
	f.mu.Lock()
	delete(f.decoding, s.Name)
	if err == nil {
		f.decoded[s.Name] = d
		f.extra += int64(len(d))
	}
	f.mu.Unlock()
	c.data, c.err = d, err
	close(c.done)
	return d, err
}

func (f *File) cached(name string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.decoded[name]
	return d, ok
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

// compressionHeader parses an SHF_COMPRESSED section's Chdr: the algorithm
// and the size it claims for the decoded bytes.
func (f *File) compressionHeader(raw []byte) (typ elf.CompressionType, size uint64, hdr int, err error) {
	bo := f.ByteOrder
	switch f.Class {
	case elf.ELFCLASS64:
		if len(raw) < 24 {
			return 0, 0, 0, fmt.Errorf("short compression header: %w", ErrCorrupt)
		}
		return elf.CompressionType(bo.Uint32(raw[0:])), bo.Uint64(raw[8:]), 24, nil
	default:
		if len(raw) < 12 {
			return 0, 0, 0, fmt.Errorf("short compression header: %w", ErrCorrupt)
		}
		return elf.CompressionType(bo.Uint32(raw[0:])), uint64(bo.Uint32(raw[4:])), 12, nil
	}
}

// decompressSHF decodes a standard compressed section.
func (f *File) decompressSHF(raw []byte) ([]byte, error) {
	typ, size, hdr, err := f.compressionHeader(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case elf.COMPRESS_ZLIB:
		return f.decodeInto(size, len(raw)-hdr, maxZlibRatio, func(dst []byte) (int, error) { return inflateZlib(dst, raw[hdr:]) })
	case elf.COMPRESS_ZSTD:
		return f.decodeInto(size, len(raw)-hdr, maxZstdRatio, func(dst []byte) (int, error) {
			zr, err := newZstd(raw[hdr:], size)
			if err != nil {
				return 0, err
			}
			defer zr.Close()
			return readFull(zr, dst)
		})
	}
	return nil, fmt.Errorf("unknown compression type %d: %w", typ, ErrCorrupt)
}

// decompressZdebug handles GNU's pre-standard ".zdebug_*" sections: "ZLIB",
// a big-endian 64-bit size, then a zlib stream.
func (f *File) decompressZdebug(raw []byte) ([]byte, error) {
	if len(raw) < 12 || string(raw[:4]) != "ZLIB" {
		return nil, fmt.Errorf("bad .zdebug header: %w", ErrCorrupt)
	}
	size := binary.BigEndian.Uint64(raw[4:])
	return f.decodeInto(size, len(raw)-12, maxZlibRatio, func(dst []byte) (int, error) { return inflateZlib(dst, raw[12:]) })
}

// The most a compressed byte can expand to. Deflate's densest code is a
// 258-byte match in one bit of a fixed-code block plus its distance, about
// 1032:1; a zstd block outputs at most 128 KiB, and its shortest form (an
// RLE block) takes 4 bytes, 32768:1. A claim past that is not the stream's.
const (
	maxZlibRatio = 1032
	maxZstdRatio = 32768
	// ratioSlack covers stream headers and the last partial block.
	ratioSlack = 1 << 17
)

// checkRatio refuses a claimed decompressed size that n compressed bytes
// cannot produce, before anything is reserved or mapped for it: a lying
// header (one flipped bit of ch_size) would otherwise map up to the whole
// budget, address space the rest of the process may need.
func checkRatio(size uint64, n, ratio int) error {
	if n < 0 || size > uint64(n)*uint64(ratio)+ratioSlack {
		return fmt.Errorf("header claims %d bytes from %d compressed bytes, more than %d:1: %w", size, max(n, 0), ratio, ErrCorrupt)
	}
	return nil
}

// check refuses a claimed size that does not fit what is left; b.mu is held.
func (b *budget) check(size uint64) error {
	if left := b.limit - b.spent; size > uint64(max(left, 0)) {
		return fmt.Errorf("decompressed size %d exceeds what is left (%d) of the file's %d-byte decompression limit: %w",
			size, max(left, 0), b.limit, frame.ErrLimitExceeded)
	}
	return nil
}

// decodeInto decodes a section that claims size bytes from compressed
// bytes of a format that expands at most ratio:1: the claim is checked
// against that, and against what is left of the file's budget, and reserved (so
// sections decode in parallel within it), and against the pool; decode
// then fills a buffer of exactly that size, which must come out full. The
// buffer is address space that the decoder's writes make resident, so a
// claim the stream does not back costs no memory. decode reports how many
// bytes it wrote; on failure those stay charged to the budget.
func (f *File) decodeInto(size uint64, compressed, ratio int, decode func(dst []byte) (int, error)) ([]byte, error) {
	b := f.budget
	b.mu.Lock()
	if err := b.check(size); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if err := checkRatio(size, compressed, ratio); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	b.spent += int64(size)
	b.mu.Unlock()
	// The pool is charged the whole claim at once: files that grew side by
	// side, each taking its share as it went, could split the pool so that
	// none of them ever finished.
	if err := b.pool.take(int64(size)); err != nil {
		b.unreserve(int64(size))
		return nil, err
	}
	if size == 0 {
		n, err := decode(nil)
		if err == nil && n != 0 {
			err = errInflateLong
		}
		b.pool.give(0)
		return []byte{}, err
	}
	out, err := sectionMemory.grow(nil, int(size))
	if err != nil {
		b.unreserve(int64(size))
		b.pool.give(int64(size))
		return nil, fmt.Errorf("decompress: %w", err)
	}
	out = out[:size]
	n, err := decode(out)
	if err != nil {
		sectionMemory.free(out)
		b.unreserve(int64(size) - int64(n))
		b.pool.give(int64(size))
		return nil, err
	}
	f.mu.Lock()
	f.freeOnClose = append(f.freeOnClose, out)
	f.mu.Unlock()
	return out, nil
}

// unreserve gives back a reservation's unused bytes.
func (b *budget) unreserve(n int64) {
	b.mu.Lock()
	b.spent -= n
	b.mu.Unlock()
}

// readFull fills dst from r, which must then end: fewer bytes, or more, is
// a corrupt stream.
func readFull(r io.Reader, dst []byte) (int, error) {
	n, err := io.ReadFull(r, dst)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return n, fmt.Errorf("decompressed %d bytes, header says %d: %w", n, len(dst), ErrCorrupt)
	}
	if err != nil {
		return n, fmt.Errorf("decompress: %v: %w", err, ErrCorrupt)
	}
	var one [1]byte
	switch m, err := io.ReadFull(r, one[:]); {
	case m > 0:
		return n, errTooLong
	case err != io.EOF:
		return n, fmt.Errorf("decompress: %v: %w", err, ErrCorrupt)
	}
	return n, nil
}

// memory allocates the buffers decompression grows into.
type memory interface {
	// grow returns a buffer of capacity n holding buf's bytes; buf is
	// no longer valid.
	grow(buf []byte, n int) ([]byte, error)
	// trim shrinks buf's capacity to its length where that saves memory.
	trim(buf []byte) []byte
	free(buf []byte)
}

// heapMemory grows by copying into a new slice; the old one is garbage.
type heapMemory struct{}

func (heapMemory) grow(buf []byte, n int) ([]byte, error) {
	nb := make([]byte, len(buf), n)
	copy(nb, buf)
	return nb, nil
}
func (heapMemory) trim(buf []byte) []byte { return buf }
func (heapMemory) free([]byte)            {}

// growRead reads r to its end into a buffer that doubles as it fills,
// starting at min(hint, limit+1) bytes. More than limit bytes stop the read
// with errTooLong. On error the partial buffer is returned for freeing.
func growRead(r io.Reader, limit, hint int64, mem memory) ([]byte, error) {
	const minBuf = 64 << 10
	buf, err := mem.grow(nil, int(min(max(hint, minBuf), limit+1)))
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, errTooLong
			}
			nb, err := mem.grow(buf, int(min(int64(cap(buf))*2, limit+1)))
			if err != nil {
				return buf, fmt.Errorf("decompress: %w", err)
			}
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if int64(len(buf)) > limit {
				return buf, errTooLong
			}
			return buf, nil
		}
		if err != nil {
			return buf, fmt.Errorf("decompress: %v: %w", err, ErrCorrupt)
		}
	}
}

var errTooLong = fmt.Errorf("decompressed data longer than its header says: %w", ErrCorrupt)

// Decompress reads r, a decoder over compressed bytes of this file (such as
// .gnu_debugdata's xz stream), to its end. Its output counts against the
// file's MaxDecompressedBytes and may not exceed max bytes; either bound
// fails with an error wrapping frame.ErrLimitExceeded. The result is not
// kept by the File.
func (f *File) Decompress(r io.Reader, max int64, what string) ([]byte, error) {
	b := f.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	left := b.limit - b.spent
	limit := min(max, left)
	if limit < 0 {
		limit = 0
	}
	out, err := growRead(r, limit, 0, heapMemory{})
	b.spent += int64(len(out))
	switch {
	case errors.Is(err, errTooLong) && limit == max:
		return nil, fmt.Errorf("%s: more than %d bytes decompressed: %w", what, max, frame.ErrLimitExceeded)
	case errors.Is(err, errTooLong):
		return nil, fmt.Errorf("%s: decompressing takes the file past its %d-byte decompression limit: %w", what, b.limit, frame.ErrLimitExceeded)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", what, err)
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

// RelroOf returns the PT_GNU_RELRO segment: the part of the writable data
// the loader makes read-only once it has relocated the file. Memsz is 0
// when the file has none.
func RelroOf(ef *elf.File) Segment {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_GNU_RELRO {
			return Segment{Off: p.Off, Vaddr: p.Vaddr, Filesz: p.Filesz, Memsz: p.Memsz, Flags: p.Flags}
		}
	}
	return Segment{}
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
