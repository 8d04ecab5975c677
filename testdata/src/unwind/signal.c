/* main -> a -> b -> c spins; a SIGALRM handler (every 2 ms of CPU) runs
 * handler -> d -> leaf for most of the CPU time. Unwinding from leaf must
 * cross the kernel's signal frame (__restore_rt) back into c. */
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include "chain.h"

NOINLINE unsigned long leaf(unsigned long n)
{
	unsigned long x = n;
	for (unsigned long i = 0; i < 1500000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

NOINLINE unsigned long d(unsigned long n) { return leaf(n + 1) * 3; }

NOINLINE void handler(int sig)
{
	sink += d(sig);
}

volatile int stop;

NOINLINE unsigned long c(unsigned long n)
{
	unsigned long x = n;
	for (int i = 0; i < 1000; i++)
		x = x * 31 + i;
	return x;
}
NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }
NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGPROF, &sa, NULL);
	struct itimerval it = {{0, 2000}, {0, 2000}};
	setitimer(ITIMER_PROF, &it, NULL);
	return run_chain(secs, a, 1023);
}
