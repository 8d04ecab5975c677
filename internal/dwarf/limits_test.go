package dwarf

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

// manyUnits is a .debug_info of n minimal compile units, unit i covering
// [0x1000+16i, 0x1010+16i), and their shared .debug_abbrev: 24 bytes of
// file per unit, the smallest a unit with code can be.
func manyUnits(n int) sections {
	abbrev := []byte{1, 0x11, 0, 0x11, 0x01, 0x12, 0x06, 0, 0, 0}
	info := make([]byte, 0, n*24)
	for i := range n {
		info = binary.LittleEndian.AppendUint32(info, 20)
		info = binary.LittleEndian.AppendUint16(info, 4)
		info = binary.LittleEndian.AppendUint32(info, 0)
		info = append(info, 8, 1)
		info = binary.LittleEndian.AppendUint64(info, 0x1000+16*uint64(i))
		info = binary.LittleEndian.AppendUint32(info, 16)
	}
	return sections{info: info, abbrev: abbrev}
}

// Issue 31: a unit header is 12 bytes of file and about 220 bytes of index,
// so a file of nothing but units (up to the 4 GiB a file may be) made an
// index 18 times its size before anything was checked. The index is
// charged to the file's budget: units past it are not indexed, and a
// lookup that lands there says the limit was hit.
func TestUnitIndexCharged(t *testing.T) {
	const n = 100_000
	s := manyUnits(n)
	const paid = 10_000
	const budget = paid * unitBytes
	var spent int64
	charge := func(b int64) error {
		if spent+b > budget {
			return frame.ErrLimitExceeded
		}
		spent += b
		return nil
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tab, err := newTable(s, Extra{}, charge)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tab.units); got != paid {
		t.Errorf("%d units indexed, want the %d the budget pays for", got, paid)
	}
	// What indexing allocated stays in proportion to what it was charged
	// (unit DIEs decoded for the address index included).
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d units: %d bytes allocated, %d held, %d charged", len(tab.units), after.TotalAlloc-before.TotalAlloc, held, spent)
	if held > spent {
		t.Errorf("the index holds %d bytes against %d charged", held, spent)
	}
	runtime.KeepAlive(tab)
	frames, _, err := tab.Lookup(0x1000+16*5000+4, false, nil)
	if err != nil || len(frames) != 0 {
		// The unit has no name or lines: no frames, but no error either.
		t.Errorf("an indexed unit: %v, %v", frames, err)
	}
	if _, _, err := tab.Lookup(0x1000+16*50_000+4, false, nil); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("a unit past the budget: %v, want a limit error", err)
	}
	// With no budget, a table of only units not yet charged for stops at
	// unchargedUnits (split units' sections).
	if units, err := scanUnits(s.info, nil); len(units) != unchargedUnits || !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("uncharged scan: %d units, %v", len(units), err)
	}
}
