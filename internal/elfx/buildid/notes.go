// Package buildid reads the identities a native file carries: the GNU build
// id note, the Go build id, and OpenTelemetry's content hash (the profiling
// "file id") that profilers send when a file has no build id at all.
package buildid

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/frame"
)

// ErrNotFound is returned when a file carries no build id of the kind asked.
var ErrNotFound = errors.New("build id not found")

// errCorrupt marks malformed note data; it wraps frame.ErrCorruptFile so
// callers can count it.
var errCorrupt = fmt.Errorf("malformed ELF note: %w", frame.ErrCorruptFile)

// Note is one ELF note record. Name excludes the NUL terminator; Name and
// Desc alias the input.
type Note struct {
	Name string
	Type uint32
	Desc []byte
}

// Note names and types we look for.
const (
	ntGNUBuildID = 3 // NT_GNU_BUILD_ID
	ntGoBuildID  = 4 // the Go linker's note type for its build id
)

// ParseNotes walks raw note bytes (a SHT_NOTE section or a PT_NOTE segment),
// calling fn for each record until fn returns false. align is the section's
// or segment's alignment: 8 selects the 8-byte padding used by some notes
// (.note.gnu.property); anything up to 4 means the classic 4-byte padding.
// The header words are always 4 bytes. A record that does not fit the data
// stops the walk with an error wrapping frame.ErrCorruptFile; trailing
// padding shorter than a header is ignored, as readelf does.
func ParseNotes(data []byte, order binary.ByteOrder, align uint64, fn func(Note) bool) error {
	switch {
	case align <= 4:
		align = 4
	case align == 8:
	default:
		return fmt.Errorf("note alignment %d: %w", align, errCorrupt)
	}
	// Every offset below is a uint64 no larger than len(data)+2^33, so
	// additions cannot wrap.
	n := uint64(len(data))
	for off := uint64(0); off+12 <= n; {
		namesz := uint64(order.Uint32(data[off:]))
		descsz := uint64(order.Uint32(data[off+4:]))
		typ := order.Uint32(data[off+8:])
		nameOff := off + 12
		descOff := alignUp(nameOff+namesz, align)
		next := alignUp(descOff+descsz, align)
		if nameOff+namesz > n || descOff+descsz > n {
			return fmt.Errorf("note at %#x (namesz %d, descsz %d) overruns %d bytes: %w",
				off, namesz, descsz, n, errCorrupt)
		}
		name := data[nameOff : nameOff+namesz]
		// The name is NUL-terminated; namesz counts the terminator.
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		if !fn(Note{Name: string(name), Type: typ, Desc: data[descOff : descOff+descsz : descOff+descsz]}) {
			return nil
		}
		if next <= off { // cannot happen (header is 12 bytes), but never loop
			break
		}
		off = next
	}
	return nil
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// HexString renders an id as lowercase hex, the form build-id paths and
// OpenTelemetry attributes use.
func HexString(id []byte) string { return hex.EncodeToString(id) }

// ParseHex is the inverse of HexString; it accepts either case.
func ParseHex(s string) ([]byte, error) {
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("build id %q: %w", s, err)
	}
	return b, nil
}
