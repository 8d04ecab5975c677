package symindex

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/profsym/profsym/internal/frame"
)

// Writer compiles an index from ranges given in address order. Records
// (an address's whole answer) and strings are stored once however many
// ranges share them, and adjacent ranges with the same answer merge.
type Writer struct {
	meta    Meta
	base    uint64
	started bool
	last    uint64
	ranges  []byte
	lastRec uint32

	records []byte
	recOf   map[string]uint32
	strs    []byte
	strOf   map[string]uint32
	scratch []byte
}

// NewWriter starts an index of the object meta describes.
func NewWriter(meta Meta) (*Writer, error) {
	if len(meta.BuildID) == 0 || len(meta.BuildID) > maxBuildID {
		return nil, fmt.Errorf("symbol index: a build id of 1 to %d bytes is needed, got %d", maxBuildID, len(meta.BuildID))
	}
	return &Writer{meta: meta, recOf: map[string]uint32{}, strOf: map[string]uint32{}, lastRec: noRecord}, nil
}

// Add says that from lo on (up to the next Add, or Finish's end) the answer
// is frames, innermost first; nil frames: no answer. lo must grow.
func (w *Writer) Add(lo uint64, frames []frame.Frame) error {
	if !w.started {
		w.base, w.started = lo, true
	} else if lo <= w.last {
		return fmt.Errorf("symbol index: range at %#x after %#x", lo, w.last)
	}
	if lo-w.base >= 1<<32 {
		return fmt.Errorf("symbol index: %#x is 4 GiB or more past the first range (%#x)", lo, w.base)
	}
	rec := noRecord
	if len(frames) > 0 {
		var err error
		if rec, err = w.record(frames); err != nil {
			return err
		}
	}
	w.last = lo
	if rec == w.lastRec && len(w.ranges) > 0 {
		return nil // the same answer goes on
	}
	w.lastRec = rec
	w.ranges = binary.LittleEndian.AppendUint32(w.ranges, uint32(lo-w.base))
	w.ranges = binary.LittleEndian.AppendUint32(w.ranges, rec)
	return nil
}

func (w *Writer) record(frames []frame.Frame) (uint32, error) {
	if len(frames) > MaxFrames {
		return 0, fmt.Errorf("symbol index: %d frames for one address, at most %d", len(frames), MaxFrames)
	}
	b := binary.AppendUvarint(w.scratch[:0], uint64(len(frames)))
	for i := range frames {
		f := &frames[i]
		for _, s := range [...]string{f.Name, f.File, f.StartFile} {
			if len(s) > MaxStringBytes {
				// Cut, the answer would differ from the debug file's.
				return 0, fmt.Errorf("symbol index: a name of %d bytes, at most %d", len(s), MaxStringBytes)
			}
		}
		for _, v := range [...]uint64{
			w.str(f.Name), w.str(f.File), uint64(f.Line), uint64(f.Column),
			uint64(f.Discriminator), w.str(f.StartFile), uint64(f.StartLine), f.StartAddress,
		} {
			b = binary.AppendUvarint(b, v)
		}
	}
	w.scratch = b
	if off, ok := w.recOf[string(b)]; ok {
		return off, nil
	}
	off := uint64(len(w.records))
	if off+uint64(len(b)) >= uint64(noRecord) {
		return 0, fmt.Errorf("symbol index: records past 4 GiB")
	}
	w.records = append(w.records, b...)
	w.recOf[string(b)] = uint32(off)
	return uint32(off), nil
}

// str returns s's string offset + 1, 0 for "".
func (w *Writer) str(s string) uint64 {
	if s == "" {
		return 0
	}
	if off, ok := w.strOf[s]; ok {
		return uint64(off) + 1
	}
	off := uint32(len(w.strs))
	w.strs = binary.AppendUvarint(w.strs, uint64(len(s)))
	w.strs = append(w.strs, s...)
	w.strOf[s] = off
	return uint64(off) + 1
}

// Finish ends the last range at end and writes the index to out.
func (w *Writer) Finish(end uint64, out io.Writer) (int64, error) {
	if !w.started {
		w.base, w.started = end, true
	} else if end <= w.last {
		return 0, fmt.Errorf("symbol index: end %#x not past the last range %#x", end, w.last)
	}
	if end-w.base >= 1<<32 {
		return 0, fmt.Errorf("symbol index: end %#x is 4 GiB or more past the first range (%#x)", end, w.base)
	}
	w.ranges = binary.LittleEndian.AppendUint32(w.ranges, uint32(end-w.base))
	w.ranges = binary.LittleEndian.AppendUint32(w.ranges, noRecord)
	if uint64(len(w.strs)) >= 1<<32-1 {
		return 0, fmt.Errorf("symbol index: strings past 4 GiB")
	}
	h := header{Meta: w.meta, base: w.base, nRanges: uint32(len(w.ranges) / rangeSize)}
	h.ranges = headerSize
	h.records = h.ranges + uint64(len(w.ranges))
	h.recN = uint64(len(w.records))
	h.strings = h.records + h.recN
	h.strN = uint64(len(w.strs))
	h.size = h.strings + h.strN
	crc := crc32.Update(0, castagnoli, w.ranges)
	crc = crc32.Update(crc, castagnoli, w.records)
	h.bodyCRC = crc32.Update(crc, castagnoli, w.strs)
	var hb [headerSize]byte
	h.put(hb[:])
	bw := bufio.NewWriterSize(out, 1<<16)
	for _, b := range [][]byte{hb[:], w.ranges, w.records, w.strs} {
		if _, err := bw.Write(b); err != nil {
			return 0, err
		}
	}
	return int64(h.size), bw.Flush()
}

// Ranges is how many ranges the index holds so far.
func (w *Writer) Ranges() int { return len(w.ranges) / rangeSize }
