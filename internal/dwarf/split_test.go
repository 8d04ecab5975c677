package dwarf

import (
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

// TestCUIndexBounds builds the hostile unit indexes the bounds are for:
// each is refused as corrupt before a table is read.
func TestCUIndexBounds(t *testing.T) {
	good := cuIndexBytes(5, []uint64{7, 9}, []uint32{sectInfo, sectAbbrev}, 4)
	if ix, err := parseCUIndex(good); err != nil {
		t.Fatalf("a well-formed index: %v", err)
	} else if row, ok := ix.find(9); !ok || row != 1 {
		t.Fatalf("find(9) = %d, %v", row, ok)
	}
	set := func(b []byte, off int, v uint32) []byte {
		c := append([]byte(nil), b...)
		c[off], c[off+1], c[off+2], c[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		return c
	}
	for name, b := range map[string][]byte{
		"slots over maxIndexSlots": set(good, 12, maxIndexSlots*2),
		"slots not a power of two": set(good, 12, 3),
		"more units than slots":    set(good, 8, 5),
		"section kinds over bound": set(good, 4, maxIndexSections+1),
		"no section kinds":         set(good, 4, 0),
		"tables past the section":  good[:len(good)-1],
		"version 3":                set(good, 0, 3),
		"truncated header":         good[:10],
		"a billion units in slots": set(set(good, 12, 1<<24), 8, 1<<24),
	} {
		if _, err := parseCUIndex(b); !errors.Is(err, frame.ErrCorruptFile) {
			t.Errorf("%s: %v, want corrupt_file", name, err)
		}
	}
	// A row number past the units, and a contribution past its section,
	// are refused when looked up.
	ix, _ := parseCUIndex(cuIndexBytes(5, []uint64{7}, []uint32{sectInfo}, 2))
	d := &DWP{all: SplitSections{Info: make([]byte, 4)}, index: ix}
	if _, err := d.Sections(7); !errors.Is(err, frame.ErrCorruptFile) {
		t.Errorf("contribution of 8 bytes in a 4-byte section: %v", err)
	}
	if _, err := d.Sections(8); !errors.Is(err, frame.ErrNotFound) {
		t.Errorf("an id not in the package: %v", err)
	}
}
