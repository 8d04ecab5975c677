/* d -> leaf for dlopen.c, built -O2 -fomit-frame-pointer -shared. */
#define NOINLINE __attribute__((noinline, noclone))

NOINLINE unsigned long leaf(unsigned long n)
{
	unsigned long x = n;
	for (unsigned long i = 0; i < 200000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

NOINLINE unsigned long d(unsigned long n) { return leaf(n + 1) * 3; }
