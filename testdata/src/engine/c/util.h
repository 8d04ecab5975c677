#ifndef UTIL_H
#define UTIL_H
#include <stdint.h>

/* Header-defined inline helpers: their inlined copies carry this file name. */
static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t mix(uint32_t h, uint32_t k) {
	k *= 0xcc9e2d51u;
	k = rotl32(k, 15);
	k *= 0x1b873593u;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64u;
}

__attribute__((always_inline)) static inline uint32_t fmix(uint32_t h) {
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

uint32_t hash_bytes(const uint8_t *p, int n, uint32_t seed);
int sort_and_sum(int *v, int n);
#endif
