/* Fixture for internal/host/unwind/table: ordinary C that compilers turn
 * into varied CFI (frameless code, frame pointers forced by alloca and
 * realigned stacks, frames over 64 KiB, callbacks through libc), plus
 * assembly whose hand-written CFI exercises each rule a table must encode,
 * and each it must refuse. The tests compare the tables with
 * llvm-dwarfdump-19 on the built binaries; running them is not needed. */
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static int leaf(int x) { return x * 3 + 1; }

__attribute__((noinline)) int with_alloca(int n) {
	char *p = alloca(n + 16);
	memset(p, n, n + 16);
	return leaf(p[n]);
}

__attribute__((noinline)) int big_frame(int n) {
	volatile char buf[70000];
	buf[n] = (char)n;
	return leaf(buf[n]) + buf[69999 - n];
}

__attribute__((noinline)) int vla_aligned(int n) {
	int a[n];
	int __attribute__((aligned(64))) v[16];
	for (int i = 0; i < n; i++)
		a[i] = leaf(i);
	for (int i = 0; i < 16; i++)
		v[i] = a[i % n];
	return leaf(v[n % 16]) + a[n - 1];
}

static int cmp(const void *x, const void *y) {
	return leaf(*(const int *)x) - leaf(*(const int *)y);
}

__attribute__((noinline)) int sorter(int n) {
	int *v = malloc(sizeof(int) * n);
	for (int i = 0; i < n; i++)
		v[i] = (i * 7919) % n;
	qsort(v, n, sizeof(int), cmp);
	int r = v[n / 2];
	free(v);
	return r;
}

__attribute__((noinline)) int many_exits(int n) {
	int s = 0;
	if (n < 0)
		return leaf(-n);
	for (int i = 0; i < n; i++) {
		if (i == 1000)
			return s + leaf(i);
		s += leaf(i) ^ s;
	}
	return s;
}

/* Hand-written CFI. Each function is called through a pointer so that all
 * stay in the binary; none is meant to run. */
__asm__(
	".text\n"
	/* Pushes, a frame pointer, remember/restore around an early return,
	 * and a body longer than 255 and 65535 bytes (advance_loc2, _loc4). */
	".globl cfi_frame\n.type cfi_frame,@function\ncfi_frame:\n"
	".cfi_startproc\n"
	"push %rbx\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset %rbx, 0\n"
	"push %rbp\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset %rbp, 0\n"
	"mov %rsp, %rbp\n.cfi_def_cfa_register %rbp\n"
	"call *%rdi\n"
	"test %eax, %eax\n"
	"jz 1f\n"
	".cfi_remember_state\n"
	"pop %rbp\n.cfi_def_cfa %rsp, 16\n.cfi_restore %rbp\n"
	"pop %rbx\n.cfi_adjust_cfa_offset -8\n.cfi_restore %rbx\n"
	"ret\n"
	".cfi_restore_state\n"
	"1: .skip 300, 0x90\n"
	"sub $8, %rsp\n"
	".skip 70000, 0x90\n"
	"pop %rbp\n.cfi_def_cfa %rsp, 16\n.cfi_same_value %rbp\n"
	"pop %rbx\n.cfi_def_cfa_offset 8\n"
	"ret\n"
	".cfi_endproc\n"
	".size cfi_frame, .-cfi_frame\n"

	/* The return address in a register (vfork-style): not encodable. */
	".globl cfi_ra_in_reg\n.type cfi_ra_in_reg,@function\ncfi_ra_in_reg:\n"
	".cfi_startproc\n"
	"pop %rdi\n.cfi_adjust_cfa_offset -8\n.cfi_register %rip, %rdi\n"
	"push %rdi\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset %rip, 0\n"
	"ret\n"
	".cfi_endproc\n"
	".size cfi_ra_in_reg, .-cfi_ra_in_reg\n"

	/* CFA from a dereferencing expression (*(rsp+16)): not encodable. */
	".globl cfi_cfa_expr\n.type cfi_cfa_expr,@function\ncfi_cfa_expr:\n"
	".cfi_startproc\n"
	"sub $24, %rsp\n"
	".cfi_escape 0x0f, 0x03, 0x77, 0x10, 0x06\n"
	"nop\n"
	".cfi_def_cfa %rsp, 32\n"
	"add $24, %rsp\n.cfi_def_cfa_offset 8\n"
	"ret\n"
	".cfi_endproc\n"
	".size cfi_cfa_expr, .-cfi_cfa_expr\n"

	/* The PLT's CFA expression, as GNU ld writes it, and the variant with
	 * threshold 10 that the table cannot encode. */
	".globl cfi_plt\n.type cfi_plt,@function\ncfi_plt:\n"
	".cfi_startproc\n"
	".cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22\n"
	"push $1\n"
	"jmp *%rax\n"
	".skip 12, 0xcc\n"
	".cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22\n"
	"push $2\n"
	"jmp *%rax\n"
	".cfi_endproc\n"
	".size cfi_plt, .-cfi_plt\n"

	/* The caller's frame pointer kept as a value (val_offset) and in an
	 * expression: not encodable; GNU_args_size is ignored. */
	".globl cfi_fp_rules\n.type cfi_fp_rules,@function\ncfi_fp_rules:\n"
	".cfi_startproc\n"
	"push %rbp\n.cfi_adjust_cfa_offset 8\n.cfi_offset %rbp, -16\n"
	".cfi_escape 0x2e, 0x10\n"
	"nop\n"
	".cfi_escape 0x14, 0x06, 0x02\n" /* val_offset rbp, -16 */
	"nop\n"
	".cfi_escape 0x10, 0x06, 0x02, 0x76, 0x00\n" /* rbp saved at *(rbp+0) */
	"nop\n"
	".cfi_offset %rbp, -16\n"
	"pop %rbp\n.cfi_adjust_cfa_offset -8\n.cfi_restore %rbp\n"
	"ret\n"
	".cfi_endproc\n"
	".size cfi_fp_rules, .-cfi_fp_rules\n"

	/* An outermost frame: the return address is undefined. */
	".globl cfi_outermost\n.type cfi_outermost,@function\ncfi_outermost:\n"
	".cfi_startproc\n"
	".cfi_undefined %rip\n"
	"xor %ebp, %ebp\n"
	"call *%rdi\n"
	"hlt\n"
	".cfi_endproc\n"
	".size cfi_outermost, .-cfi_outermost\n"

	/* A signal frame by augmentation ('S'). */
	".globl cfi_sigframe\n.type cfi_sigframe,@function\n"
	"nop\n"
	"cfi_sigframe:\n"
	".cfi_startproc simple\n"
	".cfi_signal_frame\n"
	".cfi_def_cfa %rsp, 160\n"
	"mov $15, %rax\n"
	"syscall\n"
	".cfi_endproc\n"
	".size cfi_sigframe, .-cfi_sigframe\n"

	/* A signal trampoline with ordinary CFI: only its bytes tell. */
	".globl cfi_restore_plain\n.type cfi_restore_plain,@function\ncfi_restore_plain:\n"
	".cfi_startproc\n"
	"mov $15, %rax\nsyscall\n"
	".cfi_endproc\n"
	".size cfi_restore_plain, .-cfi_restore_plain\n"

	/* Code without CFI: a plain function, and an rt_sigreturn trampoline
	 * that only its bytes identify (as musl's __restore_rt). */
	".p2align 4\n"
	".globl nocfi_plain\n.type nocfi_plain,@function\nnocfi_plain:\n"
	"push %rbp\nmov %rsp, %rbp\ncall *%rdi\npop %rbp\nret\n"
	".skip 40, 0xcc\n"
	".size nocfi_plain, .-nocfi_plain\n"
	".p2align 4\n"
	".globl nocfi_restore_rt\n.type nocfi_restore_rt,@function\n"
	"nop\n"
	"nocfi_restore_rt:\n"
	"mov $15, %rax\nsyscall\n"
	".skip 32, 0xcc\n"
	".size nocfi_restore_rt, .-nocfi_restore_rt\n"
	".p2align 4\n");

int cfi_frame(int (*)(void));
void cfi_ra_in_reg(void);
void cfi_cfa_expr(void);
void cfi_plt(void);
void cfi_fp_rules(void);
void cfi_outermost(void (*)(void));
void cfi_sigframe(void);
void cfi_restore_plain(void);
void nocfi_plain(void (*)(void));
void nocfi_restore_rt(void);

void *volatile keep[] = {
	(void *)cfi_frame, (void *)cfi_ra_in_reg, (void *)cfi_cfa_expr, (void *)cfi_plt,
	(void *)cfi_fp_rules, (void *)cfi_outermost, (void *)cfi_sigframe,
	(void *)cfi_restore_plain, (void *)nocfi_plain, (void *)nocfi_restore_rt,
};

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 10;
	int r = with_alloca(n) + big_frame(n) + vla_aligned(n) + sorter(n + 100) + many_exits(n);
	printf("%d %p\n", r, keep[0]);
	return 0;
}
