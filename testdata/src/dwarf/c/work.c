#include <stdio.h>
#include "util.h"

static int depth3(int x) {
	int r = 0;
	for (int i = 0; i < x; i++)
		r += (i & 1) ? i * 3 : i / 2;
	return r;
}

static inline int depth2(int x) {
	if (x > 100)
		return depth3(x) + depth3(x / 2);
	return depth3(x) - 1;
}

static inline __attribute__((always_inline)) int depth1(int x) {
	int a = depth2(x);
	int b = depth2(x + 7);
	return a ^ b;
}

static __attribute__((noinline)) long reduce(struct vec *v, int k) {
	long acc = 0;
	for (int i = 0; i < v->n; i++) {
		long x = v->data[i];
		switch (x % 4) {
		case 0: acc += depth1((int)x & 255); break;
		case 1: acc -= mix32((uint32_t)x, (uint32_t)k); break;
		case 2: acc ^= hash_bytes((const unsigned char *)&x, sizeof x); break;
		default: acc += k; break;
		}
	}
	return acc;
}

long process(struct vec *v, int rounds) {
	long total = 0;
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < 64; i++)
			vec_push(v, (long)i * r + depth1(i));
		total += reduce(v, r) + vec_sum(v);
	}
	return total;
}
