// Package keepdebug writes the part of an ELF file that symbolization needs,
// like `objcopy --only-keep-debug` followed by `--compress-debug-sections`:
// the ELF and program headers, every non-allocated section (DWARF, .symtab,
// .strtab, .gnu_debugdata), the notes (build ids) and the few allocated
// sections the engine reads names from (.gopclntab, .dynsym and the PLT
// tables). Code and data become SHT_NOBITS with their addresses kept, so
// section indices, symbol st_shndx values and address math stay those of the
// original. DWARF sections are compressed (SHF_COMPRESSED, zstd or zlib).
// The agent uploads this instead of whole binaries.
package keepdebug

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/profsym/profsym/internal/elfx"
)

// Compression selects how DWARF sections are compressed.
type Compression int

const (
	Zstd Compression = iota // ELFCOMPRESS_ZSTD: fast, small; elfutils, binutils >= 2.40, llvm >= 16
	Zlib                    // ELFCOMPRESS_ZLIB: read by every tool
	None
)

// minCompress is the smallest section worth a compression header.
const minCompress = 256

// keepAlloc are allocated sections whose bytes the engine reads for names.
var keepAlloc = map[string]bool{
	".gopclntab": true, ".go.buildinfo": true, ".gosymtab": true,
	".dynsym": true, ".dynstr": true,
	".rela.plt": true, ".rel.plt": true, ".rela.dyn": true, ".rel.dyn": true,
	".plt": true, ".plt.sec": true, ".plt.got": true,
}

// Stats describes one extraction.
type Stats struct {
	InBytes, OutBytes int64
	Kept, Emptied     int // sections with bytes, sections turned into NOBITS
	Compressed        int
}

// Options adjusts an extraction.
type Options struct {
	Compression Compression
	// Pace, when set, is called with the size of each piece of input before
	// it is compressed or copied (pieces of at most PaceChunk bytes), and
	// may block: a caller spreads the extraction's CPU over time by pacing
	// it to a rate. An error stops the extraction.
	Pace func(n int) error
	// Extra are sections appended to the output (non-allocated
	// SHT_PROGBITS, .debug_* ones compressed like the rest): the split
	// DWARF units of a -gsplit-dwarf binary, packed (a .dwp's sections),
	// so that the file symbolizes on its own.
	Extra []Section
}

// Section is an extra section to write.
type Section struct {
	Name string
	Data []byte
}

// PaceChunk is the largest piece of input between two Pace calls.
const PaceChunk = 256 << 10

// Write extracts src into dst. dst must be positioned at offset 0; the ELF
// header is written last (it holds the section table's offset), hence the
// Seeker.
func Write(src *elfx.File, dst io.WriteSeeker, comp Compression) (Stats, error) {
	return WriteOptions(src, dst, Options{Compression: comp})
}

// WriteOptions is Write with options.
func WriteOptions(src *elfx.File, dst io.WriteSeeker, opt Options) (Stats, error) {
	comp := opt.Compression
	pace := opt.Pace
	if pace == nil {
		pace = func(int) error { return nil }
	}
	var st Stats
	data := src.Bytes()
	st.InBytes = int64(len(data))
	is64 := src.Class == elf.ELFCLASS64
	bo := src.ByteOrder
	ehsize, phentsize, shentsize := 52, 32, 40
	if is64 {
		ehsize, phentsize, shentsize = 64, 56, 64
	}
	if len(data) < ehsize {
		return st, fmt.Errorf("header: %w", elfx.ErrCorrupt)
	}
	var phoff, shoff uint64
	var phnum, shnumRaw int
	if is64 {
		phoff, shoff = bo.Uint64(data[32:]), bo.Uint64(data[40:])
		phnum, shnumRaw = int(bo.Uint16(data[56:])), int(bo.Uint16(data[60:]))
		if int(bo.Uint16(data[54:])) != phentsize && phnum > 0 || int(bo.Uint16(data[58:])) != shentsize {
			return st, fmt.Errorf("unexpected header entry sizes: %w", elfx.ErrCorrupt)
		}
	} else {
		phoff, shoff = uint64(bo.Uint32(data[28:])), uint64(bo.Uint32(data[32:]))
		phnum, shnumRaw = int(bo.Uint16(data[44:])), int(bo.Uint16(data[48:]))
		if int(bo.Uint16(data[42:])) != phentsize && phnum > 0 || int(bo.Uint16(data[46:])) != shentsize {
			return st, fmt.Errorf("unexpected header entry sizes: %w", elfx.ErrCorrupt)
		}
	}
	_ = shnumRaw // extended numbering lives in section 0, which is copied as is
	nsec := len(src.Sections)
	if nsec == 0 || shoff == 0 {
		return st, fmt.Errorf("no section headers to keep: %w", elfx.ErrCorrupt)
	}
	phEnd := phoff + uint64(phnum*phentsize)
	shEnd := shoff + uint64(nsec*shentsize)
	if phEnd < phoff || phEnd > uint64(len(data)) || shEnd < shoff || shEnd > uint64(len(data)) {
		return st, fmt.Errorf("header tables outside the file: %w", elfx.ErrCorrupt)
	}

	w := &countWriter{w: dst}
	// Placeholder ELF header, then the program headers verbatim.
	w.Write(make([]byte, ehsize))
	newPhoff := uint64(0)
	if phnum > 0 {
		newPhoff = uint64(w.n)
		w.Write(data[phoff:phEnd])
	}
	hdrs := make([][]byte, nsec)
	shstrndx := int(bo.Uint16(data[ehsize-2:]))
	if shstrndx == int(elf.SHN_XINDEX) { // the index lives in section 0's sh_link
		if is64 {
			shstrndx = int(bo.Uint32(data[shoff+40:]))
		} else {
			shstrndx = int(bo.Uint32(data[shoff+24:]))
		}
	}
	extraNames := make([]uint64, len(opt.Extra)) // their offsets in the grown .shstrtab
	for i, s := range src.Sections {
		raw := append([]byte(nil), data[shoff+uint64(i*shentsize):shoff+uint64((i+1)*shentsize)]...)
		hdrs[i] = raw
		if i == 0 || s.Type == elf.SHT_NULL {
			continue
		}
		keep := s.Type != elf.SHT_NOBITS && (s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOTE || keepAlloc[s.Name])
		if !keep {
			// Addresses and sizes stay; the bytes go.
			putShdr(raw, is64, bo, shType, uint64(elf.SHT_NOBITS))
			putShdr(raw, is64, bo, shOffset, uint64(w.n))
			if s.Type != elf.SHT_NOBITS {
				st.Emptied++
			}
			continue
		}
		end := s.Offset + s.FileSize
		if end < s.Offset || end > uint64(len(data)) {
			return st, fmt.Errorf("section %s outside the file: %w", s.Name, elfx.ErrCorrupt)
		}
		body := data[s.Offset:end]
		if i == shstrndx && len(opt.Extra) > 0 {
			// The section names table grows by the extra sections' names.
			body = append([]byte(nil), body...)
			for k, x := range opt.Extra {
				extraNames[k] = uint64(len(body))
				body = append(append(body, x.Name...), 0)
			}
		}
		flags := uint64(s.Flags)
		copyPace := pace // the input is paced once: compressed, or copied
		if comp != None && strings.HasPrefix(s.Name, ".debug_") && s.Flags&elf.SHF_COMPRESSED == 0 &&
			s.Flags&elf.SHF_ALLOC == 0 && len(body) >= minCompress {
			c, err := compress(body, is64, bo, comp, s.Addralign, pace)
			if err != nil {
				return st, fmt.Errorf("compress %s: %w", s.Name, err)
			}
			copyPace = func(int) error { return nil }
			if len(c) < len(body) {
				body = c
				flags |= uint64(elf.SHF_COMPRESSED)
				st.Compressed++
			}
		}
		align := max(s.Addralign, 1)
		if flags&uint64(elf.SHF_COMPRESSED) != 0 {
			align = 8
			if !is64 {
				align = 4
			}
		}
		if err := w.pad(align); err != nil {
			return st, err
		}
		putShdr(raw, is64, bo, shOffset, uint64(w.n))
		putShdr(raw, is64, bo, shSize, uint64(len(body)))
		putShdr(raw, is64, bo, shFlags, flags)
		if err := paced(body, copyPace, func(p []byte) error { _, err := w.Write(p); return err }); err != nil {
			return st, err
		}
		st.Kept++
	}
	for k, x := range opt.Extra {
		if shstrndx <= 0 || shstrndx >= nsec {
			return st, fmt.Errorf("no section names table for extra sections: %w", elfx.ErrCorrupt)
		}
		body, flags, align := x.Data, uint64(0), uint64(1)
		if comp != None && strings.HasPrefix(x.Name, ".debug_") && len(body) >= minCompress {
			c, err := compress(body, is64, bo, comp, 1, pace)
			if err != nil {
				return st, fmt.Errorf("compress %s: %w", x.Name, err)
			}
			if len(c) < len(body) {
				body, flags, align = c, uint64(elf.SHF_COMPRESSED), 8
				st.Compressed++
			}
		}
		if err := w.pad(align); err != nil {
			return st, err
		}
		h := make([]byte, shentsize)
		putShdrName(h, is64, bo, uint32(extraNames[k]))
		putShdr(h, is64, bo, shType, uint64(elf.SHT_PROGBITS))
		putShdr(h, is64, bo, shFlags, flags)
		putShdr(h, is64, bo, shOffset, uint64(w.n))
		putShdr(h, is64, bo, shSize, uint64(len(body)))
		putShdrAlign(h, is64, bo, align)
		w.Write(body)
		hdrs = append(hdrs, h)
		st.Kept++
	}
	if len(opt.Extra) > 0 && shnumRaw == 0 {
		// Extended numbering: the count lives in section 0's sh_size.
		putShdr(hdrs[0], is64, bo, shSize, uint64(len(hdrs)))
	}
	if err := w.pad(8); err != nil {
		return st, err
	}
	newShoff := uint64(w.n)
	for _, h := range hdrs {
		w.Write(h)
	}
	if w.err != nil {
		return st, w.err
	}
	st.OutBytes = w.n

	eh := append([]byte(nil), data[:ehsize]...)
	if len(opt.Extra) > 0 && shnumRaw != 0 {
		if len(hdrs) >= 0xff00 {
			return st, fmt.Errorf("%d sections: %w", len(hdrs), elfx.ErrCorrupt)
		}
		bo.PutUint16(eh[ehsize-4:], uint16(len(hdrs)))
	}
	if is64 {
		bo.PutUint64(eh[32:], newPhoff)
		bo.PutUint64(eh[40:], newShoff)
	} else {
		bo.PutUint32(eh[28:], uint32(newPhoff))
		bo.PutUint32(eh[32:], uint32(newShoff))
		if newShoff > 1<<32-1 {
			return st, errors.New("ELF32 output over 4 GiB")
		}
	}
	if _, err := dst.Seek(0, io.SeekStart); err != nil {
		return st, err
	}
	if _, err := dst.Write(eh); err != nil {
		return st, err
	}
	_, err := dst.Seek(0, io.SeekEnd)
	return st, err
}

// Section header fields we rewrite.
type shField int

const (
	shType shField = iota
	shFlags
	shOffset
	shSize
)

// putShdrName sets a section header's sh_name.
func putShdrName(h []byte, _ bool, bo binary.ByteOrder, v uint32) { bo.PutUint32(h[0:], v) }

// putShdrAlign sets a section header's sh_addralign.
func putShdrAlign(h []byte, is64 bool, bo binary.ByteOrder, v uint64) {
	if is64 {
		bo.PutUint64(h[48:], v)
		return
	}
	bo.PutUint32(h[32:], uint32(v))
}

func putShdr(h []byte, is64 bool, bo binary.ByteOrder, f shField, v uint64) {
	if is64 {
		switch f {
		case shType:
			bo.PutUint32(h[4:], uint32(v))
		case shFlags:
			bo.PutUint64(h[8:], v)
		case shOffset:
			bo.PutUint64(h[24:], v)
		case shSize:
			bo.PutUint64(h[32:], v)
		}
		return
	}
	off := map[shField]int{shType: 4, shFlags: 8, shOffset: 16, shSize: 20}[f]
	bo.PutUint32(h[off:], uint32(v))
}

// paced hands b to fn in pieces of at most PaceChunk bytes, calling pace
// before each.
func paced(b []byte, pace func(int) error, fn func([]byte) error) error {
	for len(b) > 0 {
		n := min(len(b), PaceChunk)
		if err := pace(n); err != nil {
			return err
		}
		if err := fn(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// compress returns an SHF_COMPRESSED section body: Chdr then the stream.
// The encoders run in the calling goroutine (zstd with concurrency 1 is
// synchronous), so a caller that lowers its thread's priority lowers
// theirs.
func compress(body []byte, is64 bool, bo binary.ByteOrder, comp Compression, align uint64, pace func(int) error) ([]byte, error) {
	var out bytes.Buffer
	typ := elf.COMPRESS_ZSTD
	if comp == Zlib {
		typ = elf.COMPRESS_ZLIB
	}
	if is64 {
		var h [24]byte
		bo.PutUint32(h[0:], uint32(typ))
		bo.PutUint64(h[8:], uint64(len(body)))
		bo.PutUint64(h[16:], max(align, 1))
		out.Write(h[:])
	} else {
		var h [12]byte
		bo.PutUint32(h[0:], uint32(typ))
		bo.PutUint32(h[4:], uint32(len(body)))
		bo.PutUint32(h[8:], uint32(max(align, 1)))
		out.Write(h[:])
	}
	switch comp {
	case Zlib:
		zw, _ := zlib.NewWriterLevel(&out, zlib.BestSpeed)
		if err := paced(body, pace, func(p []byte) error { _, err := zw.Write(p); return err }); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
	default:
		zw, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
		if err != nil {
			return nil, err
		}
		if err := paced(body, pace, func(p []byte) error { _, err := zw.Write(p); return err }); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

var zeros [64]byte

func (c *countWriter) pad(align uint64) error {
	if align > 64 {
		align = 64 // larger alignments only matter for loading, not reading
	}
	for rem := uint64(c.n) % align; rem != 0 && c.err == nil; rem = uint64(c.n) % align {
		c.Write(zeros[:align-rem])
	}
	return c.err
}

// HasSymbols reports whether f carries anything the engine can name
// addresses from: DWARF, a .symtab with entries, a Go pclntab, or
// MiniDebugInfo. .dynsym alone does not count: the gateway reads that from
// any copy of the binary.
func HasSymbols(f *elfx.File) bool {
	for _, name := range []string{".debug_info", ".gopclntab", ".gnu_debugdata"} {
		if f.HasSection(name) {
			return true
		}
	}
	if s := f.Section(".symtab"); s != nil && s.Type == elf.SHT_SYMTAB && s.Entsize > 0 && s.Size/s.Entsize > 1 {
		return true
	}
	return false
}
