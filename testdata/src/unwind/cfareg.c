/* main -> a -> b -> c -> d -> leaf, where leaf is assembly in the style of
 * OpenSSL's (aesni, sha, bn): it keeps its entry stack pointer in a register
 * and realigns the stack, so its CFI says CFA = reg + 8 for the whole body
 * and the table must take the CFA from a register, not from SP or FP.
 * Built -O2 -fomit-frame-pointer like chain.c, with the CFA in %rax; with
 * -DIN_SYSCALL the CFA is in %rsi and the loop makes a system call
 * (getppid) each turn, so most samples come from the registers saved on
 * kernel entry (a syscall clobbers rax, rcx and r11, not rsi). */
#include "chain.h"

#ifdef IN_SYSCALL
#define REG "rsi"
#define TURNS "2000"
#define SYSCALL "	mov $110, %eax\n	syscall\n"
#else
#define REG "rax"
#define TURNS "200000"
#define SYSCALL ""
#endif

unsigned long leaf(unsigned long n);
__asm__(
	".text\n"
	".globl leaf\n"
	".type leaf, @function\n"
	"leaf:\n"
	".cfi_startproc\n"
	"	mov %rsp, %" REG "\n"
	".cfi_def_cfa_register %" REG "\n"
	"	push %rbx\n"
	".cfi_offset %rbx, -16\n"
	"	sub $128, %rsp\n"
	"	and $-64, %rsp\n"
	"	mov %rdi, %rbx\n"
	"	mov $" TURNS ", %r8\n"
	"1:\n"
	"	imul $0x5851f42d, %rbx, %rbx\n"
	"	add %r8, %rbx\n"
	"	mov %rbx, (%rsp)\n"
	SYSCALL
	"	dec %r8\n"
	"	jnz 1b\n"
	"	mov %rbx, %rdx\n"
	"	mov -8(%" REG "), %rbx\n"
	".cfi_restore %rbx\n"
	"	mov %" REG ", %rsp\n"
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
