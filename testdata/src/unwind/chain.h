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

/* Calls fn(i) until secs of CPU are used (or ten times that in wall time),
 * checking the clocks every mask+1 calls. Always inlined, so that the
 * caller of fn is main itself. */
static inline __attribute__((always_inline)) int run_chain(double secs, unsigned long (*fn)(unsigned long),
							   unsigned long mask)
{
	double cpu0 = cpu_seconds(), wall0 = wall_seconds();
	for (unsigned long i = 0;; i++) {
		sink += fn(i);
		if ((i & mask) == 0 && (cpu_seconds() - cpu0 > secs || wall_seconds() - wall0 > 10 * secs))
			break;
	}
	return 0;
}

/* d -> c -> b -> a above a fixture's own leaf(). */
#define CHAIN_CALLERS                                                      \
	NOINLINE unsigned long d(unsigned long n) { return leaf(n + 1) * 3; } \
	NOINLINE unsigned long c(unsigned long n) { return d(n + 2) ^ 5; }    \
	NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }    \
	NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }
