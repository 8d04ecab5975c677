/*
 * threadctx: the thread context fixture (internal/e2e TestCollectorThreadContext,
 * TestRecordThreadContext). It warms up until a line arrives on stdin,
 * prints "go", then serves N requests one after another on its main
 * thread: each a span "request" with a child "compute" that spins in
 * in_span for 100 ms of thread CPU time while the thread publishes the
 * compute span, then spins in outside, with no span published, for 50 ms.
 * Every span is printed as it ends ("span TRACE SPAN START END NAME", Unix
 * ns, hex ids), then "done"; it then waits to be killed.
 *
 * First it prints "tls OFFSET": where otel_thread_ctx_v1 is from the
 * thread pointer, as the program itself sees it.
 *
 * argv[2] picks how it publishes, both as the OTEP allows: "point" sets
 * the TLS pointer to a record per span and back to NULL; "flag" keeps the
 * pointer on one record and turns its valid byte on and off. "wild" is a
 * hostile publisher: in its spans the pointer leads to an unmapped page
 * (even requests) or to a record whose valid byte is 7 (odd ones), and
 * nothing may come of either.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include "otelctx.h"

#define SPAN_CPU_NS 100000000ull

static volatile uint64_t sink;

/* TLS of the program's own, aligned, so that the variable does not sit
 * where a reader that ignores the blocks' sizes and alignment would look. */
__thread char scratch[128] __attribute__((aligned(64)));

__attribute__((noinline)) static void spin(void)
{
	uint64_t x = sink;
	for (int i = 0; i < 100000; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	sink = x;
}

static uint64_t thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

__attribute__((noinline)) void in_span(uint64_t ns)
{
	for (uint64_t start = thread_cpu(); thread_cpu() - start < ns;)
		spin();
}

__attribute__((noinline)) void outside(uint64_t ns)
{
	for (uint64_t start = thread_cpu(); thread_cpu() - start < ns;)
		spin();
}

__attribute__((noinline)) void warm(void)
{
	/* until stdin has a line: spin between polls */
	for (;;) {
		fd_set fds;
		struct timeval tv = {0, 0};
		FD_ZERO(&fds);
		FD_SET(0, &fds);
		if (select(1, &fds, NULL, NULL, &tv) > 0)
			return;
		spin();
	}
}

static void hex(const uint8_t *b, int n, char *out)
{
	for (int i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static void print_span(const uint8_t *trace, const uint8_t *span, uint64_t start, uint64_t end, const char *name)
{
	char t[33], s[17];
	hex(trace, 16, t);
	hex(span, 8, s);
	printf("span %s %s %" PRIu64 " %" PRIu64 " %s\n", t, s, start, end, name);
	fflush(stdout);
}

static void ids(uint8_t *b, size_t n)
{
	do {
		if (getrandom(b, n, 0) != (ssize_t)n)
			abort();
	} while (b[0] == 0); /* never all zero */
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 30;
	int flag = argc > 2 && strcmp(argv[2], "flag") == 0;
	int wild = argc > 2 && strcmp(argv[2], "wild") == 0;
	struct otel_ctx_record *unmapped;
	static struct otel_ctx_record fixed, recs[2];
	char line[64];

	setvbuf(stdout, NULL, _IOLBF, 0);
	((volatile char *)scratch)[argc % sizeof scratch] = 1;
	if (flag)
		otelctx_point(&fixed); /* once; valid says the rest */
	/* A page that was mapped and is no longer. */
	unmapped = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (unmapped == MAP_FAILED || munmap(unmapped, 4096) != 0)
		return 1;
	/* Where the variable is from the thread pointer, for the reader's
	 * own check (threadctx's tests). */
	printf("tls %ld\n", (long)((char *)&otel_thread_ctx_v1 - (char *)__builtin_thread_pointer()));
	printf("ready\n");
	warm();
	if (!fgets(line, sizeof line, stdin))
		return 1;
	printf("go\n");
	for (int i = 0; i < n; i++) {
		uint8_t trace[16], req[8], comp[8];
		struct otel_ctx_record *rec = flag ? &fixed : &recs[i % 2];
		uint64_t t0, t1;

		ids(trace, sizeof trace);
		ids(req, sizeof req);
		ids(comp, sizeof comp);
		t0 = now();
		if (flag)
			otelctx_valid(rec, 0);
		memcpy(rec->trace_id, trace, 16);
		memcpy(rec->span_id, comp, 8);
		rec->trace_flags = 1;
		rec->attrs_size = 0;
		if (wild) {
			rec->valid = 7;
			otelctx_point(i % 2 ? rec : unmapped);
		} else if (flag) {
			otelctx_valid(rec, 1);
		} else {
			rec->valid = 1;
			otelctx_point(rec);
		}
		in_span(SPAN_CPU_NS);
		if (flag)
			otelctx_valid(rec, 0);
		else
			otelctx_point(NULL);
		t1 = now();
		print_span(trace, comp, t0, t1, "compute");
		print_span(trace, req, t0, t1, "request");
		outside(SPAN_CPU_NS / 2);
	}
	printf("done\n");
	for (;;)
		pause();
}
