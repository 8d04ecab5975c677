#include "util.h"

static uint32_t load32(const uint8_t *p) {
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t tail(const uint8_t *p, int n, uint32_t h) {
	uint32_t k = 0;
	switch (n & 3) {
	case 3: k ^= (uint32_t)p[2] << 16; /* fallthrough */
	case 2: k ^= (uint32_t)p[1] << 8;  /* fallthrough */
	case 1: k ^= p[0];
		h = mix(h, k);
	}
	return h;
}

uint32_t hash_bytes(const uint8_t *p, int n, uint32_t seed) {
	uint32_t h = seed;
	int i;
	for (i = 0; i + 4 <= n; i += 4)
		h = mix(h, load32(p + i));
	h = tail(p + i, n - i, h);
	h ^= (uint32_t)n;
	return fmix(h);
}
