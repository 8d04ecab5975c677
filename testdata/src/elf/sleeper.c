/* Prints the runtime address of a known function, then waits until stdin
 * closes, so a test can read /proc/PID/maps while it runs. */
#include <stdio.h>
#include <unistd.h>

int __attribute__((noinline)) profsym_target(int x) { return x * 7 + 1; }

int main(void) {
	printf("%p\n", (void *)&profsym_target);
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0) {
	}
	return profsym_target(0) == 1 ? 0 : 1;
}
