/* Throughput workload for overhead benchmarks: repeats a fixed unit of work
 * for N seconds and prints how many units it completed, so that the cost of
 * a profiler running next to it shows as fewer units. E2E_ID makes each
 * build (and so its build id) distinct. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CAT(a, b) a##b
#define UNIT(n) CAT(unit_, n)

__attribute__((noinline)) unsigned long UNIT(E2E_ID)(unsigned long x) {
	for (int i = 0; i < 100000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
	double secs = argc > 1 ? atof(argv[1]) : 10;
	double end = now() + secs;
	unsigned long units = 0, x = 1;
	/* Check the clock every 64 units: its cost stays out of the rate. */
	while (now() < end)
		for (int i = 0; i < 64; i++, units++)
			x = UNIT(E2E_ID)(x);
	printf("%lu %lu\n", units, x & 1);
	return 0;
}
