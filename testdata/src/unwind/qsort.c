/* main -> a -> b -> c -> qsort (libc) -> cmp -> leaf: the walk must cross
 * libc's frames, built without frame pointers. */
#include "chain.h"

NOINLINE unsigned long leaf(unsigned long n)
{
	unsigned long x = n;
	for (unsigned long i = 0; i < 2000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

NOINLINE int cmp(const void *p, const void *q)
{
	unsigned long x = *(const unsigned long *)p, y = *(const unsigned long *)q;
	sink += leaf(x ^ y);
	return x < y ? -1 : x > y;
}

NOINLINE unsigned long c(unsigned long n)
{
	unsigned long v[64];
	for (int i = 0; i < 64; i++)
		v[i] = (n + i) * 2654435761ul % 1000;
	qsort(v, 64, sizeof(v[0]), cmp);
	return v[n % 64];
}
NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }
NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	return run_chain(secs, a, 15);
}
