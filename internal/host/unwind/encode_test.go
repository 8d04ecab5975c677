//go:build amd64 || arm64

package unwind

import (
	"bytes"
	"debug/elf"
	"testing"

	"github.com/profsym/profsym/bpf"

	"github.com/profsym/profsym/internal/host/unwind/table"
)

func TestEncode(t *testing.T) {
	tb := &table.Table{Arch: elf.EM_X86_64, Rows: []table.Row{
		{PC: 0x1000, CFA: table.CFASP, CFAOffset: 8, RAOffset: -8},
		{PC: 0x1001, CFA: table.CFASP, CFAOffset: 16, RAOffset: -8, FPSaved: true, FPOffset: -16},
		{PC: 0x1004, CFA: table.CFAFP, CFAOffset: 16, RAOffset: -8, FPSaved: true, FPOffset: -16},
		{PC: 0x1004, CFA: table.CFAFP, CFAOffset: 16, RAOffset: -8, FPSaved: true, FPOffset: -16},
		{PC: 0x1010, CFA: table.CFASP, CFAOffset: 1 << 20, RAOffset: -8}, // too big: fallback
		{PC: 0x1020, CFA: table.CFASP, CFAOffset: 8, RAOffset: -16},      // RA elsewhere: fallback
		{PC: 0x1030, Kind: table.KindSignal},
		{PC: 0x1040, CFA: table.CFAPLT, RAOffset: -8},
		{PC: 0x1050, Kind: table.KindEnd},
		{PC: 0x1060, Kind: table.KindFallback},
	}}
	enc := encode(tb)
	e := struct {
		base      uint64
		rows      []bpf.ProfileUnwindRow
		fallbacks int
	}{enc.base, enc.rows.slice(), enc.fallbacks}
	if e.base != 0x1000 {
		t.Fatalf("base %#x", e.base)
	}
	type r struct {
		pc   uint32
		info uint8
		cfa  uint16
		fp   int8
	}
	want := []r{
		{0, rowNormal | cfaSP<<2, 8, 0},
		{1, rowNormal | cfaSP<<2 | rowFPSaved, 16, -2},
		{4, rowNormal | cfaFP<<2 | rowFPSaved, 16, -2},
		{0x10, rowFallback, 0, 0}, // the two unencodable rows merge
		{0x30, rowSignal, 0, 0},
		{0x40, rowNormal | cfaPLT<<2, 0, 0},
		{0x50, rowEnd, 0, 0},
		{0x60, rowFallback, 0, 0},
	}
	if len(e.rows) != len(want) {
		t.Fatalf("got %d rows %+v, want %d", len(e.rows), e.rows, len(want))
	}
	for i, w := range want {
		g := e.rows[i]
		if g.Pc != w.pc || g.Info != w.info || g.CfaOff != w.cfa || g.FpOff != w.fp {
			t.Errorf("row %d: got %+v, want %+v", i, g, w)
		}
	}
	if e.fallbacks != 2 {
		t.Errorf("fallbacks %d, want 2", e.fallbacks)
	}
}

func TestEncodeFarRows(t *testing.T) {
	enc := encode(&table.Table{Rows: []table.Row{
		{PC: 0x1000, CFA: table.CFASP, CFAOffset: 8, RAOffset: -8},
		{PC: 0x1000 + 1<<33, CFA: table.CFASP, CFAOffset: 8, RAOffset: -8},
	}})
	rows := enc.rows.slice()
	if len(rows) != 2 || rows[1].Info != rowFallback {
		t.Fatalf("a row 8 GiB away must end the table: %+v", rows)
	}
}

// TestRowBuf: rows across chunk boundaries come back in order, and the
// kernel layout is what putRows writes.
func TestRowBuf(t *testing.T) {
	var b rowBuf
	n := 2*chunkRows + 5
	for i := range n {
		b.append(bpf.ProfileUnwindRow{Pc: uint32(i), CfaOff: uint16(i), Info: uint8(i), FpOff: int8(i)})
	}
	if b.len() != n || len(b.chunks) != 3 {
		t.Fatalf("%d rows in %d chunks", b.len(), len(b.chunks))
	}
	dst := make([]byte, n*RowBytes)
	b.writeTo(dst)
	want := make([]byte, n*RowBytes)
	putRows(want, b.slice())
	if !bytes.Equal(dst, want) {
		t.Fatal("writeTo differs from putRows")
	}
	for i, r := range b.slice() {
		if r.Pc != uint32(i) {
			t.Fatalf("row %d: %+v", i, r)
		}
	}
	b.release()
	if b.len() != 0 || b.chunks != nil {
		t.Fatal("release kept rows")
	}
}

// slice copies the rows out.
func (b *rowBuf) slice() []bpf.ProfileUnwindRow {
	out := make([]bpf.ProfileUnwindRow, b.n)
	for i := range out {
		out[i] = b.at(i)
	}
	return out
}

func TestAllocator(t *testing.T) {
	a := newAllocator(100)
	s1, _ := a.alloc(40)
	s2, _ := a.alloc(40)
	if _, ok := a.alloc(40); ok {
		t.Fatal("allocated past the end")
	}
	a.release(s1)
	if _, ok := a.alloc(30); ok {
		t.Fatal("reused a span before the grace period")
	}
	a.settle()
	s3, ok := a.alloc(30)
	if !ok || s3.off != 0 {
		t.Fatalf("got %+v %v", s3, ok)
	}
	a.release(s2)
	a.release(s3)
	a.settle()
	if s, ok := a.alloc(100); !ok || s.off != 0 || a.used != 100 {
		t.Fatalf("spans did not coalesce: %+v %v, free %+v", s, ok, a.free)
	}
}

// Register and load CFA rules: bits 5-7 carry the register code (rule
// undefined) or the load's addend / 8 (rule SP or FP); what does not fit
// falls back.
func TestEncodeRegisterAndDeref(t *testing.T) {
	tb := &table.Table{Arch: elf.EM_X86_64, Rows: []table.Row{
		{PC: 0x1000, CFA: table.CFAReg, CFARegister: 0, CFAOffset: 8, RAOffset: -8},                                // rax + 8
		{PC: 0x1010, CFA: table.CFAReg, CFARegister: 11, CFAOffset: 8, RAOffset: -8, FPSaved: true, FPOffset: -24}, // r11 + 8
		{PC: 0x1020, CFA: table.CFAReg, CFARegister: 3, CFAOffset: 8, RAOffset: -8},                                // rbx: not kept
		{PC: 0x1030, CFA: table.CFASPDeref, CFAOffset: 24, CFAAdd: 8, RAOffset: -8, FPSaved: true, FPOffset: -24},  // *(rsp+24)+8
		{PC: 0x1040, CFA: table.CFAFPDeref, CFAOffset: -8, CFAAdd: 56, RAOffset: -8},                               // *(rbp-8)+56
		{PC: 0x1050, CFA: table.CFASPDeref, CFAOffset: 16, CFAAdd: 64, RAOffset: -8},                               // +64: too big
		{PC: 0x1060, Kind: table.KindFallback},
	}}
	enc := encode(tb)
	rows := enc.rows.slice()
	want := []bpf.ProfileUnwindRow{
		{Pc: 0x00, Info: rowNormal | cfaUndef<<2 | 1<<regShift, CfaOff: 8},
		{Pc: 0x10, Info: rowNormal | cfaUndef<<2 | 7<<regShift | rowFPSaved, CfaOff: 8, FpOff: -3},
		{Pc: 0x20, Info: rowFallback},
		{Pc: 0x30, Info: rowNormal | cfaSP<<2 | 1<<regShift | rowFPSaved, CfaOff: 24, FpOff: -3},
		{Pc: 0x40, Info: rowNormal | cfaFP<<2 | 7<<regShift, CfaOff: 0xfff8},
		{Pc: 0x50, Info: rowFallback},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows %+v, want %d", len(rows), rows, len(want))
	}
	for i, w := range want {
		if rows[i] != w {
			t.Errorf("row %d: got %+v, want %+v", i, rows[i], w)
		}
	}
}

// arm64 rows (bpf/arch.h): the RA in LR (fp_off 0), a frame record at
// fp_off (FP, then the RA), the RA alone at fp_off; x86-64's rules and an
// FP saved apart from the RA fall back.
func TestEncodeARM64(t *testing.T) {
	tb := &table.Table{Arch: elf.EM_AARCH64, Rows: []table.Row{
		{PC: 0x1000, CFA: table.CFASP}, // entry: RA in LR
		{PC: 0x1004, CFA: table.CFASP, CFAOffset: 32, RAOffset: -24, FPSaved: true, FPOffset: -32}, // stp x29, x30, [sp, #-32]!
		{PC: 0x1010, CFA: table.CFAFP, CFAOffset: 16, RAOffset: -8, FPSaved: true, FPOffset: -16},  // mov x29, sp
		{PC: 0x1020, CFA: table.CFASP, CFAOffset: 16, RAOffset: -16},                               // str x30, [sp, #-16]!
		{PC: 0x1030, CFA: table.CFASP, CFAOffset: 32, RAOffset: -8, FPSaved: true, FPOffset: -32},  // apart: fallback
		{PC: 0x1040, CFA: table.CFAPLT}, // x86-64 only: fallback
		{PC: 0x1050, Kind: table.KindFallback},
	}}
	enc := encode(tb)
	rows := enc.rows.slice()
	type r struct {
		pc   uint32
		info uint8
		cfa  uint16
		fp   int8
	}
	want := []r{
		{0, rowNormal | cfaSP<<2, 0, 0},
		{4, rowNormal | cfaSP<<2 | rowFPSaved, 32, -4},
		{0x10, rowNormal | cfaFP<<2 | rowFPSaved, 16, -2},
		{0x20, rowNormal | cfaSP<<2, 16, -2},
		{0x30, rowFallback, 0, 0},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows %+v, want %d", len(rows), rows, len(want))
	}
	for i, w := range want {
		g := rows[i]
		if g.Pc != w.pc || g.Info != w.info || g.CfaOff != w.cfa || g.FpOff != w.fp {
			t.Errorf("row %d: got %+v, want %+v", i, g, w)
		}
	}
	if enc.fallbacks != 2 {
		t.Errorf("%d fallbacks, want 2", enc.fallbacks)
	}
}
