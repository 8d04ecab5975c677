/* End-to-end workload: spins in one named hot function for N seconds. NAME
 * makes each build (and so its build id and hot function) distinct. */
#include <stdlib.h>
#include <time.h>

#define CAT(a, b) a##b
#define HOT(n) CAT(spin_, n)

__attribute__((noinline)) unsigned long HOT(E2E_ID)(unsigned long n) {
	unsigned long acc = 0;
	for (unsigned long i = 0; i < n; i++)
		acc += (i * 2654435761u) ^ (acc >> 7);
	return acc;
}

int main(int argc, char **argv) {
	int seconds = argc > 1 ? atoi(argv[1]) : 10;
	time_t end = time(NULL) + seconds;
	volatile unsigned long sink = 0;
	while (time(NULL) < end)
		sink += HOT(E2E_ID)(1u << 20);
	return (int)(sink & 1);
}
