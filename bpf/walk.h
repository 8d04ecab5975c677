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
	st->stops[reason]++;
	key.pid = s->tgid;
	key.tid = s->tid;
	key.cpu = bpf_get_smp_processor_id();
	key.kstack = s->kstack;
	key.ustack = -1;
	key.origin = s->origin;
	key.labels = go_labels(s->tgid);
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
		if (unwind_frame(s, st))
			return finish_walk(s, st);
		if (s->pc == 0)
			return finish_walk(s, st);
	}
	walk_tail_call(ctx, s, st, progs, WALK_NATIVE);
	set_reason(s, STOP_DEPTH);
	return finish_walk(s, st);
}

WALK_PROGRAM("perf_event", unwind_step, unwind_progs, native_step, WALK_SLOT_CPU)

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
	s->max_frames = max_depth;
	s->stack.len = 0;
	s->stack.reason = STOP_OK;
	s->sp_unknown = 0;
	s->kstack = -1;
	s->rt_kind = RUNTIME_NONE;
	s->rt_handled = 0;
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
