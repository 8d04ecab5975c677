/* A small program built in several variants (-DSEED=n gives each its own
 * code and so its own build id) for the symbolization processor's tests. */
#include <stdio.h>
#include <stdlib.h>

#ifndef SEED
#define SEED 1
#endif

static inline unsigned mix(unsigned x) { return (x ^ (x >> 13)) * (0x9e3779b1u + SEED); }

__attribute__((noinline)) unsigned hot(unsigned n) {
	unsigned acc = SEED;
	for (unsigned i = 0; i < n; i++)
		acc += mix(i + acc);
	return acc;
}

int main(int argc, char **argv) {
	unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 1000u;
	printf("%u\n", hot(n));
	return 0;
}

#ifdef KERNEL_LIKE
/* Stands in for vmlinux's text marker in the kernel-source test. */
__attribute__((noinline, used)) void _stext(void) { __asm__ volatile(""); }
#endif
