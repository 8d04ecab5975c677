/*
 * A library that forges Ruby's state (internal/host/runtimes/ruby
 * TestForgedRuby). Installed as libruby-3.1.so.3.1.99 and linked into
 * forged_main.c, it exports what the agent looks for (ruby_version,
 * rb_vm_exec, the TLS ruby_current_ec) laid out as Ruby 3.1 lays them
 * out, and spins in its "VM entry". What it forges, by mode:
 *
 *   (built with -DVERSION='"3.2.99"': a version without a layout)
 *   wild       a sane stack of two frames (one named with a 64 KiB
 *              label) whose ec->cfp turns into a wild pointer after a second
 *   no-finish  48 control frames, none flagged FINISH, up to the stack's end
 *   freed      the frames' iseq turns into garbage (freed) once the process
 *              gets SIGUSR1, so that the test has had them named first
 *   reused     the frames' iseq slot holds another iseq (body, label
 *              "reused") once the process gets SIGUSR1, as after a free
 *              and an allocation in the same slot
 *
 * It spins until killed.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AT(base, off, type) (*(type *)((char *)(base) + (off)))

#ifndef VERSION
#define VERSION "3.1.99"
#endif
__attribute__((visibility("default"))) const char ruby_version[] = VERSION;
__attribute__((visibility("default"))) __thread void *ruby_current_ec;

#define FRAMES 48 /* 96 words: the walk reaches the stack's end before the depth limit */
#define CFP 64
static uint64_t stack[FRAMES * CFP / 8];
static char ec[64], iseq[64], body[320], label[(1 << 16) + 64], path[64], env[3][8 * 3];
static uint64_t insns[16];
static char body2[320], label2[32];

static volatile uint64_t sink;
static volatile sig_atomic_t hostile;

static void on_usr1(int sig)
{
	(void)sig;
	hostile = 1;
}

/* The "VM entry": where every sample lands. */
__attribute__((noinline, visibility("default"))) void rb_vm_exec(double seconds) /* < 0: forever */
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

static void frame(int i, uint64_t flags, int e)
{
	char *cfp = (char *)stack + (size_t)i * CFP;
	AT(cfp, 0, uint64_t *) = &insns[2]; /* pc */
	AT(cfp, 16, void *) = iseq;
	AT(env[e], 16, uint64_t) = flags; /* ep[0] */
	AT(cfp, 32, void *) = env[e] + 16;  /* ep */
}

__attribute__((visibility("default"))) int forge_run(const char *mode)
{
	/* 3.1: ec: vm_stack 0, vm_stack_size 8, cfp 16; iseq: body 16;
	 * body: type 0, iseq_size 4, iseq_encoded 8, location 64 (pathobj,
	 * base_label, label), insns_info 120, size 136; RString: len 16,
	 * ptr 24 (NOEMBED). */
	ruby_current_ec = ec;
	AT(ec, 0, void *) = stack;
	AT(ec, 8, uint64_t) = FRAMES * CFP / 8;
	AT(iseq, 0, uint64_t) = 0x1a | 7 << 12; /* T_IMEMO, imemo_iseq */
	AT(iseq, 16, void *) = body;
	AT(body, 0, uint32_t) = 1; /* method */
	AT(body, 4, uint32_t) = 16;
	AT(body, 8, void *) = insns;
	AT(body, 64, void *) = path;
	AT(body, 72, void *) = label;
	AT(body, 80, void *) = label;
	AT(path, 0, uint64_t) = 0x5 | 1 << 13;
	AT(path, 16, uint64_t) = 7;
	AT(path, 24, const char *) = "/x.rb\0\0";
	AT(label, 0, uint64_t) = 0x5 | 1 << 13;
	AT(label, 16, uint64_t) = sizeof(label) - 33;
	AT(label, 24, char *) = label + 32;
	memset(label + 32, 'A', sizeof(label) - 33);
	memcpy(body2, body, sizeof(body));
	AT(body2, 72, void *) = label2;
	AT(body2, 80, void *) = label2;
	AT(label2, 0, uint64_t) = 0x5 | 1 << 13;
	AT(label2, 16, uint64_t) = 6;
	AT(label2, 24, const char *) = "reused";
	if (!strcmp(mode, "no-finish")) {
		for (int i = 0; i < FRAMES; i++)
			frame(i, 0x11110003, 0);
		AT(ec, 16, void *) = stack;
	} else {
		frame(FRAMES - 2, 0x11110003, 0);
		frame(FRAMES - 1, 0x11110003 | 0x20, 1); /* FINISH */
		AT(ec, 16, void *) = (char *)stack + (FRAMES - 2) * CFP;
	}
	if (!strcmp(mode, "freed") || !strcmp(mode, "reused")) {
		signal(SIGUSR1, on_usr1);
		while (!hostile)
			rb_vm_exec(0.05);
	} else {
		rb_vm_exec(1);
	}
	if (!strcmp(mode, "wild"))
		AT(ec, 16, uint64_t) = 0xdead0000;
	else if (!strcmp(mode, "freed"))
		memset(iseq, 0x5a, 16);
	else if (!strcmp(mode, "reused"))
		AT(iseq, 16, void *) = body2;
	rb_vm_exec(-1);
	return (int)(sink & 1);
}
