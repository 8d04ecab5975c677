#include "textflag.h"

// func capture(buf []byte) (pc, sp uintptr)
// Returns the return address into the caller and the caller's SP after the
// call, and copies len(buf) bytes of the stack from that SP into buf. It
// makes no call, so the stack cannot move between the copy and the values.
TEXT ·capture(SB), NOSPLIT|NOFRAME, $0-40
	MOVQ	0(SP), AX
	MOVQ	AX, pc+24(FP)
	LEAQ	8(SP), SI
	MOVQ	SI, sp+32(FP)
	MOVQ	buf_base+0(FP), DI
	MOVQ	buf_len+8(FP), CX
	CLD
	REP;	MOVSB
	RET
