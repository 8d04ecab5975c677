/*
 * A process that forges CPython's state (internal/host/runtimes/cpython
 * TestForgedInterpreter). Installed as "python3.11", it exports what the
 * agent looks for (_PyRuntime, Py_Version, _PyEval_EvalFrameDefault,
 * PyCode_Type, ...) laid out as 3.11 lays them out, and spins in its
 * "eval loop". What it forges, by argv[1]:
 *
 *   (built with -DVERSION=0x036300f0: Py_Version says 3.99)
 *   threads     the thread state list loops
 *   wild        the current frame is a wild pointer
 *   late-loop   a sane-looking chain (one frame, whose code object has an
 *               endless name and a line table of 2^40 bytes) that turns
 *               into a frame that is its own caller after a second
 *   deep-loop   same, but two frames calling each other after a second
 *
 * It writes "ready" to stdout once its start-up (the dynamic loader, libc)
 * is over, then spins until killed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define AT(base, off, type) (*(type *)((char *)(base) + (off)))

/* 3.11's offsets, as the agent's table has them. */
char _PyRuntime[4096];
#ifndef VERSION
#define VERSION 0x030b02f0
#endif
const unsigned long Py_Version = VERSION;
char PyCode_Type[416], PyUnicode_Type[416], PyBytes_Type[416], PyFrame_Type[416];

static char interp[256], tstate[512], cframe[64], frame[128], frame2[128], code[256];
static char name[(1 << 16) + 64], table[64];

struct member {
	const char *name;
	int type;
	long offset;
	int flags;
	const char *doc;
};
static struct member code_members[] = {
	{"co_filename", 6, 112, 1, 0}, {"co_name", 6, 120, 1, 0}, {"co_qualname", 6, 128, 1, 0},
	{"co_firstlineno", 1, 72, 1, 0}, {"co_linetable", 6, 136, 1, 0}, {0, 0, 0, 0, 0},
};

static volatile uint64_t sink;

/* The "eval loop": where every sample lands. */
__attribute__((noinline)) void _PyEval_EvalFrameDefault(double seconds)  /* < 0: forever */
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

	/* The test measures from here: samples of the loader are start-up's. */
	if (write(1, "ready\n", 6) != 6)
		return 2;

	AT(_PyRuntime, 40, void *) = interp;      /* interpreters.head */
	AT(interp, 16, void *) = tstate;          /* threads.head */
	AT(tstate, 16, void *) = interp;          /* interp */
	AT(tstate, 56, void *) = cframe;          /* cframe */
	AT(tstate, 152, uint64_t) = (uint64_t)pthread_self();
	AT(cframe, 8, void *) = frame;            /* current_frame */
	AT(frame, 32, void *) = code;             /* f_code */
	AT(frame, 56, void *) = code + 184 + 8;   /* prev_instr */
	memcpy(frame2, frame, sizeof(frame));
	AT(code, 8, void *) = PyCode_Type;
	AT(code, 72, int) = 1;
	AT(code, 112, void *) = name;             /* co_filename */
	AT(code, 120, void *) = name;             /* co_name */
	AT(code, 128, void *) = name;             /* co_qualname */
	AT(code, 136, void *) = table;            /* co_linetable */
	AT(name, 8, void *) = PyUnicode_Type;
	AT(name, 16, int64_t) = (int64_t)1 << 30; /* length: 1 GiB of characters */
	AT(name, 32, uint32_t) = 1 << 2 | 1 << 5 | 1 << 6; /* compact ASCII */
	memset(name + 48, 'A', sizeof(name) - 48);
	AT(table, 8, void *) = PyBytes_Type;
	AT(table, 16, int64_t) = (int64_t)1 << 40; /* ob_size */
	AT(PyCode_Type, 240, void *) = code_members;
	AT(PyCode_Type, 32, long) = 184;          /* tp_basicsize: co_code_adaptive */

	if (!strcmp(mode, "threads"))
		AT(tstate, 8, void *) = tstate;   /* next: itself */
	else if (!strcmp(mode, "wild"))
		AT(cframe, 8, uint64_t) = 0xdead0000;
	if (!strcmp(mode, "late-loop") || !strcmp(mode, "deep-loop")) {
		_PyEval_EvalFrameDefault(1);
		if (!strcmp(mode, "late-loop")) {
			AT(frame, 48, void *) = frame;   /* previous: itself */
		} else {
			AT(frame, 48, void *) = frame2;
			AT(frame2, 48, void *) = frame;
		}
	}
	_PyEval_EvalFrameDefault(-1);
	return (int)(sink & 1);
}
