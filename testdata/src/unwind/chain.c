/* main -> a -> b -> c -> d -> leaf, built -O2 -fomit-frame-pointer (PIE and
 * not) by the unwinding tests. With argv[2] = "syscall" the leaf spends its
 * time in read(2), so most samples hit in kernel mode and the user stack
 * starts from the registers saved on kernel entry. */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include "chain.h"

static int zero_fd = -1;
static char buf[1 << 16];

NOINLINE unsigned long leaf(unsigned long n)
{
	unsigned long x = n;
	if (zero_fd >= 0) {
		for (int i = 0; i < 8; i++)
			x += read(zero_fd, buf, sizeof(buf));
		return x;
	}
	for (unsigned long i = 0; i < 200000; i++)
		x = x * 6364136223846793005ul + (i ^ (x >> 13));
	return x;
}

CHAIN_CALLERS

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	if (argc > 2 && strcmp(argv[2], "syscall") == 0)
		zero_fd = open("/dev/zero", O_RDONLY);
	return run_chain(secs, a, 63);
}
