package table

import "math"

// The CFA expressions the table can encode: GNU ld's x86-64 PLT rule and
// OpenSSL-style saved stack pointers (*(SP or FP + off) + add). Any other
// expression cannot be encoded.

// DWARF expression opcodes used by the PLT's CFA expression.
const (
	opConst1u    = 0x08
	opAnd        = 0x1a
	opGe         = 0x2a
	opShl        = 0x24
	opPlus       = 0x22
	opLit0       = 0x30
	opBreg0      = 0x70
	opDeref      = 0x06
	opPlusUconst = 0x23
)

// classifyCFAExpr recognises the CFA expression that GNU ld writes for
// x86-64 PLT entries:
//
//	DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
//	DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
//
// that is CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0): within each 16-byte
// entry, the push of the relocation index at offset 6 has executed from
// offset 11 on. Variants with another threshold (IBT PLTs) and any other
// expression cannot be encoded.
func classifyCFAExpr(b []byte, regs archRegs, ra uint64) (k cfaKind, reg uint64, off, add int64) {
	if reg, off, add, ok := derefExpr(b, regs); ok {
		return cfaDeref, reg, off, add
	}
	return classifyPLTExpr(b, regs.sp, ra), 0, 0, 0
}

// derefExpr recognises CFA = *(SP or FP + off) + add:
//
//	DW_OP_breg7 (rsp) off; DW_OP_deref; DW_OP_plus_uconst add
//
// OpenSSL's assembly saves the entry SP in its realigned frame and says
// so this way; gcc's realigned functions say *(rbp-8)+add... with rbp.
// Only SP and FP are known at every frame, so other registers are not
// accepted.
func derefExpr(b []byte, regs archRegs) (reg uint64, off, add int64, ok bool) {
	r := reader{b: b}
	op := r.u8()
	if op < opBreg0 || op >= opBreg0+32 {
		return 0, 0, 0, false
	}
	reg, off = uint64(op-opBreg0), r.sleb()
	if reg != regs.sp && reg != regs.fp {
		return 0, 0, 0, false
	}
	if r.u8() != opDeref || r.u8() != opPlusUconst {
		return 0, 0, 0, false
	}
	u := r.uleb()
	if r.bad || r.left() != 0 || u > math.MaxInt32 {
		return 0, 0, 0, false
	}
	return reg, off, int64(u), true
}

func classifyPLTExpr(b []byte, sp, ra uint64) cfaKind {
	r := reader{b: b}
	breg := func(reg uint64, off int64) bool {
		op := r.u8()
		return op >= opBreg0 && op < opBreg0+32 && uint64(op-opBreg0) == reg && r.sleb() == off && !r.bad
	}
	if !breg(sp, 8) || !breg(ra, 0) || r.u8() != opLit0+15 || r.u8() != opAnd {
		return cfaOtherExp
	}
	var k uint8
	switch op := r.u8(); {
	case op >= opLit0 && op < opLit0+32:
		k = op - opLit0
	case op == opConst1u:
		k = r.u8()
	default:
		return cfaOtherExp
	}
	if r.u8() != opGe || r.u8() != opLit0+3 || r.u8() != opShl || r.u8() != opPlus || r.bad || r.left() != 0 {
		return cfaOtherExp
	}
	if k != 11 {
		return cfaOtherExp
	}
	return cfaPLT
}
