#include "util.h"

/* A shared object: exported entry points and internal inlined helpers. */
static inline int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

__attribute__((visibility("hidden"))) int lib_internal(int x) { return clamp(x * 3, -100, 100); }

int lib_entry(const unsigned char *p, int n) {
	int s = 0;
	for (int i = 0; i < n; i++)
		s += lib_internal(p[i]) + (int)fmix((uint32_t)i);
	return s;
}
