/* Shared by the unwinding fixtures: spin in leaf() below the chain
 * main -> a -> b -> c -> d -> leaf until argv[1] seconds of CPU are used.
 * Every call is followed by work on its result, so no call is a tail call,
 * and noinline keeps each function a frame of its own. */
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noclone))

static volatile unsigned long sink;

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}
