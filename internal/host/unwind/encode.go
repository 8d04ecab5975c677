package unwind

import (
	"debug/elf"
	"math"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/unwind/table"
)

// Row encoding shared with bpf/unwind.h: 8 bytes per row.
const (
	rowNormal   = 0
	rowEnd      = 1
	rowSignal   = 2
	rowFallback = 3

	cfaUndef = 0
	cfaSP    = 1
	cfaFP    = 2
	cfaPLT   = 3

	rowFPSaved = 1 << 4

	// RowBytes is the size of one row in the kernel.
	RowBytes = 8
	// MappingBytes is the size of one mapping entry in the kernel.
	MappingBytes = 32
	// MaxRowsPerTable is what the BPF binary search reaches (22 steps).
	MaxRowsPerTable = 1<<22 - 1
	// MaxMappingsPerProcess is what the BPF mapping search reaches (10 steps).
	MaxMappingsPerProcess = 1<<10 - 1

	tableFP      = math.MaxUint32 // mapping without table: frame pointers
	statePending = 0
	stateReady   = 1
	stateNone    = 2
	stateLazy    = 3
)

// encoded is a table ready for the kernel.
type encoded struct {
	base      uint64 // ELF address of row offset 0
	rows      []bpf.ProfileUnwindRow
	fallbacks int // rows the format cannot express, stored as FP fallback
}

// encode turns builder rows into kernel rows. Rows whose PC is more than
// 4 GiB past the first one end the table (a fallback row), rows the 8-byte
// format cannot express (CFA offsets over 64 KiB, odd FP offsets, an RA not
// at CFA-8) become frame-pointer rows, and consecutive identical rows merge.
func encode(t *table.Table) encoded {
	var e encoded
	if len(t.Rows) == 0 {
		return e
	}
	e.base = t.Rows[0].PC
	e.rows = make([]bpf.ProfileUnwindRow, 0, len(t.Rows))
	raOff := int32(-8)
	if t.Arch != elf.EM_X86_64 && t.Arch != 0 {
		raOff = math.MinInt32 // only x86-64 rows are expressible today
	}
	for _, r := range t.Rows {
		off := r.PC - e.base
		if off > math.MaxUint32 {
			e.rows = append(e.rows, bpf.ProfileUnwindRow{Pc: math.MaxUint32, Info: rowFallback})
			e.fallbacks++
			break
		}
		k := bpf.ProfileUnwindRow{Pc: uint32(off)}
		ok := true
		switch r.Kind {
		case table.KindEnd:
			k.Info = rowEnd
		case table.KindSignal:
			k.Info = rowSignal
		case table.KindFallback:
			k.Info = rowFallback
		default:
			switch r.CFA {
			case table.CFASP:
				k.Info = rowNormal | cfaSP<<2
			case table.CFAFP:
				k.Info = rowNormal | cfaFP<<2
			case table.CFAPLT:
				k.Info = rowNormal | cfaPLT<<2
			default:
				k.Info = rowFallback
			}
			if r.CFA == table.CFASP || r.CFA == table.CFAFP {
				ok = r.CFAOffset > 0 && r.CFAOffset <= math.MaxUint16
				k.CfaOff = uint16(r.CFAOffset)
			}
			if r.CFA != table.CFAUndefined && r.RAOffset != raOff {
				ok = false
			}
			if r.FPSaved {
				ok = ok && r.FPOffset%8 == 0 && r.FPOffset/8 >= math.MinInt8 && r.FPOffset/8 <= math.MaxInt8
				k.Info |= rowFPSaved
				k.FpOff = int8(r.FPOffset / 8)
			}
		}
		if !ok {
			k = bpf.ProfileUnwindRow{Pc: k.Pc, Info: rowFallback}
			e.fallbacks++
		}
		if n := len(e.rows); n > 0 {
			last := e.rows[n-1]
			if last.Info == k.Info && last.CfaOff == k.CfaOff && last.FpOff == k.FpOff {
				continue // same rule as the row before: it already covers this PC
			}
			if last.Pc == k.Pc {
				e.rows[n-1] = k // a later row at the same PC wins
				continue
			}
		}
		e.rows = append(e.rows, k)
	}
	if len(e.rows) > MaxRowsPerTable {
		e.rows = e.rows[:MaxRowsPerTable]
		e.rows[MaxRowsPerTable-1] = bpf.ProfileUnwindRow{Pc: e.rows[MaxRowsPerTable-1].Pc, Info: rowFallback}
	}
	return e
}
