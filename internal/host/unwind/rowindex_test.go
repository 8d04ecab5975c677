//go:build linux

package unwind

import (
	"math/rand/v2"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/testfixture"
)

// A stack copy's walk finds its rows through the file's index and one
// block read from the mmapable rows map: the same row as the binary search
// of map lookups it replaced, for every offset (inside blocks, at their
// edges, before the first row, past the last), with the table's span not
// aligned to a page or a block.
func TestFindRowByIndex(t *testing.T) {
	testfixture.Short(t, "eBPF")
	rowsMap, err := ebpf.NewMap(&ebpf.MapSpec{
		Type: ebpf.Array, KeySize: 4, ValueSize: RowBytes, MaxEntries: 8192, Flags: unix.BPF_F_MMAPABLE,
	})
	if err != nil {
		testfixture.SkipOrFail(t, "an mmapable array map: %v", err)
	}
	defer rowsMap.Close()
	m := &Manager{maps: Maps{Rows: rowsMap}}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 255, 256, 257, 3001} {
		var rows rowBuf
		pc := uint32(0x40)
		for i := range n {
			rows.append(bpf.ProfileUnwindRow{Pc: pc, CfaOff: uint16(i), Info: uint8(i), FpOff: int8(i)})
			pc += 1 + uint32(rnd.IntN(40))
		}
		sp := span{off: 37, n: uint32(n)} // 296 bytes into the map's first page
		if err := m.writeRows(sp, &rows); err != nil {
			t.Fatal(err)
		}
		f := &file{rows: sp, rowIndex: rowIndex(&rows)}
		offs := []uint32{0, pc, pc + 8}
		for i := range n {
			r := rows.at(i).Pc
			offs = append(offs, r-1, r, r+1)
		}
		for _, off := range offs {
			got, gotOK := m.findRow(f, off)
			want, wantOK := m.findRowByLookups(f, off)
			if gotOK != wantOK || gotOK && got != want {
				t.Fatalf("%d rows, offset %#x: by index %+v %v, by lookups %+v %v", n, off, got, gotOK, want, wantOK)
			}
		}
		rows.release()
	}
}
