/* main -> a -> b -> c -> d -> leaf, where leaf is assembly in the style of
 * OpenSSL's (aesni, sha, bn): it keeps its entry stack pointer in a register
 * and realigns the stack, so its CFI says CFA = reg + 8 for the whole body
 * and the table must take the CFA from a register, not from SP or FP.
 * Built -O2 -fomit-frame-pointer like chain.c, with the CFA in %rax.
 *
 * With -DIN_SYSCALL the CFA is in %r9, which a system call leaves alone
 * (it clobbers rax, rcx and r11) and getrandom takes no argument in, and the
 * loop asks getrandom(2) for 4 KiB each turn, so most samples come from the
 * registers saved on kernel entry. getrandom, not a cheap call such as
 * getppid: a timer that expires while the kernel runs with interrupts off
 * (most of a trivial call's time is entry and exit, which do) fires after
 * the return to user mode, so a cheap call's kernel time is sampled in user
 * mode, by how much depending on the machine (42% in kernel mode once under
 * qemu TCG). getrandom spends its time generating bytes, interrupts on. */
#include "chain.h"

#ifdef IN_SYSCALL
#define REG "r9"
#define TURNS "200"
/* getrandom(buf = rsp, 4096, GRND_INSECURE): 318 on x86-64; never blocks,
 * even before a fresh VM's entropy pool is ready (5.6 and later). */
#define SYSCALL "	mov %rsp, %rdi\n	mov $4096, %esi\n	mov $4, %edx\n	mov $318, %eax\n	syscall\n"
#define FRAME "4224"
#else
#define REG "rax"
#define TURNS "200000"
#define SYSCALL ""
#define FRAME "128"
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
	"	sub $" FRAME ", %rsp\n"
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
