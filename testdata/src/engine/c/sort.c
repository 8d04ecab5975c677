#include "util.h"

static inline void swap(int *a, int *b) { int t = *a; *a = *b; *b = t; }

static int partition(int *v, int lo, int hi) {
	int p = v[hi], i = lo;
	for (int j = lo; j < hi; j++)
		if (v[j] < p)
			swap(&v[i++], &v[j]);
	swap(&v[i], &v[hi]);
	return i;
}

static void quicksort(int *v, int lo, int hi) {
	while (lo < hi) {
		int p = partition(v, lo, hi);
		if (p - lo < hi - p) {
			quicksort(v, lo, p - 1);
			lo = p + 1;
		} else {
			quicksort(v, p + 1, hi);
			hi = p - 1;
		}
	}
}

static inline long weigh(int x) { return x % 3 == 0 ? (long)x * 2 : (long)x; }

int sort_and_sum(int *v, int n) {
	quicksort(v, 0, n - 1);
	long s = 0;
	for (int i = 0; i < n; i++)
		s += weigh(v[i]);
	return (int)(s ^ (s >> 17));
}
