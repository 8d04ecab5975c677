/* Sampler test fixture: spins in hot() (via outer -> middle) until it has
 * used argv[1] seconds of CPU (so a loaded machine still yields a full set of
 * samples), or ten times that in wall time; with argv[2] = "syscall" it spends
 * its time in read(2) from /dev/zero instead, so samples carry kernel stacks;
 * with argv[2] = "files" it first opens as many descriptors as its limit
 * allows, so that its exit spends time closing them after the kernel's exit
 * event. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

volatile unsigned long sink;
static char buf[1 << 16];

__attribute__((noinline)) unsigned long hot(unsigned long n)
{
	unsigned long x = 0;
	for (unsigned long i = 0; i < n; i++)
		x = x * 31 + (i ^ (x >> 7));
	return x;
}

__attribute__((noinline)) unsigned long middle(unsigned long n)
{
	return hot(n) + 1;
}

__attribute__((noinline)) unsigned long outer(unsigned long n)
{
	return middle(n) ^ 3;
}

__attribute__((noinline)) long read_zero(int fd)
{
	long total = 0;
	for (int i = 0; i < 64; i++)
		total += read(fd, buf, sizeof(buf));
	return total;
}

static double now(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3.0;
	double end_cpu = now(CLOCK_PROCESS_CPUTIME_ID) + secs;
	double end_wall = now(CLOCK_MONOTONIC) + 10 * secs;
	int sys = argc > 2 && strcmp(argv[2], "syscall") == 0;
	int fd = -1;

	if (sys && (fd = open("/dev/zero", O_RDONLY)) < 0) {
		perror("/dev/zero");
		return 1;
	}
	if (argc > 2 && strcmp(argv[2], "files") == 0) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
			rl.rlim_cur = rl.rlim_max < 1 << 17 ? rl.rlim_max : 1 << 17;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		while (dup(0) >= 0)
			;
	}
	while (now(CLOCK_PROCESS_CPUTIME_ID) < end_cpu && now(CLOCK_MONOTONIC) < end_wall) {
		if (sys)
			sink += read_zero(fd);
		else
			sink += outer(1000000);
	}
	return 0;
}
