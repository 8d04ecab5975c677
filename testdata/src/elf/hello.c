/* A small program with local, global, zero-size and PLT-calling functions,
 * used by the buildid, symtab and debuginfo tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int __attribute__((noinline)) local_helper(int x) { return x * 3 + (int)strlen("abc"); }

int __attribute__((noinline)) global_worker(int x) {
	char buf[32];
	snprintf(buf, sizeof buf, "%d", local_helper(x));
	return atoi(buf);
}

/* An assembly routine whose symbol has no size, like hand-written asm. */
__asm__(".text\n.globl asm_nosize\n.type asm_nosize,@function\nasm_nosize:\n\tmov %edi, %eax\n\tret\n\tnop\n\tnop\n");
int asm_nosize(int);

int main(int argc, char **argv) {
	int r = global_worker(argc) + asm_nosize(argc);
	puts(argv[0]);
	printf("%d\n", r);
	return r == 12345 ? 1 : 0;
}
