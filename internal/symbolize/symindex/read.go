package symindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Bounds a reader applies to what an index may ask of it.
const (
	// MaxFrames bounds the frames of one address (an inline chain): real
	// ones stay in the tens.
	MaxFrames = 1024
	// MaxStringBytes bounds one name or path.
	MaxStringBytes = 1 << 20
	// DefaultMaxBytes bounds an index file when the caller gives no bound.
	DefaultMaxBytes = 1 << 30
	// MaxNameCacheBytes bounds an index's cache of names read; past it, it
	// starts over.
	MaxNameCacheBytes = 1 << 20
)

// pageRanges is how many ranges one 4 KiB page holds.
const pageRanges = 4096 / rangeSize

// maxRecordBytes bounds one record's encoding: MaxFrames frames of eight
// varints of at most ten bytes, and the count.
const maxRecordBytes = MaxFrames*8*binary.MaxVarintLen64 + binary.MaxVarintLen64

// Index is an open index, read with ranged reads (pread): an open index
// holds no mapping, and its heap is the page table below and the names
// cache. Safe for concurrent use.
type Index struct {
	h     *header
	r     io.ReaderAt
	f     *os.File // nil for Parse
	close sync.Once
	// top holds the start of every pageRanges-th range: a lookup halves
	// it, then reads one page of ranges.
	top []uint32

	// names holds the strings read, by offset: the frames of one object
	// repeat a few names.
	mu        sync.Mutex
	names     map[uint32]string
	nameBytes int
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 4096+rangeSize); return &b }}

// Open opens the index at path (a regular file of at most maxBytes bytes;
// 0: DefaultMaxBytes) and checks it: its checksums, its sections and its
// range table, read through once.
func Open(path string, maxBytes int64) (*Index, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	f, size, err := elfx.OpenRegular(path, maxBytes)
	if err != nil {
		return nil, err
	}
	x, err := open(f, size)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	x.f = f
	return x, nil
}

// Parse checks an index held in memory (tests, fuzzing).
func Parse(data []byte) (*Index, error) { return open(bytes.NewReader(data), int64(len(data))) }

func open(r io.ReaderAt, size int64) (*Index, error) {
	var hb [headerSize]byte
	if size < headerSize {
		return nil, corruptf("%d bytes, shorter than its header", size)
	}
	if _, err := r.ReadAt(hb[:], 0); err != nil {
		return nil, corruptf("header: %v", err)
	}
	h, err := parseHeader(hb[:], size)
	if err != nil {
		return nil, err
	}
	x := &Index{h: h, r: r, names: map[uint32]string{}}
	if err := x.check(); err != nil {
		return nil, err
	}
	return x, nil
}

// check reads the body once: its checksum, and the range table's order
// (lookups search it by halving: a forged table would answer at random)
// and record offsets, building the page table on the way.
func (x *Index) check() error {
	h := x.h
	le := binary.LittleEndian
	buf := make([]byte, 1<<20)
	var crc uint32
	var prev uint32
	n := 0 // ranges seen
	for off := uint64(headerSize); off < h.size; {
		k := min(uint64(len(buf)), h.size-off)
		b := buf[:k]
		if _, err := x.r.ReadAt(b, int64(off)); err != nil {
			return corruptf("reading at %d: %v", off, err)
		}
		crc = crc32.Update(crc, castagnoli, b)
		// The ranges of this chunk (a chunk holds whole ranges: both
		// its size and the ranges' start are multiples of rangeSize).
		for i := 0; i+rangeSize <= len(b) && off+uint64(i) < h.records; i += rangeSize {
			lo, rec := le.Uint32(b[i:]), le.Uint32(b[i+4:])
			if n > 0 && lo <= prev {
				return corruptf("range %d starts at %#x, not past %#x", n, lo, prev)
			}
			if rec != noRecord && uint64(rec) >= h.recN {
				return corruptf("range %d points past the records", n)
			}
			if n%pageRanges == 0 {
				x.top = append(x.top, lo)
			}
			if n == int(h.nRanges)-1 && rec != noRecord {
				return corruptf("the last range has an answer")
			}
			prev = lo
			n++
		}
		off += k
	}
	if crc != h.bodyCRC {
		return corruptf("body checksum mismatch")
	}
	return nil
}

// Meta returns what the index says about its object. BuildID is a copy.
func (x *Index) Meta() Meta {
	m := x.h.Meta
	m.BuildID = bytes.Clone(m.BuildID)
	return m
}

// Ranges is the number of ranges, for telemetry and tests.
func (x *Index) Ranges() int { return int(x.h.nRanges) }

// Bytes is the size of the index file.
func (x *Index) Bytes() int64 { return int64(x.h.size) }

// HeapBytes is what the index holds in memory: its page table and names.
func (x *Index) HeapBytes() int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return int64(len(x.top))*4 + int64(x.nameBytes) + headerSize
}

// Close closes the file. Frames returned before stay valid.
func (x *Index) Close() error {
	var err error
	x.close.Do(func() {
		if x.f != nil {
			err = x.f.Close()
		}
	})
	return err
}

// Lookup appends the frames of pc to dst, innermost first. An address no
// range answers leaves dst as it is, with a nil error; a record that is
// malformed (a forged index whose checksums were made to match), or a file
// that changed under it, fails with an error wrapping
// frame.ErrCorruptFile.
func (x *Index) Lookup(pc uint64, dst []frame.Frame) ([]frame.Frame, error) {
	h := x.h
	if pc < h.base || pc-h.base >= 1<<32 {
		return dst, nil
	}
	off := uint32(pc - h.base)
	le := binary.LittleEndian
	// The page of ranges: the last one whose first range starts at or
	// before off.
	lo, hi := 0, len(x.top)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.top[m] <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return dst, nil
	}
	first := (lo - 1) * pageRanges
	count := min(pageRanges, int(h.nRanges)-first)
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	page := (*bp)[:count*rangeSize]
	if _, err := x.r.ReadAt(page, int64(h.ranges)+int64(first)*rangeSize); err != nil {
		return dst, corruptf("ranges: %v", err)
	}
	lo, hi = 0, count // the last range of the page starting at or before off is lo-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if le.Uint32(page[m*rangeSize:]) <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return dst, nil // a page table that disagrees with its page: changed under us
	}
	rec := le.Uint32(page[(lo-1)*rangeSize+4:])
	if rec == noRecord {
		return dst, nil
	}
	return x.record(rec, dst)
}

// read returns up to n bytes of the section [secOff, secOff+secLen) from
// off within it, into buf when it fits.
func (x *Index) read(buf []byte, secOff, secLen, off uint64, n int) ([]byte, error) {
	if off >= secLen {
		return nil, corruptf("offset %d past a section of %d bytes", off, secLen)
	}
	n = int(min(uint64(n), secLen-off))
	if n > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := x.r.ReadAt(buf, int64(secOff+off)); err != nil && !errors.Is(err, io.EOF) {
		return nil, corruptf("reading at %d: %v", secOff+off, err)
	}
	return buf, nil
}

func (x *Index) record(off uint32, dst []frame.Frame) ([]frame.Frame, error) {
	base := len(dst)
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	// Most records fit a page; one that does not is read again, up to the
	// largest a record can be.
	b, err := x.read(*bp, x.h.records, x.h.recN, uint64(off), len(*bp))
	if err != nil {
		return dst, err
	}
	dst, err = x.decode(off, b, dst)
	if errors.Is(err, errShort) && len(b) == len(*bp) {
		if b, err = x.read(nil, x.h.records, x.h.recN, uint64(off), maxRecordBytes); err != nil {
			return dst[:base], err
		}
		dst, err = x.decode(off, b, dst[:base])
	}
	if errors.Is(err, errShort) {
		err = corruptf("record at %d runs off the records", off)
	}
	if err != nil {
		return dst[:base], err
	}
	return dst, nil
}

var errShort = errors.New("short")

func (x *Index) decode(off uint32, b []byte, dst []frame.Frame) ([]frame.Frame, error) {
	count, k := binary.Uvarint(b)
	if k == 0 {
		return dst, errShort
	}
	if k < 0 || count == 0 || count > MaxFrames {
		return dst, corruptf("record at %d: %d frames", off, count)
	}
	b = b[k:]
	var v [8]uint64
	for range count {
		for j := range v {
			if v[j], k = binary.Uvarint(b); k <= 0 {
				if k == 0 {
					return dst, errShort
				}
				return dst, corruptf("record at %d: an overlong number", off)
			}
			b = b[k:]
		}
		if v[2]|v[3]|v[4]|v[6] >= 1<<32 {
			return dst, corruptf("record at %d: a line past 32 bits", off)
		}
		dst = append(dst, frame.Frame{
			Line: uint32(v[2]), Column: uint32(v[3]), Discriminator: uint32(v[4]),
			StartLine: uint32(v[6]), StartAddress: v[7],
		})
		f := &dst[len(dst)-1]
		var err error
		if f.Name, err = x.str(v[0]); err != nil {
			return dst, err
		}
		if f.File, err = x.str(v[1]); err != nil {
			return dst, err
		}
		if f.StartFile, err = x.str(v[5]); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// str reads the string at ref-1 (0: none).
func (x *Index) str(ref uint64) (string, error) {
	if ref == 0 {
		return "", nil
	}
	if ref > x.h.strN {
		return "", corruptf("string %d past the strings", ref-1)
	}
	off := uint32(ref - 1)
	x.mu.Lock()
	s, ok := x.names[off]
	x.mu.Unlock()
	if ok {
		return s, nil
	}
	var small [256]byte
	b, err := x.read(small[:], x.h.strings, x.h.strN, uint64(off), len(small))
	if err != nil {
		return "", err
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > MaxStringBytes || n > x.h.strN-uint64(off)-uint64(k) {
		return "", corruptf("string at %d of %d bytes", off, n)
	}
	if uint64(len(b)-k) < n {
		if b, err = x.read(nil, x.h.strings, x.h.strN, uint64(off)+uint64(k), int(n)); err != nil {
			return "", err
		}
		k = 0
	}
	s = string(b[k : k+int(n)])
	x.mu.Lock()
	if x.nameBytes += len(s) + 32; x.nameBytes > MaxNameCacheBytes {
		clear(x.names)
		x.nameBytes = len(s) + 32
	}
	x.names[off] = s
	x.mu.Unlock()
	return s, nil
}
