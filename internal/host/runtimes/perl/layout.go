package perl

import (
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
	iStackinfo, iCurcop                  uint16 // struct interpreter: PL_curstackinfo, PL_curcop
	siCxstack, siPrev, siCxmax, siCxsub  uint16 // struct stackinfo
	cxSize, cxOldcop, cxRetop, cxOldsub  uint16 // PERL_CONTEXT
	cxCV                                 uint16 // blk_sub.cv
	xcvStash, xcvGV, xcvFile, xcvFlags   uint16 // XPVCV
	xgvNameHEK, xgvStash                 uint16 // XPVGV
	hvAux, auxName, auxNameCount         uint16 // xpvhv_with_aux, xpvhv_aux
	hekLen, hekKey                       uint16 // HEK
	copLine, copFile                     uint16 // COP (threaded: cop_file is a char*)
	typeCV, typeGV, typeHV               uint8  // SVt_PVCV, SVt_PVGV, SVt_PVHV
	cxtSub, cxpEvalBlock                 uint8
	cvfNamed                             uint32
	svfOOK                               uint32
}

// layouts by version (minor of 5.x), threaded builds on x86-64.
var layouts = map[int]layout{
	36: {
		iStackinfo: 224, iCurcop: 208,
		siCxstack: 8, siPrev: 16, siCxmax: 36, siCxsub: 40,
		cxSize: 104, cxOldcop: 16, cxRetop: 48, cxOldsub: 56, cxCV: 72,
		xcvStash: 32, xcvGV: 56, xcvFile: 64, xcvFlags: 92,
		xgvNameHEK: 32, xgvStash: 40,
		hvAux: 32, auxName: 0, auxNameCount: 28,
		hekLen: 4, hekKey: 8,
		copLine: 36, copFile: 48,
		typeCV: 13, typeGV: 9, typeHV: 12,
		cxtSub: 9, cxpEvalBlock: 64,
		cvfNamed: 0x8000, svfOOK: 0x02000000,
	},
}

// layoutOf is the layout of Perl 5.minor.
func layoutOf(minor int) (layout, error) {
	l, ok := layouts[minor]
	if !ok {
		return layout{}, fmt.Errorf("perl 5.%d: no layout for this version (5.36 is walked): %w", minor, errUnsupported)
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
		I_stackinfo: l.iStackinfo, I_curcop: l.iCurcop,
		SiCxstack: l.siCxstack, SiPrev: l.siPrev, SiCxmax: l.siCxmax, SiCxsubix: l.siCxsub,
		CxSize: l.cxSize, CxOldcop: l.cxOldcop, CxRetop: l.cxRetop, CxOldsubix: l.cxOldsub, CxCv: l.cxCV,
		XcvGv: l.xcvGV, XcvFile: l.xcvFile, CopLine: l.copLine,
		TypeCv: l.typeCV, CxtSub: l.cxtSub, CxpEvalblock: l.cxpEvalBlock,
	}
}
