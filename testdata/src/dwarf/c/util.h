/* Shared helpers: header-defined inline functions get inlined into every
 * file that includes them, so their call sites span several CUs. */
#ifndef UTIL_H
#define UTIL_H
#include <stdint.h>

static inline uint32_t mix32(uint32_t h, uint32_t v) {
	h ^= v;
	h *= 0x9e3779b1u;
	return (h << 13) | (h >> 19);
}

static inline __attribute__((always_inline)) uint32_t hash_bytes(const unsigned char *p, int n) {
	uint32_t h = 2166136261u;
	for (int i = 0; i < n; i++)
		h = mix32(h, p[i]);
	return h;
}

struct vec {
	int n;
	int cap;
	long *data;
};

void vec_push(struct vec *v, long x);
long vec_sum(const struct vec *v);
long process(struct vec *v, int rounds);
uint32_t checksum(const char *s);
#endif
