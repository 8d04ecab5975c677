#ifndef OTELCTX_H
#define OTELCTX_H
#include <stdint.h>

/* OTEP 4947's record: packed, host byte order, 2-byte aligned at least. */
struct otel_ctx_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_size;
	uint8_t attrs[36];
} __attribute__((packed, aligned(8)));

extern __thread struct otel_ctx_record *otel_thread_ctx_v1;

void otelctx_point(struct otel_ctx_record *rec);
void otelctx_valid(struct otel_ctx_record *rec, int valid);
#endif
