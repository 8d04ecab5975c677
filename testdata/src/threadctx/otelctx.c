/*
 * A minimal writer of the OpenTelemetry thread context (OTEP 4947), made
 * for profsym's tests: the TLS pointer otel_thread_ctx_v1, exported in
 * .dynsym, and the record it points at. Built into the test program
 * (local-exec access) or as libotelctx.so (TLSDESC or initial-exec).
 */
#include <stddef.h>
#include <stdint.h>

#include "otelctx.h"

__attribute__((visibility("default"))) __thread struct otel_ctx_record *otel_thread_ctx_v1;

/* Pointer style: point the thread at rec (NULL: no span). */
void otelctx_point(struct otel_ctx_record *rec)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* the record is complete first */
	*(struct otel_ctx_record *volatile *)&otel_thread_ctx_v1 = rec;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* Flag style: the thread keeps pointing at rec; valid says whether it
 * holds a span. */
void otelctx_valid(struct otel_ctx_record *rec, int valid)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	*(volatile uint8_t *)&rec->valid = valid ? 1 : 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}
