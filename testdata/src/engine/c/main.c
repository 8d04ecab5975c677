#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

struct node { struct node *next; int val; };

static struct node *push(struct node *head, int v) {
	struct node *n = malloc(sizeof *n);
	n->next = head;
	n->val = v;
	return n;
}

static inline int list_sum(const struct node *n) {
	int s = 0;
	for (; n; n = n->next)
		s += n->val;
	return s;
}

__attribute__((noinline)) int hot(int rounds) {
	int v[256];
	uint32_t acc = 0;
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < 256; i++)
			v[i] = (int)(hash_bytes((const uint8_t *)&i, sizeof i, (uint32_t)r) & 0xffff);
		acc += (uint32_t)sort_and_sum(v, 256);
	}
	return (int)acc;
}

int main(int argc, char **argv) {
	int rounds = argc > 1 ? atoi(argv[1]) : 10;
	struct node *l = NULL;
	for (int i = 0; i < 100; i++)
		l = push(l, i);
	const char *s = argc > 2 ? argv[2] : "profsym";
	printf("%d %u %d\n", hot(rounds), hash_bytes((const uint8_t *)s, (int)strlen(s), 7), list_sum(l));
	return 0;
}
