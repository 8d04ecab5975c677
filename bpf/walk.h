/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The user stack walk: start, one program's worth of frames, finish.
 *
 * A walk spans several tail-called programs that share a per-CPU
 * unwind_state. The native step (native_step) pushes a PC and finds its
 * caller with the tables of unwind.h; a PC in a runtime's code goes to that
 * runtime's walker first (runtime.h). Each program body is written once
 * and instantiated per program type with WALK_PROGRAM: perf_event for CPU
 * samples, and any other type that starts walks (each with its own
 * walk_progs array, since a tail call cannot change program type).
 */
#ifndef PROFSYM_WALK_H
#define PROFSYM_WALK_H

/* Instantiates a walker program: fn(ctx, s, st, progs) runs with the walk
 * state in scratch slot (enum walk_slot) and tail-calls through progs (a
 * PROG_ARRAY indexed by enum walk_prog). */
#define WALK_PROGRAM(sec, name, progs, fn, slot)                               \
	SEC(sec)                                                               \
	int name(void *ctx)                                                    \
	{                                                                      \
		__u32 key = slot;                                              \
		struct unwind_state *s = bpf_map_lookup_elem(&unwind_scratch, &key); \
		struct stats *st = get_stats();                                \
		if (!s || !st)                                                 \
			return 0;                                              \
		return fn(ctx, s, st, &progs);                                 \
	}

/* The key of the walked stack s->stack in ustacks0/1. */
static __always_inline __u64 walked_hash(struct unwind_state *s)
{
	return mix(s->hash, ((__u64)s->stack.len << 8) | (s->stack.reason & (STOP_SLOTS - 1)));
}

static __always_inline int offcpu_park(struct unwind_state *s, struct stats *st); /* offcpu.h */

/* What a runtime's frames pushed by the native walker itself, without a
 * tail call, came to (cpython_inline). */
enum rt_inline {
	RT_INLINE_NO = 0, /* not taken here: the runtime's walker program takes it */
	RT_INLINE_PUSHED, /* the native frame's own frames are pushed */
	RT_INLINE_FULL,   /* the stack is full: the walk ends (STOP_DEPTH) */
	RT_INLINE_FAILED, /* the runtime walk ends: native frames from here */
};

static __always_inline int cpython_inline(struct unwind_state *s); /* cpython.h */

/* Counts one sample whose user stack the walker left in s->stack. */
static __always_inline int finish_walk(struct unwind_state *s, struct stats *st)
{
	struct sample_key key = {};
	void *counts = s->buf ? (void *)&counts1 : (void *)&counts0;
	void *ustacks = s->buf ? (void *)&ustacks1 : (void *)&ustacks0;
	__u64 h;
	__u32 reason = s->stack.reason & (STOP_SLOTS - 1);
	long err;

	if (s->origin == ORIGIN_OFF_CPU)
		return offcpu_park(s, st); /* counted when the thread runs again */
	if (s->copied) {
		st->stack_copies++; /* userspace walks and counts it */
		return 0;
	}
	st->stops[reason]++;
	key.pid = s->tgid;
	key.tid = s->tid;
	key.cpu = bpf_get_smp_processor_id();
	key.kstack = s->kstack;
	key.ustack = -1;
	key.origin = s->origin;
	key.labels = go_labels(s->tgid, s->go_g);
	thread_ctx(s->tgid, &key);
	if (s->stack.len > 0) {
		h = walked_hash(s);
		key.ustack = -2;
		key.uhash = h;
		err = bpf_map_update_elem(ustacks, &h, &s->stack, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			st->lost_stack++;
			return 0;
		}
	}
	return count_sample(counts, &key, st);
}

/* Tail-calls slot idx of progs. Returns only when the call did not happen:
 * out of tail calls (1) or no program in the slot (0). */
static __always_inline int walk_tail_call(void *ctx, struct unwind_state *s, struct stats *st, void *progs,
					  __u32 idx)
{
	if (s->tail_calls >= MAX_TAIL_CALLS)
		return 1;
	s->tail_calls++;
	bpf_tail_call(ctx, progs, idx);
	s->tail_calls--;
	st->unwind_tail_fail++;
	return 0;
}

/* Goes back to the native walker (the end of a runtime walker's run). */
static __always_inline int walk_native(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	walk_tail_call(ctx, s, st, progs, WALK_NATIVE);
	set_reason(s, STOP_DEPTH);
	return finish_walk(s, st);
}

/* Pushes one runtime frame (runtime.h). Returns 0, or 1 when the stack is
 * full: the walk then ends with STOP_DEPTH. */
static __always_inline int push_runtime_frame(struct unwind_state *s, __u32 kind, __u64 ptr, __u64 aux)
{
	__u32 n = s->stack.len;
	__u64 w0;

	if (n + 2 > s->max_frames || n + 2 > MAX_USER_FRAMES) {
		set_reason(s, STOP_DEPTH);
		return 1;
	}
	w0 = RT_FRAME | ((__u64)(kind & ((1u << RT_KIND_BITS) - 1)) << RT_KIND_SHIFT) | (ptr & RT_PTR_MASK);
	s->stack.pcs[n & (MAX_USER_FRAMES - 1)] = w0;
	s->stack.pcs[(n + 1) & (MAX_USER_FRAMES - 1)] = aux;
	s->stack.len = n + 2;
	s->hash = mix(mix(s->hash, w0), aux);
	return 0;
}

/* The runtime whose walker takes pc, or RUNTIME_NONE. */
static __always_inline __u32 runtime_of(struct unwind_state *s, __u64 pc)
{
	if (s->rt_kind == RUNTIME_NONE || s->rt_kind >= RUNTIME_KINDS)
		return RUNTIME_NONE;
	for (int i = 0; i < RT_RANGES; i++) {
		if (pc >= s->rt[i].lo && pc < s->rt[i].hi)
			return s->rt_kind;
	}
	return RUNTIME_NONE;
}

/* Walks FRAMES_PER_PROG native frames, handing runtime code to its walker,
 * then tail-calls itself. */
static __always_inline int native_step(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 n, rt;

	for (int i = 0; i < FRAMES_PER_PROG; i++) {
		if (s->rt_handled) {
			/* The runtime pushed this frame's own frames. */
			s->rt_handled = 0;
		} else {
			rt = runtime_of(s, s->pc_exact ? s->pc : s->pc - 1);
			if (rt == RUNTIME_CPYTHON) {
				/* Up to 3.10, pushed here: no tail call. */
				switch (cpython_inline(s)) {
				case RT_INLINE_PUSHED:
					goto step;
				case RT_INLINE_FULL:
					return finish_walk(s, st);
				case RT_INLINE_FAILED:
					set_reason(s, STOP_RUNTIME);
					s->rt_kind = RUNTIME_NONE;
					rt = RUNTIME_NONE;
				}
			}
			if (rt != RUNTIME_NONE) {
				if (walk_tail_call(ctx, s, st, progs, rt)) {
					set_reason(s, STOP_DEPTH);
					return finish_walk(s, st);
				}
				/* No walker loaded for it: native frames, marked. */
				set_reason(s, STOP_RUNTIME);
				s->rt_kind = RUNTIME_NONE;
			}
			if (s->pc & ~RT_PTR_MASK) {
				/* No user address (garbage a frame pointer walk
				 * found): it would read as a runtime frame. */
				set_reason(s, STOP_BAD_FRAME);
				return finish_walk(s, st);
			}
			n = s->stack.len;
			if (n >= s->max_frames || n >= MAX_USER_FRAMES) {
				set_reason(s, STOP_DEPTH);
				return finish_walk(s, st);
			}
			s->stack.pcs[n & (MAX_USER_FRAMES - 1)] = s->pc | (n && s->pc_exact ? PC_EXACT : 0);
			s->stack.len = n + 1;
			s->hash = mix(s->hash, s->pc);
			st->unwind_frames++;
		}
step:
		if (unwind_frame(s, st)) {
			if (!s->want_copy)
				return finish_walk(s, st);
			s->want_copy = 0;
			walk_tail_call(ctx, s, st, progs, WALK_COPY);
			/* No copy program here: the next round steps this frame
			 * again, pushing nothing, and copy_tried makes it the
			 * step without copies. Stepping it here instead put one
			 * more inlined FP step (and mapping search) in every
			 * round: 2.5 times the verifier's work for this program. */
			s->rt_handled = 1;
			continue;
		}
		if (s->pc == 0)
			return finish_walk(s, st);
	}
	walk_tail_call(ctx, s, st, progs, WALK_NATIVE);
	set_reason(s, STOP_DEPTH);
	return finish_walk(s, st);
}

/* Fills c->fpcs with the callers checked FP steps give from s->pc (see
 * struct stack_copy), leaving s as it was. The steps do not search the
 * process's mappings: userspace, which has them, cuts the callers at the
 * first PC outside them (unwind/copy.go). Searching here, 32 times over,
 * made this program two thirds of the sampler's verification. */
static __always_inline void copy_fp_fallback(struct unwind_state *s, struct stack_copy *c)
{
	__u64 pc = s->pc, sp = s->sp, fp = s->fp;
	__u32 sp_unknown = s->sp_unknown, pc_exact = s->pc_exact, trusted = s->trusted, reason = s->stack.reason;

	c->fplen = 0;
	for (int i = 0; i < STACK_COPY_FP_FRAMES; i++) {
		if (untrusted_fp_step_in(s, false) || s->pc == 0 || (s->pc & ~RT_PTR_MASK))
			break;
		c->fpcs[i & (STACK_COPY_FP_FRAMES - 1)] = s->pc;
		c->fplen = i + 1;
	}
	s->pc = pc;
	s->sp = sp;
	s->fp = fp;
	s->sp_unknown = sp_unknown;
	s->pc_exact = pc_exact;
	s->trusted = trusted;
	s->stack.reason = reason;
}

/* Copies the stack of a sample that met code whose table is not loaded
 * yet, from the frame at s->pc up, with the walk so far, its kernel stack
 * and registers, to stack_copies; userspace walks the rest once the tables
 * are loaded (docs/unwinding.md). A copy that cannot be sent goes on as
 * without copies: a checked FP step. */
static __always_inline int copy_stack(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, got = 0, want = stack_copy_bytes, n;
	__u64 addr = s->sp, size;
	struct stack_copy *c = bpf_map_lookup_elem(&stack_copy_scratch, &zero);
	long k;

	if (!c)
		goto lost;
	if (want > STACK_COPY_MAX)
		want = STACK_COPY_MAX;
	for (int i = 0; i < STACK_COPY_CHUNKS; i++) {
		if (got >= want)
			break;
		/* To the end of addr's page: a stack that ends sooner (the
		 * main thread's, near its top) ends the copy there. */
		n = STACK_COPY_PAGE - (addr & (STACK_COPY_PAGE - 1));
		if (n > want - got)
			n = want - got;
		if (probe_read_user_upto(&c->stack[got & (STACK_COPY_MAX - 1)], n, STACK_COPY_PAGE, addr))
			break;
		got += n;
		addr += n;
	}
	if (got == 0) {
		/* Nothing readable at SP: the stack is gone (a sample in
		 * exit_group once the process's memory is released: its
		 * unwind entry went with it, so it looked not ready). No walk
		 * goes on from here, tables or not: a read fault, not a
		 * sample waiting for tables. */
		s->stack.reason = STOP_READ_FAULT;
		return finish_walk(s, st);
	}
	c->pid = s->tgid;
	c->tid = s->tid;
	c->cpu = bpf_get_smp_processor_id();
	c->ts_ns = bpf_ktime_get_boot_ns();
	c->pc = s->pc;
	c->sp = s->sp;
	c->fp = s->fp;
	c->ulen = s->stack.len;
	c->pc_exact = s->pc_exact;
	c->size = got;
	copy_fp_fallback(s, c);
	/* 2 KiB: past what clang inlines as a memcpy. */
	bpf_probe_read_kernel(c->upcs, sizeof(c->upcs), s->stack.pcs);
	bpf_get_current_comm(c->comm, sizeof(c->comm));
	c->kbytes = 0;
	if (kernel_stacks) {
		k = bpf_get_stack(ctx, c->kpcs, sizeof(c->kpcs), 0);
		if (k > 0)
			c->kbytes = k;
	}
	size = __builtin_offsetof(struct stack_copy, stack) + (got & (2 * STACK_COPY_MAX - 1));
	if (size > sizeof(*c))
		size = sizeof(*c);
	if (bpf_ringbuf_output(&stack_copies, c, size, 0))
		goto lost;
	s->copied = 1;
	return finish_walk(s, st);
lost:
	st->stack_copy_lost++;
	if (untrusted_fp_step(s) || s->pc == 0)
		return finish_walk(s, st);
	walk_tail_call(ctx, s, st, progs, WALK_NATIVE);
	set_reason(s, STOP_DEPTH);
	return finish_walk(s, st);
}

WALK_PROGRAM("perf_event", unwind_step, unwind_progs, native_step, WALK_SLOT_CPU)
WALK_PROGRAM("perf_event", unwind_copy, unwind_progs, copy_stack, WALK_SLOT_CPU)

/* Sets up a walk of the current task's user stack and starts it through
 * progs. A CPU sample that hit user mode has the user registers in its
 * context; everything else reads those saved on kernel entry. */
static __always_inline int start_walk(void *ctx, struct stats *st, __u32 tgid, __u32 tid, __u32 origin,
				      void *progs)
{
	struct bpf_perf_event_data *pctx = ctx;
	struct unwind_state *s;
	struct unwind_proc *p;
	struct pt_regs *regs;
	__u32 slot = origin == ORIGIN_OFF_CPU ? WALK_SLOT_OFF_CPU : WALK_SLOT_CPU;
	long id = -1;

	s = bpf_map_lookup_elem(&unwind_scratch, &slot);
	if (!s)
		return 0;
	s->slot = slot;
	s->buf = active_buf & 1;
	s->tgid = tgid;
	s->tid = tid;
	s->origin = origin;
	s->hash = 0xcbf29ce484222325ull;
	s->tail_calls = 0;
	s->remapped = 0;
	s->max_frames = max_user_words;
	s->stack.len = 0;
	s->stack.reason = STOP_OK;
	s->sp_unknown = 0;
	s->kstack = -1;
	s->rt_kind = RUNTIME_NONE;
	s->rt_handled = 0;
	s->copy_tried = 0;
	s->want_copy = 0;
	s->copied = 0;
	__builtin_memset(s->rt_data, 0, sizeof(s->rt_data));
	if (kernel_stacks && origin == ORIGIN_CPU) { /* off CPU: offcpu.h takes its own */
		id = stack_id(ctx, s->buf ? (void *)&stacks1 : (void *)&stacks0, 0, st);
		if (id == -2)
			return 0;
		s->kstack = id;
	}
	/* Kernel threads have no user stack. */
	if (!BPF_CORE_READ(current_task(), mm))
		return finish_walk(s, st);
	/* The user registers: the sample's own when it hit user mode, else
	 * those saved on kernel entry (arch.h, compat.h). */
	s->regs_valid = REGS_USER;
	if (origin != ORIGIN_CPU || !arch_sample_regs(pctx, s)) {
		regs = current_entry_regs();
		if (!regs || !arch_entry_regs(regs, s))
			return finish_walk(s, st);
		/* The rest are read from there only if a row needs one (each
		 * read is a helper call; most samples need none). */
		s->entry_regs = (__u64)regs;
		s->regs_valid = REGS_ENTRY;
	}
	s->pc_exact = 1;
	s->trusted = 1;
	if (s->pc == 0)
		return finish_walk(s, st);
	p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	if (p) {
		__u64 *gone = bpf_map_lookup_elem(&unwind_exits, &tgid);

		if (gone && *gone != BPF_CORE_READ(current_task(), group_leader, start_time))
			p = NULL; /* an exited process's tables, and the pid reused */
	}
	s->have_proc = p != NULL;
	s->map_first = p ? p->first : 0;
	s->map_count = p ? p->count : 0;
	if (p && p->rt_kind != RUNTIME_NONE) {
		s->rt_kind = p->rt_kind;
		for (int i = 0; i < RT_RANGES; i++)
			s->rt[i] = p->rt[i];
	}
	walk_tail_call(ctx, s, st, progs, WALK_NATIVE);
	return finish_walk(s, st);
}

#endif /* PROFSYM_WALK_H */
