/* Unwinder fixture: a stack deeper than a walk may keep.
 *
 *   recurse DEPTH SECONDS
 *
 * main calls down() DEPTH + 1 times nested, and the innermost call is busy
 * for SECONDS of CPU time. The asm after each call keeps the compiler from
 * turning the recursion into a loop. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static unsigned long down(int n, double end)
{
	unsigned long r;

	if (n > 0) {
		r = down(n - 1, end);
		__asm__ volatile("" : "+r"(r));
		return r + 1;
	}
	while (cpu() < end)
		for (int i = 0; i < 100000; i++)
			sink += i;
	return sink;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	return down(atoi(argv[1]), cpu() + atof(argv[2])) == 42;
}
