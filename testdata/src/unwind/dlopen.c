/* main -> a -> b -> c -> (dlsym) d -> leaf, with d and leaf in a library
 * that is dlopen'ed only after argv[3] seconds of sleep, i.e. after the
 * sampler saw the process. argv[2] is the library's path. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include "chain.h"

static unsigned long (*dfn)(unsigned long);

NOINLINE unsigned long c(unsigned long n) { return dfn(n + 2) ^ 5; }
NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }
NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	double secs = atof(argv[1]);
	/* Seen by the sampler first: spin a little, then sleep, then load. */
	double w = wall_seconds();
	while (wall_seconds() - w < 0.2)
		sink++;
	usleep((useconds_t)(atof(argv[3]) * 1e6));
	void *h = dlopen(argv[2], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	dfn = (unsigned long (*)(unsigned long))dlsym(h, "d");
	if (!dfn)
		return 1;
	return run_chain(secs, a, 63);
}
