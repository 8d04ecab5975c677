/*
 * A process that forges PHP's state (internal/host/runtimes/php
 * TestForgedPHP). Installed as "php8.2", it exports what the agent looks
 * for (executor_globals, execute_ex, the X-Powered-By version string) laid
 * out as PHP 8.2 lays them out, and spins in its "VM loop". What it forges,
 * by argv[1]:
 *
 *   (built with -DVERSION='"8.3.0"': a version without a layout)
 *   (built with -DZTS: a thread-safe build, executor_globals_offset)
 *   late-loop   a sane-looking chain (one frame, whose function has a name
 *               and a file of 64 KiB) that turns into a frame that is its
 *               own caller after a second
 *   deep-loop   two frames that call each other after a second
 *   wild        current_execute_data turns into a wild pointer after a
 *               second
 *   no-top      4096 frames, none flagged ZEND_CALL_TOP, the last one's
 *               function freed (its type byte garbage) after a second
 *
 * It spins until killed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AT(base, off, type) (*(type *)((char *)(base) + (off)))

#ifndef VERSION
#define VERSION "8.2.99"
#endif
const char powered[] = "X-Powered-By: PHP/" VERSION;

#ifdef ZTS
size_t executor_globals_offset = 448;
#endif
char executor_globals[1776];

#define FRAMES 4096
static char frames[FRAMES][72];
static char func[192], func2[192], cls[64];
static char name[(1 << 16) + 64];

static volatile uint64_t sink;

/* The "VM loop": where every sample lands. */
__attribute__((noinline)) void execute_ex(double seconds) /* < 0: forever */
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		for (int i = 0; i < 1000000; i++)
			sink += i * i;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (seconds >= 0 && t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds)
			return;
	}
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "late-loop";

	sink = powered[argc & 7];
	/* 8.2: current_execute_data at 488; execute_data: func 24,
	 * This.u1.type_info 40, prev 48; function: type 0, name 8, scope 16,
	 * filename 152, line_start 160; zend_string: type_info 4, len 16,
	 * val 24;
	 * class: name 8. */
	AT(executor_globals, 488, void *) = frames[0];
	AT(frames[0], 24, void *) = func;
	AT(frames[0], 40, uint32_t) = 1u << 17; /* ZEND_CALL_TOP */
	func[0] = 2;                            /* ZEND_USER_FUNCTION */
	AT(func, 8, void *) = name;
	AT(func, 16, void *) = cls;
	AT(func, 152, void *) = name;
	AT(func, 160, uint32_t) = 7;
	AT(cls, 8, void *) = name;
	AT(name, 4, uint32_t) = 6; /* IS_STRING */
	AT(name, 16, uint64_t) = sizeof(name) - 25;
	memset(name + 24, 'A', sizeof(name) - 25);
	memcpy(func2, func, sizeof(func));

	if (!strcmp(mode, "no-top")) {
		for (int i = 0; i < FRAMES; i++) {
			AT(frames[i], 24, void *) = i & 1 ? func2 : func;
			AT(frames[i], 40, uint32_t) = 0;
			AT(frames[i], 48, void *) = i + 1 < FRAMES ? frames[i + 1] : NULL;
		}
	}
	if (!strcmp(mode, "deep-loop")) {
		AT(frames[0], 40, uint32_t) = 0;
		AT(frames[0], 48, void *) = frames[1];
		AT(frames[1], 24, void *) = func2;
		AT(frames[1], 40, uint32_t) = 1u << 17;
	}
	execute_ex(1);
	if (!strcmp(mode, "late-loop"))
		AT(frames[0], 48, void *) = frames[0]; /* prev: itself */
	else if (!strcmp(mode, "deep-loop"))
		AT(frames[1], 48, void *) = frames[0];
	else if (!strcmp(mode, "wild"))
		AT(executor_globals, 488, uint64_t) = 0xdead0000;
	else if (!strcmp(mode, "no-top"))
		func2[0] = 0x5a;
	execute_ex(-1);
	return (int)(sink & 1);
}
