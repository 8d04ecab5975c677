// Package symindex is profsym's symbol index: one object's answers (address
// ranges to frames: function, file, line, column, inlined callers), compiled
// once from its debug info and read by every gateway that meets the object
// through a read-only mapping, instead of parsing its DWARF again.
//
// The file is versioned, bound to one GNU build id and checksummed (CRC-32C
// of everything after the header, and of the header itself). It is hostile
// input like any file: Open checks the checksums and the range table's
// order, and every read after that is bounded by the sections it lies in.
//
// Layout, all integers little endian:
//
//	header   headerSize bytes (fields below)
//	ranges   nRanges x 8 bytes: u32 start (from base), u32 record offset
//	         (noRecord: no answer). A range ends where the next starts; the
//	         last one is always noRecord.
//	records  per record: uvarint frame count, then per frame eight uvarints:
//	         name, file (string offset + 1, 0: none), line, column,
//	         discriminator, start file (string offset + 1), start line,
//	         start address
//	strings  per string: uvarint length, bytes
package symindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/profsym/profsym/internal/frame"
)

// Version is the format this package writes and reads. A reader refuses
// other versions: an old index is rebuilt rather than misread.
const Version = 1

const (
	magic      = "PSYMIDX\x00"
	headerSize = 256
	rangeSize  = 8
	noRecord   = ^uint32(0)
	// maxBuildID bounds the build id the header carries (GNU ids are 20
	// bytes; 64 leaves room for any hash a linker uses).
	maxBuildID = 64
)

// Header field offsets.
const (
	offMagic     = 0
	offVersion   = 8
	offFlags     = 12
	offBase      = 16
	offImageBase = 24
	offStext     = 32
	offNRanges   = 40
	offRanges    = 48
	offRecords   = 56
	offRecLen    = 64
	offStrings   = 72
	offStrLen    = 80
	offFileSize  = 88
	offBodyCRC   = 96
	offIDLen     = 100
	offID        = 104 // maxBuildID bytes
	offHdrCRC    = headerSize - 4
)

// Flags say which options the answers were compiled with: a reader whose
// options differ must not take them.
const (
	FlagInlines     uint32 = 1 << iota // inlined frames are in the records
	FlagSymbolTable                    // outermost frames are named from the symbol tables
	FlagStext                          // the header's _stext is known (a kernel image)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt wraps every refusal of a malformed or forged index.
var ErrCorrupt = fmt.Errorf("symbol index: %w", frame.ErrCorruptFile)

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// Meta is what an index says about its object besides the answers.
type Meta struct {
	BuildID   []byte
	Flags     uint32
	ImageBase uint64 // see symbolize.Handle.ImageBase
	Stext     uint64 // the _stext symbol's address, with FlagStext
}

type header struct {
	Meta
	base                  uint64
	nRanges               uint32
	ranges, records, recN uint64
	strings, strN, size   uint64
	bodyCRC               uint32
}

func (h *header) put(b []byte) {
	le := binary.LittleEndian
	copy(b[offMagic:], magic)
	le.PutUint32(b[offVersion:], Version)
	le.PutUint32(b[offFlags:], h.Flags)
	le.PutUint64(b[offBase:], h.base)
	le.PutUint64(b[offImageBase:], h.ImageBase)
	le.PutUint64(b[offStext:], h.Stext)
	le.PutUint32(b[offNRanges:], h.nRanges)
	le.PutUint64(b[offRanges:], h.ranges)
	le.PutUint64(b[offRecords:], h.records)
	le.PutUint64(b[offRecLen:], h.recN)
	le.PutUint64(b[offStrings:], h.strings)
	le.PutUint64(b[offStrLen:], h.strN)
	le.PutUint64(b[offFileSize:], h.size)
	le.PutUint32(b[offBodyCRC:], h.bodyCRC)
	b[offIDLen] = byte(len(h.BuildID))
	copy(b[offID:offID+maxBuildID], h.BuildID)
	le.PutUint32(b[offHdrCRC:], crc32.Checksum(b[:offHdrCRC], castagnoli))
}

// parseHeader checks the header of an index of size bytes, and where its
// sections lie; not the body's checksum.
func parseHeader(data []byte, size int64) (*header, error) {
	le := binary.LittleEndian
	if len(data) < headerSize {
		return nil, corruptf("%d bytes, shorter than its header", len(data))
	}
	if string(data[offMagic:offMagic+8]) != magic {
		return nil, corruptf("not a symbol index")
	}
	if crc32.Checksum(data[:offHdrCRC], castagnoli) != le.Uint32(data[offHdrCRC:]) {
		return nil, corruptf("header checksum mismatch")
	}
	if v := le.Uint32(data[offVersion:]); v != Version {
		return nil, fmt.Errorf("%w: version %d, this reader reads %d", ErrVersion, v, Version)
	}
	h := &header{
		base:    le.Uint64(data[offBase:]),
		nRanges: le.Uint32(data[offNRanges:]),
		ranges:  le.Uint64(data[offRanges:]),
		records: le.Uint64(data[offRecords:]),
		recN:    le.Uint64(data[offRecLen:]),
		strings: le.Uint64(data[offStrings:]),
		strN:    le.Uint64(data[offStrLen:]),
		size:    le.Uint64(data[offFileSize:]),
		bodyCRC: le.Uint32(data[offBodyCRC:]),
	}
	h.Flags = le.Uint32(data[offFlags:])
	h.ImageBase = le.Uint64(data[offImageBase:])
	h.Stext = le.Uint64(data[offStext:])
	n := int(data[offIDLen])
	if n > maxBuildID {
		return nil, corruptf("build id of %d bytes", n)
	}
	// A copy: a header field must not keep the mapping's first page in.
	h.BuildID = bytes.Clone(data[offID : offID+n])
	// Sections follow each other in order and end the file: any other
	// shape is forged, whatever its checksums say.
	switch {
	case h.size != uint64(size):
		return nil, corruptf("header says %d bytes, file has %d", h.size, size)
	case h.ranges != headerSize:
		return nil, corruptf("ranges at %d", h.ranges)
	case h.nRanges == 0:
		return nil, corruptf("no ranges")
	case h.records != h.ranges+uint64(h.nRanges)*rangeSize:
		return nil, corruptf("records at %d, ranges end at %d", h.records, h.ranges+uint64(h.nRanges)*rangeSize)
	case h.recN > h.size || h.records > h.size-h.recN || h.strings != h.records+h.recN:
		return nil, corruptf("records [%d,+%d) do not end where strings start (%d)", h.records, h.recN, h.strings)
	case h.strN > h.size || h.strings > h.size-h.strN || h.strings+h.strN != h.size:
		return nil, corruptf("strings [%d,+%d) do not end the file (%d bytes)", h.strings, h.strN, h.size)
	case h.recN >= uint64(noRecord) || h.strN >= 1<<32-1:
		return nil, corruptf("sections past 4 GiB")
	}
	return h, nil
}

// ErrVersion: the index was written by another version of this format.
// It is not corrupt; it is rebuilt.
var ErrVersion = errors.New("symbol index of another format version")
