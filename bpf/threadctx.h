/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * OpenTelemetry thread context (OTEP 4947; docs/runtimes.md, "Trace links").
 *
 * An SDK that follows the OTEP exports a TLS pointer, otel_thread_ctx_v1,
 * to the record of the span its thread runs: trace id (16 bytes), span id
 * (8), a valid byte, trace flags, then attributes. Userspace
 * (internal/host/runtimes/threadctx) finds where the pointer sits relative
 * to the thread pointer (x86-64: below the fs base; arm64: above
 * tpidr_el0) and puts that offset in tctx_procs. The record is
 * reused and rewritten as spans start and end, so the ids are copied into
 * the sample's key here, at sample time; a later read on the host could
 * name the next span. Every read is checked; any failure leaves no ids.
 */
#ifndef PROFSYM_THREADCTX_H
#define PROFSYM_THREADCTX_H

/* Set by the loader: whether tctx_procs is in use. */
volatile const bool thread_ctx_on = false;

struct tctx_proc {
	__s64 tls_off; /* otel_thread_ctx_v1 relative to the thread pointer (x86-64: fs base) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024); /* processes past it get no ids */
	__type(key, __u32);
	__type(value, struct tctx_proc);
} tctx_procs SEC(".maps");

/* The record's fixed head, as the OTEP lays it out (packed, 28 bytes). */
struct tctx_record {
	__u8 trace_id[16];
	__u8 span_id[8];
	__u8 valid; /* 1: the record may be used; anything else: it may not */
	__u8 flags;
	__u16 attrs_size;
};

/* thread_ctx copies the span tgid's current thread publishes into key, or
 * leaves key's ids zero. */
static __always_inline void thread_ctx(__u32 tgid, struct sample_key *key)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct tctx_proc *tp;
	struct tctx_record rec;
	__u64 base, ptr = 0;

	if (!thread_ctx_on)
		return;
	tp = bpf_map_lookup_elem(&tctx_procs, &tgid);
	if (!tp)
		return;
#if defined(__TARGET_ARCH_arm64)
	base = BPF_CORE_READ(task, thread.uw.tp_value);
#else
	base = BPF_CORE_READ(task, thread.fsbase);
#endif
	if (!base)
		return;
	if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)(base + tp->tls_off)) || !ptr)
		return;
	if (bpf_probe_read_user(&rec, sizeof(rec), (void *)ptr) || rec.valid != 1)
		return;
	__builtin_memcpy(key->trace_id, rec.trace_id, sizeof(rec.trace_id));
	__builtin_memcpy(key->span_id, rec.span_id, sizeof(rec.span_id));
}

#endif /* PROFSYM_THREADCTX_H */
