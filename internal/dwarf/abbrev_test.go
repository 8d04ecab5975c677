package dwarf

import (
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

// Units whose abbreviation offsets point into the middle of one long table
// would each decode the rest of it: memory quadratic in a small section.
// The decoded bytes stay within twice the section, and are counted.
func TestOverlappingAbbrevTables(t *testing.T) {
	const n = 10000 // codes fit two uleb bytes
	var sec []byte
	offs := make([]uint64, n)
	for i := 0; i < n; i++ {
		offs[i] = uint64(len(sec))
		// code i+1 (two-byte uleb), DW_TAG_subprogram, no children,
		// DW_AT_name DW_FORM_string, end of attributes.
		c := uint64(i + 1)
		sec = append(sec, byte(c&0x7f|0x80), byte(c>>7), tagSubprogram, 0, atName, formString, 0, 0)
	}
	sec = append(sec, 0)
	tab := &Table{sec: sections{abbrev: sec}, abbrevs: map[abbrevKey]*abbrevTable{}}
	shape := unitShape{version: 4, addrSize: 8, offSize: 4}
	var failed error
	ok := 0
	for _, off := range offs {
		if _, err := tab.abbrevsFor(&unit{abbrevOff: off, shape: shape}); err != nil {
			failed = err
			break
		}
		ok++
	}
	if !errors.Is(failed, frame.ErrCorruptFile) {
		t.Fatalf("%d overlapping tables decoded without error (%d bytes from a %d-byte section)", ok, tab.abbrevBytes, len(sec))
	}
	if tab.abbrevBytes > 2*len(sec)+maxAbbrevSlack {
		t.Errorf("%d bytes decoded from a %d-byte section", tab.abbrevBytes, len(sec))
	}
	if tab.parsed.Load() < int64(tab.abbrevBytes) {
		t.Errorf("abbreviation tables of %d bytes count %d in SizeBytes", tab.abbrevBytes, tab.parsed.Load())
	}
	t.Logf("%d of %d units' tables decoded, %d bytes from %d, then: %v", ok, n, tab.abbrevBytes, len(sec), failed)

	// Disjoint tables, one per unit as producers write them, all decode.
	tab = &Table{sec: sections{abbrev: sec}, abbrevs: map[abbrevKey]*abbrevTable{}}
	if _, err := tab.abbrevsFor(&unit{abbrevOff: 0, shape: shape}); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.abbrevsFor(&unit{abbrevOff: 0, shape: unitShape{version: 5, addrSize: 8, offSize: 4}}); err != nil {
		t.Errorf("one table in two shapes: %v", err)
	}
}
