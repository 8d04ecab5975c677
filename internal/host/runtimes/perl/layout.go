package perl

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/profsym/profsym/bpf"
)

// Why a Perl process cannot be walked.
var (
	errUnsupported = errors.New("perl build not supported")
	errNotReady    = errors.New("perl interpreter not ready")
)

// layout is where one Perl version keeps what the walker and the namer
// read. Perl exports none of it: each version's table was taken from its
// headers (offsetof in a program built against them) and is tested against
// that version's perl (the e2e test).
type layout struct {
	iStackinfo, iCurcop, iOp            uint16 // struct interpreter: PL_curstackinfo, PL_curcop, PL_op
	siCxstack, siPrev, siCxmax, siCxsub uint16 // struct stackinfo
	siCxix, siType                      uint16
	cxSize, cxOldcop, cxRetop, cxOldsub uint16 // PERL_CONTEXT
	cxCV                                uint16 // blk_sub.cv
	xcvStash, xcvGV, xcvFile, xcvFlags  uint16 // XPVCV
	xgvNameHEK, xgvStash                uint16 // XPVGV
	hvAux, auxName, auxNameCount        uint16 // xpvhv_with_aux, xpvhv_aux
	hekLen, hekKey                      uint16 // HEK
	copLine, copFile                    uint16 // COP (threaded: cop_file is a char*)
	xcvStart, opType, opNextstate       uint16 // XPVCV: xcv_start_u; OP: op_type's word; OP_NEXTSTATE
	typeCV, typeGV, typeHV              uint8  // SVt_PVCV, SVt_PVGV, SVt_PVHV
	cxtSub, cxpEvalBlock                uint8
	cvfNamed                            uint32
	svfOOK                              uint32
}

// layouts by version (minor of 5.x), threaded builds on x86-64. 5.40
// (trixie) and 5.42 (sid) have 5.36's offsets, compared field by field
// from their headers (docs/runtimes.md), but more ops before
// OP_NEXTSTATE; each is tested on its perl.
var layouts = map[int]layout{36: layout536, 40: with(layout536, 198), 42: with(layout536, 202)}

// with is l with the number of OP_NEXTSTATE, which differs.
func with(l layout, nextstate uint16) layout {
	l.opNextstate = nextstate
	return l
}

var layout536 = layout{
	iStackinfo: 224, iCurcop: 208, iOp: 8,
	siCxstack: 8, siPrev: 16, siCxmax: 36, siCxsub: 40, siCxix: 32, siType: 44,
	cxSize: 104, cxOldcop: 16, cxRetop: 48, cxOldsub: 56, cxCV: 72,
	xcvStash: 32, xcvGV: 56, xcvFile: 64, xcvFlags: 92,
	xgvNameHEK: 32, xgvStash: 40,
	hvAux: 32, auxName: 0, auxNameCount: 28,
	hekLen: 4, hekKey: 8,
	copLine: 36, copFile: 48,
	xcvStart: 40, opType: 32, opNextstate: 195,
	typeCV: 13, typeGV: 9, typeHV: 12,
	cxtSub: 9, cxpEvalBlock: 64,
	cvfNamed: 0x8000, svfOOK: 0x02000000,
}

// layoutOf is the layout of Perl 5.minor.
func layoutOf(minor int) (layout, error) {
	l, ok := layouts[minor]
	if !ok {
		return layout{}, fmt.Errorf("perl 5.%d: no layout for this version (5.36, 5.40 and 5.42 are walked): %w", minor, errUnsupported)
	}
	return l, nil
}

// tlsData is where glibc (x86-64) keeps pthread key 0's value from the
// thread pointer: struct pthread's specific_1stblock[0].data (0x310 + 8),
// the same from glibc 2.26 to 2.41.
const tlsData = 0x318

// bpf is the walker's entry for a process with layout l.
func (l *layout) bpf(curinterp, thrKey uint64) bpf.ProfilePerlProc {
	return bpf.ProfilePerlProc{
		Curinterp: curinterp, ThrKey: thrKey, Valid: 1, TlsData: tlsData,
		I_stackinfo: l.iStackinfo, I_curcop: l.iCurcop, I_op: l.iOp,
		SiCxstack: l.siCxstack, SiPrev: l.siPrev, SiCxmax: l.siCxmax, SiCxsubix: l.siCxsub,
		CxSize: l.cxSize, CxOldcop: l.cxOldcop, CxRetop: l.cxRetop, CxOldsubix: l.cxOldsub, CxCv: l.cxCV,
		XcvGv: l.xcvGV, XcvFile: l.xcvFile, CopLine: l.copLine,
		XcvStart: l.xcvStart, OpType: l.opType, OpNextstate: l.opNextstate,
		TypeCv: l.typeCV, CxtSub: l.cxtSub, CxpEvalblock: l.cxpEvalBlock,
	}
}

// Stackinfo types (PERLSI_*) and bounds checkLive holds the layout to.
const (
	siMain     = 1  // PERLSI_MAIN
	siMaxType  = 32 // the types are 0-12 in 5.36-5.42
	maxSiChain = 64
	maxCxLive  = 1 << 20
)

// checkLive reads the interpreter at interp with l: its stackinfos down
// to the main one (si_prev NULL, type PERLSI_MAIN), each with context
// indexes -1 <= cxix <= cxmax < 2^20.
func checkLive(m memory, l *layout, interp uint64) error {
	si, err := m.U64(interp + uint64(l.iStackinfo))
	if err != nil {
		return err
	}
	i32 := func(addr uint64) (int32, error) {
		var b [4]byte
		err := m.Read(addr, b[:])
		return int32(binary.LittleEndian.Uint32(b[:])), err
	}
	for i := 0; i < maxSiChain; i++ {
		if si == 0 {
			return fmt.Errorf("interpreter %#x: no stackinfo", interp)
		}
		cxix, err1 := i32(si + uint64(l.siCxix))
		cxmax, err2 := i32(si + uint64(l.siCxmax))
		typ, err3 := i32(si + uint64(l.siType))
		if err := errors.Join(err1, err2, err3); err != nil {
			return err
		}
		if cxix < -1 || cxix > cxmax || cxmax >= maxCxLive || typ < 0 || typ > siMaxType {
			return fmt.Errorf("stackinfo %#x: cxix %d, cxmax %d, type %d: %w", si, cxix, cxmax, typ, errUnsupported)
		}
		prev, err := m.U64(si + uint64(l.siPrev))
		if err != nil {
			return err
		}
		if prev == 0 {
			if typ != siMain {
				return fmt.Errorf("outermost stackinfo %#x has type %d, not the main one: %w", si, typ, errUnsupported)
			}
			return nil
		}
		si = prev
	}
	return fmt.Errorf("interpreter %#x: more than %d stackinfos: %w", interp, maxSiChain, errUnsupported)
}
