/* main -> a -> b -> c -> d -> leaf, where leaf is assembly in the style of
 * OpenSSL's (aesni, sha, bn): it keeps its entry stack pointer in %rax and
 * realigns the stack, so its CFI says CFA = rax + 8 for the whole body and
 * the table must take the CFA from a register, not from SP or FP. Built
 * -O2 -fomit-frame-pointer like chain.c. */
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
	"	sub $128, %rsp\n"
	"	and $-64, %rsp\n"
	"	mov %rdi, %rbx\n"
	"	mov $200000, %rcx\n"
	"1:\n"
	"	imul $0x5851f42d, %rbx, %rbx\n"
	"	add %rcx, %rbx\n"
	"	mov %rbx, (%rsp)\n"
	"	dec %rcx\n"
	"	jnz 1b\n"
	"	mov %rbx, %rdx\n"
	"	mov -8(%rax), %rbx\n"
	".cfi_restore %rbx\n"
	"	mov %rax, %rsp\n"
	".cfi_def_cfa_register %rsp\n"
	"	mov %rdx, %rax\n"
	"	ret\n"
	".cfi_endproc\n"
	".size leaf, .-leaf\n");

CHAIN_CALLERS

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	return run_chain(secs, a, 63);
}
