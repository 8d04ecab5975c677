#include <stdio.h>
#include <stdlib.h>
#include "util.h"

struct item { const char *name; int weight; };

static int cmp_items(const void *a, const void *b) {
	const struct item *x = a, *y = b;
	return x->weight - y->weight;
}

static inline int weigh(const char *s) {
	return (int)(checksum(s) % 1000);
}

int main(int argc, char **argv) {
	struct vec v = {0};
	struct item items[8];
	for (int i = 0; i < 8 && i < argc; i++) {
		items[i].name = argv[i];
		items[i].weight = weigh(argv[i]);
	}
	qsort(items, argc < 8 ? argc : 8, sizeof items[0], cmp_items);
	long t = process(&v, argc + 3);
	printf("%ld %u\n", t, hash_bytes((const unsigned char *)argv[0], 4));
	free(v.data);
	return 0;
}
