/* main -> a -> b -> c -> d -> leaf, where leaf is assembly in the style of
 * OpenSSL's sha and bn code: it realigns the stack, saves its entry stack
 * pointer in the new frame and says so with a CFA expression,
 * CFA = *(rsp + 24) + 8, then reuses every other register (rax included).
 * Built -O2 -fomit-frame-pointer like chain.c. */
#include "chain.h"

unsigned long leaf(unsigned long n);
__asm__(
	".text\n"
	".globl leaf\n"
	".type leaf, @function\n"
	"leaf:\n"
	".cfi_startproc\n"
	"	mov %rsp, %rax\n"
	".cfi_def_cfa_register %rax\n"
	"	push %rbx\n"
	".cfi_offset %rbx, -16\n"
	"	sub $64, %rsp\n"
	"	and $-64, %rsp\n"
	"	mov %rax, 24(%rsp)\n"
	/* DW_CFA_def_cfa_expression, 5 bytes: DW_OP_breg7 (rsp) 24,
	 * DW_OP_deref, DW_OP_plus_uconst 8 */
	".cfi_escape 0x0f, 0x05, 0x77, 0x18, 0x06, 0x23, 0x08\n"
	"	mov %rdi, %rax\n"
	"	mov $200000, %rcx\n"
	"1:\n"
	"	imul $0x5851f42d, %rax, %rax\n"
	"	add %rcx, %rax\n"
	"	mov %rax, (%rsp)\n"
	"	dec %rcx\n"
	"	jnz 1b\n"
	"	mov 24(%rsp), %rdx\n"
	"	mov -8(%rdx), %rbx\n"
	"	mov %rdx, %rsp\n"
	".cfi_def_cfa %rsp, 8\n"
	".cfi_restore %rbx\n"
	"	ret\n"
	".cfi_endproc\n"
	".size leaf, .-leaf\n");

CHAIN_CALLERS

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	return run_chain(secs, a, 63);
}
