// Command cgo mixes Go and C in one binary: the C code has .eh_frame, the
// Go code .gopclntab, and an unwind table needs both.
package main

/*
#include <stdlib.h>

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

__attribute__((noinline)) static int c_sort(int n) {
	int *v = malloc(sizeof(int) * n);
	for (int i = 0; i < n; i++) v[i] = (i * 7919) % n;
	qsort(v, n, sizeof(int), cmp);
	int r = v[n / 2];
	free(v);
	return r;
}

__attribute__((noinline)) int c_entry(int n) { return c_sort(n + 10) + 1; }
*/
import "C"

import "fmt"

//go:noinline
func goSide(n int) int { return int(C.c_entry(C.int(n))) }

func main() { fmt.Println(goSide(100)) }
