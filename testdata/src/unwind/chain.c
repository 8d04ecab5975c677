/* main -> a -> b -> c -> d -> leaf, built -O2 -fomit-frame-pointer (PIE and
 * not) by the unwinding tests. */
#include "chain.h"

NOINLINE unsigned long leaf(unsigned long n)
{
	unsigned long x = n;
	for (unsigned long i = 0; i < 200000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

NOINLINE unsigned long d(unsigned long n) { return leaf(n + 1) * 3; }
NOINLINE unsigned long c(unsigned long n) { return d(n + 2) ^ 5; }
NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }
NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	return run_chain(secs, a, 63);
}
