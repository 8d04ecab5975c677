#include <stdlib.h>
#include <string.h>
#include "util.h"

static inline void grow(struct vec *v) {
	int cap = v->cap ? v->cap * 2 : 8;
	v->data = realloc(v->data, cap * sizeof(long));
	v->cap = cap;
}

void vec_push(struct vec *v, long x) {
	if (v->n == v->cap)
		grow(v);
	v->data[v->n++] = x;
}

static inline long clamp(long x, long lo, long hi) {
	if (x < lo)
		return lo;
	if (x > hi)
		return hi;
	return x;
}

static inline __attribute__((always_inline)) long scaled(long x, int k) {
	return clamp(x * k, -1000000, 1000000);
}

long vec_sum(const struct vec *v) {
	long s = 0;
	for (int i = 0; i < v->n; i++)
		s += scaled(v->data[i], 3);
	return s;
}

uint32_t checksum(const char *s) {
	return hash_bytes((const unsigned char *)s, (int)strlen(s));
}
