//go:build amd64 || arm64

package unwind

import (
	"debug/elf"
	"encoding/binary"
	"math"
	"sync"
	"unsafe"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/unwind/table"
)

// Row encoding shared with bpf/unwind.h (its enums, generated into package
// bpf): 8 bytes per row.
const (
	rowNormal   = uint8(bpf.ProfileRowKindROW_NORMAL)
	rowEnd      = uint8(bpf.ProfileRowKindROW_END)
	rowSignal   = uint8(bpf.ProfileRowKindROW_SIGNAL)
	rowFallback = uint8(bpf.ProfileRowKindROW_FALLBACK)

	cfaUndef = uint8(bpf.ProfileCfaRuleCFA_UNDEF)
	cfaSP    = uint8(bpf.ProfileCfaRuleCFA_SP)
	cfaFP    = uint8(bpf.ProfileCfaRuleCFA_FP)
	cfaPLT   = uint8(bpf.ProfileCfaRuleCFA_PLT)

	rowFPSaved = uint8(bpf.ProfileRowBitsROW_FP_SAVED)
	// A CFAReg row is rowNormal with cfaUndef and the register's code in
	// bits 5-7 (table.X86CFARegCode); on any frame but the innermost it steps with
	// frame pointers, as a fallback row does. With cfaSP or cfaFP, bits 5-7
	// k != 0 make a deref row: CFA = *(SP or FP + int16(CfaOff)) + 8k.
	regShift = uint8(bpf.ProfileRowBitsROW_REG_SHIFT)

	// MaxRowsPerTable is what the BPF binary search reaches.
	MaxRowsPerTable = 1<<bpf.ProfileUnwindLimitsROW_SEARCH_STEPS - 1
	// MaxMappingsPerProcess is what the BPF mapping search reaches.
	MaxMappingsPerProcess = 1<<bpf.ProfileUnwindLimitsMAP_SEARCH_STEPS - 1

	tableFP      = uint32(bpf.ProfileTableSlotTABLE_FP)   // mapping without table: frame pointers
	tableVDSO    = uint32(bpf.ProfileTableSlotTABLE_VDSO) // [vdso]: frame pointers, or the kernel's signal trampoline (arm64)
	statePending = uint32(bpf.ProfileTableStateTABLE_PENDING)
	stateReady   = uint32(bpf.ProfileTableStateTABLE_READY)
	stateNone    = uint32(bpf.ProfileTableStateTABLE_NONE)
	stateLazy    = uint32(bpf.ProfileTableStateTABLE_LAZY)
)

// The sizes above are the generated structs' (a compile error otherwise).
var (
	_ = [1]struct{}{}[unsafe.Sizeof(bpf.ProfileUnwindRow{})-RowBytes]
	_ = [1]struct{}{}[unsafe.Sizeof(bpf.ProfileUnwindMapping{})-MappingBytes]
)

// encoded is a table ready for the kernel.
type encoded struct {
	base      uint64 // ELF address of row offset 0
	rows      rowBuf
	fallbacks int // rows the format cannot express, stored as FP fallback
}

// encode turns a built table into kernel rows (see encoder).
func encode(t *table.Table) encoded {
	e := newEncoder(t.Arch)
	e.add(t.Rows)
	return e.finish()
}

// encoder turns builder rows into kernel rows as the builder hands them
// over (table.Stream), so that a build never holds more than the 8-byte
// rows. Rows whose PC is more than 4 GiB past the first one end the table
// (a fallback row), rows the 8-byte format cannot express (CFA offsets over
// 64 KiB, odd FP offsets, an RA not at CFA-8) become frame-pointer rows,
// and consecutive identical rows merge.
type encoder struct {
	e       encoded
	arm64   bool
	raOff   int32
	started bool
	ended   bool                 // a row past 4 GiB ended the table
	last    bpf.ProfileUnwindRow // the row before, not yet stored: a row at its PC replaces it
	hasLast bool
}

func newEncoder(arch elf.Machine) *encoder {
	e := &encoder{raOff: -8, arm64: arch == elf.EM_AARCH64}
	if arch != elf.EM_X86_64 && arch != elf.EM_AARCH64 && arch != 0 {
		e.raOff = math.MinInt32 // no rows for other machines
	}
	return e
}

// add takes the next rows; it never fails (its signature is table.Sink's).
func (c *encoder) add(rows []table.Row) error {
	for i := range rows {
		if c.ended {
			return nil
		}
		c.add1(&rows[i])
	}
	return nil
}

func (c *encoder) add1(r *table.Row) {
	if !c.started {
		c.started, c.e.base = true, r.PC
	}
	off := r.PC - c.e.base
	if off > math.MaxUint32 {
		c.store()
		c.e.rows.append(bpf.ProfileUnwindRow{Pc: math.MaxUint32, Info: rowFallback})
		c.e.fallbacks++
		c.ended = true
		return
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
		case table.CFASPDeref, table.CFAFPDeref:
			rule := uint8(cfaSP)
			if r.CFA == table.CFAFPDeref {
				rule = cfaFP
			}
			add := r.CFAAdd / 8
			ok = r.CFAAdd%8 == 0 && add >= 1 && add <= 7 && r.CFAOffset >= math.MinInt16 && r.CFAOffset <= math.MaxInt16
			k.Info = rowNormal | rule<<2 | uint8(add&7)<<regShift
			k.CfaOff = uint16(int16(r.CFAOffset))
		case table.CFAReg:
			code := table.X86CFARegCode(uint64(r.CFARegister))
			ok = code != 0 && r.CFAOffset >= 0 && r.CFAOffset <= math.MaxUint16
			k.Info = rowNormal | cfaUndef<<2 | code<<regShift
			k.CfaOff = uint16(r.CFAOffset)
		default:
			k.Info = rowFallback
		}
		if r.CFA == table.CFASP || r.CFA == table.CFAFP {
			// arm64: CFA == SP at a function's entry, RA in LR.
			ok = (r.CFAOffset > 0 || c.arm64 && r.CFAOffset == 0 && r.RAOffset == 0) && r.CFAOffset <= math.MaxUint16
			k.CfaOff = uint16(r.CFAOffset)
		}
		if c.arm64 {
			ok = ok && c.arm64Slots(r, &k)
			break
		}
		if r.CFA != table.CFAUndefined && r.RAOffset != c.raOff {
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
		c.e.fallbacks++
	}
	if c.hasLast {
		if c.last.Info == k.Info && c.last.CfaOff == k.CfaOff && c.last.FpOff == k.FpOff {
			return // same rule as the row before: it already covers this PC
		}
		if c.last.Pc == k.Pc {
			c.last = k // a later row at the same PC wins
			return
		}
		c.store()
	}
	c.last, c.hasLast = k, true
	return
}

// arm64Slots encodes where an arm64 row saved the RA and the caller's FP
// (bpf/arch.h): a frame record (FP, then RA 8 bytes above) at CFA +
// 8*fp_off with rowFPSaved; the RA alone there without it; fp_off 0
// without it: the RA is still in LR. Anything else (CFA rules of x86-64,
// FP saved apart from the RA) is not expressible.
func (c *encoder) arm64Slots(r *table.Row, k *bpf.ProfileUnwindRow) bool {
	if r.CFA != table.CFASP && r.CFA != table.CFAFP {
		return false
	}
	slot := r.RAOffset
	switch {
	case r.FPSaved:
		if r.RAOffset == 0 || r.RAOffset != r.FPOffset+8 {
			return false
		}
		slot = r.FPOffset
		k.Info |= rowFPSaved
	case r.RAOffset == 0:
		k.FpOff = 0
		return true
	}
	if slot%8 != 0 || slot/8 < math.MinInt8 || slot/8 > math.MaxInt8 || slot == 0 {
		return false
	}
	k.FpOff = int8(slot / 8)
	return true
}

func (c *encoder) store() {
	if c.hasLast {
		c.e.rows.append(c.last)
		c.hasLast = false
	}
}

// finish returns the table; the encoder is spent.
func (c *encoder) finish() encoded {
	c.store()
	if n := c.e.rows.len(); n > MaxRowsPerTable {
		c.e.rows.truncate(MaxRowsPerTable)
		last := c.e.rows.at(MaxRowsPerTable - 1)
		c.e.rows.set(MaxRowsPerTable-1, bpf.ProfileUnwindRow{Pc: last.Pc, Info: rowFallback})
	}
	return c.e
}

// rowBuf holds encoded rows in chunks from a pool shared by the builders:
// a build never reallocates a growing array (which would briefly hold both
// copies), and the chunks of one build serve the next.
type rowBuf struct {
	chunks []*rowChunk
	n      int
	cur    *rowChunk // the last chunk, holding k rows
	k      int
}

// chunkRows rows of 8 bytes: 128 KiB per chunk.
const chunkRows = 1 << 14

type rowChunk [chunkRows]bpf.ProfileUnwindRow

var chunkPool = sync.Pool{New: func() any { return new(rowChunk) }}

func (b *rowBuf) len() int { return b.n }

func (b *rowBuf) append(r bpf.ProfileUnwindRow) {
	if b.cur == nil || b.k == chunkRows {
		b.grow()
	}
	b.cur[b.k&(chunkRows-1)] = r
	b.k++
	b.n++
}

func (b *rowBuf) grow() {
	b.cur, b.k = chunkPool.Get().(*rowChunk), 0
	b.chunks = append(b.chunks, b.cur)
}

func (b *rowBuf) at(i int) bpf.ProfileUnwindRow { return b.chunks[i/chunkRows][i%chunkRows] }

func (b *rowBuf) set(i int, r bpf.ProfileUnwindRow) { b.chunks[i/chunkRows][i%chunkRows] = r }

func (b *rowBuf) truncate(n int) {
	if n < b.n {
		b.n = n
		b.chunks = b.chunks[:(n+chunkRows-1)/chunkRows]
		b.cur, b.k = nil, 0
		if len(b.chunks) > 0 {
			b.cur, b.k = b.chunks[len(b.chunks)-1], n-(len(b.chunks)-1)*chunkRows
		}
	}
}

// each calls fn for the rows of each chunk in order, with the index of its
// first row, until fn fails.
func (b *rowBuf) each(fn func(first int, rows []bpf.ProfileUnwindRow) error) error {
	for i, c := range b.chunks {
		n := min(b.n-i*chunkRows, chunkRows)
		if n <= 0 {
			break
		}
		if err := fn(i*chunkRows, c[:n]); err != nil {
			return err
		}
	}
	return nil
}

// writeTo copies the rows into dst in the kernel's layout.
func (b *rowBuf) writeTo(dst []byte) {
	_ = b.each(func(first int, rows []bpf.ProfileUnwindRow) error {
		putRows(dst[first*RowBytes:], rows)
		return nil
	})
}

// pooledChunks is how many chunks a release keeps for the next build (1 MiB,
// more than most tables need); a big table's others are garbage at once
// rather than held by the pool until the GC empties it.
const pooledChunks = 8

// release returns the chunks to the pool; the rows are gone.
func (b *rowBuf) release() {
	for i, c := range b.chunks {
		if i < pooledChunks {
			chunkPool.Put(c)
		}
		b.chunks[i] = nil
	}
	b.chunks, b.n, b.cur, b.k = nil, 0, nil, 0
}

// putRows writes rows in the kernel's layout.
// getRow reads back a row putRows wrote.
func getRow(b []byte) bpf.ProfileUnwindRow {
	return bpf.ProfileUnwindRow{
		Pc: binary.NativeEndian.Uint32(b), CfaOff: binary.NativeEndian.Uint16(b[4:]),
		Info: b[6], FpOff: int8(b[7]),
	}
}

func putRows(dst []byte, rows []bpf.ProfileUnwindRow) {
	for i, r := range rows {
		b := dst[i*RowBytes : i*RowBytes+RowBytes]
		binary.NativeEndian.PutUint32(b, r.Pc)
		binary.NativeEndian.PutUint16(b[4:], r.CfaOff)
		b[6] = r.Info
		b[7] = byte(r.FpOff)
	}
}
