/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * User-space stack unwinder driven by call frame information (docs/unwinding.md).
 *
 * Tables are built on the host (internal/host/unwind) and live in four maps:
 *
 *   unwind_procs     tgid -> range of unwind_mappings (sorted by start)
 *   unwind_mappings  executable mappings: [start, end), load bias, table slot
 *   unwind_tables    slot -> range of unwind_rows, ELF base, state
 *   unwind_rows      every table's rows, 8 bytes each, sorted by pc per table
 *
 * Per frame: binary search the process's mappings for the PC, then the
 * mapping's table for the row covering the PC, apply the row (CFA from SP or
 * FP, RA at CFA-8, caller's FP saved at CFA+off) and read memory with
 * bpf_probe_read_user. Code without a table (JIT, vdso, anonymous memory,
 * rows the table cannot express) steps with frame pointers.
 *
 * A walk spans several programs: unwind_step walks FRAMES_PER_PROG frames
 * and tail-calls itself; its state lives in a per-CPU scratch value, so
 * every program starts from the same verifier state.
 */
#ifndef PROFSYM_UNWIND_H
#define PROFSYM_UNWIND_H

#include "types.h"
#include "runtime.h"

/* Limits of the walk (an enum: bpf2go exports them to Go). */
enum unwind_limits {
	/* Words a walked stack can hold (a native frame one, a runtime frame
	 * two); a power of two: indexes are masked. The loader keeps walks to
	 * max_user_words of them and sizes the stack maps' values to that. */
	MAX_USER_FRAMES = 256,
	FRAMES_PER_PROG = 8,    /* frames per program: 30 tail calls reach 240 */
	ROW_SEARCH_STEPS = 22,  /* tables of up to 2^22-1 rows (libLLVM: 0.8M) */
	MAP_SEARCH_STEPS = 10,  /* up to 1023 executable mappings per process */
	MAX_TAIL_CALLS = 30,    /* the kernel allows 33 */
	/* Stack copies of not-ready samples (WALK_COPY): at most this many
	 * bytes (the config's stack_copy_bytes is 0 or up to it), read a page
	 * at a time so that the end of the stack mapping ends the copy, not
	 * the whole read; STACK_COPIES_PER_PROC: see not_ready_step. */
	STACK_COPY_MAX = 16384,
	STACK_COPY_PAGE = 4096,
	STACK_COPY_CHUNKS = STACK_COPY_MAX / STACK_COPY_PAGE + 1,
	/* 32 was too few: under TCG (5.10) a cold agent loaded the first
	 * fixture late, and 7 of its samples after the 32 copies ended
	 * not_ready. At 99 Hz
	 * 128 is 1.3 s of one thread's CPU; a process the agent never loads
	 * costs at most that many 10 KiB copies, and one outside the
	 * targets none once Manager.Ignore spends its count. */
	STACK_COPIES_PER_PROC = 128,
	STACK_COPY_FP_FRAMES = 32, /* a power of two: indexes are masked */
};

/* Bytes of user stack copied for a sample whose process or table is not
 * ready (0: off). Set by the loader. */
volatile const __u32 stack_copy_bytes = 0;

/* unwind_mapping.table values that are not slots (an enum, so that Go
 * gets them from the generated types, not a copy). */
enum table_slot {
	TABLE_FP = 0xffffffffu,   /* JIT, anonymous code: frame pointers */
	TABLE_VDSO = 0xfffffffeu, /* [vdso]: frame pointers, or its signal trampoline */
};

/* unwind_table.state */
enum table_state {
	TABLE_PENDING = 0, /* being built: FP fallback, stop reason NOT_READY */
	TABLE_READY = 1,
	TABLE_NONE = 2,    /* no CFI (or no room): FP fallback, stop reason NO_TABLE */
	TABLE_LAZY = 3,    /* known but never sampled: the first sample asks for it */
};

/* Row info byte: kind in bits 0-1, CFA rule in bits 2-3, FP saved in bit 4,
 * and in bits 5-7 (arm64's "RA still in LR" would be a new kind):
 *  - with CFA_UNDEF, a register code: CFA = that register + cfa_off
 *    (OpenSSL's assembly keeps the entry SP in rax, rsi or r11 while it
 *    realigns the stack). Only the innermost frame has the register (see
 *    enum regs_source); elsewhere such a row steps with frame pointers;
 *  - with CFA_SP or CFA_FP, k != 0: CFA = *(SP or FP + (s16)cfa_off) + 8k,
 *    the entry SP saved in a realigned frame (OpenSSL, gcc). */
enum row_kind {
	ROW_NORMAL = 0,
	ROW_END = 1,      /* outermost frame */
	ROW_SIGNAL = 2,   /* rt_sigframe at SP */
	ROW_FALLBACK = 3, /* frame pointers */
};
enum cfa_rule {
	CFA_UNDEF = 0, /* frame pointers */
	CFA_SP = 1,
	CFA_FP = 2,
	CFA_PLT = 3,   /* SP + 8, + 8 more past the PLT entry's push */
};
enum row_bits {
	ROW_FP_SAVED = 1 << 4,
	ROW_REG_SHIFT = 5,
};
/* Register codes 1-7, as internal/host/unwind regCodes:
 * rax, rdx, rsi, rdi, r9, r10, r11. */
#define CFA_REGS 8
#define CFA_REG_RAX 1
#define CFA_REG_R11 7

enum regs_source {
	REGS_NONE = 0,
	REGS_USER = 1,  /* the sample hit user mode: every register is exact */
	REGS_ENTRY = 2, /* saved on kernel entry: rax and r11 not after a syscall */
};

struct unwind_row {
	__u32 pc;      /* offset from unwind_table.base */
	__u16 cfa_off; /* bytes */
	__u8 info;     /* kind | rule << 2 | ROW_FP_SAVED */
	__s8 fp_off;   /* caller's FP at CFA + 8 * fp_off */
};

struct unwind_table {
	__u64 base;  /* ELF virtual address of row pc 0 */
	__u32 first; /* index of the first row in unwind_rows */
	__u32 count;
	__u32 state; /* enum table_state */
	__u32 pad;
};

struct unwind_mapping {
	__u64 start;
	__u64 end;
	__u64 bias;  /* ELF virtual address = pc - bias */
	__u32 table; /* slot in unwind_tables, or TABLE_FP */
	__u32 pad;
};

struct unwind_proc {
	__u32 first; /* index of the first mapping in unwind_mappings */
	__u32 count;
	__u64 remap_ns; /* last "PC in no known mapping" event */
	__u32 rt_kind;  /* enum runtime_kind (runtime.h) */
	__u32 rt_pad;
	struct rt_range rt[RT_RANGES]; /* code the runtime's walker takes */
};

/* A walked stack, the value of the ustacks maps: those hold its first
 * 8 + 8 * max_user_words bytes (the loader sets their value size). */
struct user_stack {
	__u32 len;
	__u32 reason; /* enum stop_reason */
	__u64 pcs[MAX_USER_FRAMES];
};

/* Per-CPU walk state, carried across tail calls. */
struct unwind_state {
	__u64 pc, sp, fp;
	__u64 hash;
	__u32 tgid, tid;
	__u32 buf;      /* aggregation buffer chosen at the start of the sample */
	__s32 kstack;
	__u32 map_first, map_count;
	__u32 have_proc;
	__u32 pc_exact; /* pc is not a return address (leaf, signal frame) */
	__u32 tail_calls;
	__u32 remapped; /* "unknown PC" event already sent for this sample */
	__u32 max_frames;
	__u32 trusted;  /* this PC was reached by registers, a table row or an
			 * expected FP step, not by FP through code without FP */
	__u32 regs_valid; /* enum regs_source: regs hold the innermost frame's */
	__u32 sp_unknown; /* an FP step left SP unknown (arch.h): no SP rules */
	__u64 regs[CFA_REGS]; /* REGS_USER: by register code; regs[0] unused */
	__u64 rt_reg;         /* REGS_USER: a register a runtime walker reads in the
			       * innermost frame (HotSpot's bytecode pointer: x86-64
			       * r13, arm64 x22) */
	__u64 entry_regs;     /* REGS_ENTRY: the task's pt_regs (kernel address) */
	__u64 go_g;           /* arm64: x28 where the sample left user mode (Go's g; golabels.h) */
	__u32 origin;         /* enum sample_origin: what finish_walk records */
	__u32 rt_kind;        /* the process's enum runtime_kind; NONE once its walker failed */
	__u32 rt_handled;     /* the runtime walker pushed s->pc's frames: step it, push nothing */
	__u32 slot;           /* enum walk_slot: the scratch values this walk uses */
	struct rt_range rt[RT_RANGES];
	/* The runtime walkers' own state between their runs in one walk (a
	 * cursor in the interpreter's frame chain, ...); zero at the start. */
	__u64 rt_data[4];
	__u32 copy_tried; /* this walk met not-ready code: copy at most once */
	__u32 want_copy;  /* unwind_frame asks native_step for WALK_COPY */
	__u32 copied;     /* the stack went to userspace: do not count the sample */
	__u32 copy_pad;
	struct user_stack stack;
};

/* A not-ready sample's stack, for userspace to walk once the tables are
 * loaded (internal/host/unwind, copy.go). Sent up to stack[size]. */
struct stack_copy {
	__u32 pid, tid;
	__u32 cpu;
	__u32 kbytes;    /* bytes of kpcs */
	__u64 ts_ns;     /* CLOCK_BOOTTIME */
	__u64 pc, sp, fp; /* the frame at pc: the last of upcs */
	__u32 ulen;      /* words of upcs: the walk so far, as user_stack.pcs */
	__u32 pc_exact;  /* pc is no return address (the leaf) */
	__u32 size;      /* bytes of stack copied from sp */
	__u32 fplen;     /* words of fpcs */
	char comm[16];
	/* The callers checked frame pointers give from pc, as the walk would
	 * have gone on without the copy: what userspace keeps (marked
	 * not_ready) if it cannot walk the copy, e.g. a process it never
	 * loads. */
	__u64 fpcs[STACK_COPY_FP_FRAMES];
	__u64 kpcs[MAX_STACK_DEPTH];
	__u64 upcs[MAX_USER_FRAMES];
	/* One page more than the limit: the verifier checks a read at a
	 * variable offset against the largest offset plus the largest size. */
	__u8 stack[STACK_COPY_MAX + STACK_COPY_PAGE];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* tgid -> the start_time (its group leader's) of a process that exited and
 * that userspace has not forgotten yet, set by handle_exit. From 6.16 the
 * exit tracepoint comes before exit_mm(), and samples in between still have
 * the user stack: they walk with the process's tables until userspace
 * forgets it, and a reused pid (another start_time) never sees them. A map
 * of its own, not a field of unwind_proc: userspace rewrites that entry
 * whole (a table load in flight when the process exits), which would clear
 * the mark. Sized like unwind_procs at load. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} unwind_exits SEC(".maps");

/* Sizes below are placeholders; the loader sets them from the config. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_mapping);
} unwind_mappings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_table);
} unwind_tables SEC(".maps");

/* Mmapable: userspace writes rows with memcpy, not one syscall per batch. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* A walk of a CPU sample and one of an off-CPU wait each have scratch
 * values of their own (here and in the runtime walkers' scratch maps): a
 * sample taken by an NMI (a hardware event) can interrupt sched_switch's
 * walk on its CPU, and must not overwrite it. The cpu-clock event is an
 * hrtimer, which cannot fire while sched_switch runs with interrupts off,
 * but the walk should not depend on which event the sampler opens. */
enum walk_slot {
	WALK_SLOT_CPU = 0,
	WALK_SLOT_OFF_CPU = 1,
	WALK_SLOTS = 2,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS);
	__type(key, __u32);
	__type(value, struct unwind_state);
} unwind_scratch SEC(".maps");

/* Values are struct user_stack cut after max_user_words words: sized by
 * the loader, so no BTF type (its size would have to match). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u64));
	__uint(value_size, sizeof(struct user_stack));
} ustacks0 SEC(".maps"), ustacks1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_copy);
} stack_copy_scratch SEC(".maps");

/* Sized by the loader; a page when copies are off. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} stack_copies SEC(".maps");

/* The walker's programs for perf_event samples, by enum walk_prog. Another
 * program type (kprobe) needs its own array: a tail call stays within one. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, WALK_PROGS);
	__type(key, __u32);
	__type(value, __u32);
} unwind_progs SEC(".maps");

static __always_inline void set_reason(struct unwind_state *s, __u32 r)
{
	if (s->stack.reason == STOP_OK)
		s->stack.reason = r;
}

#include "arch.h"

/* Last mapping with start <= pc, if it holds pc. */
static __always_inline struct unwind_mapping *find_mapping(struct unwind_state *s, __u64 pc)
{
	__u32 lo = s->map_first, hi = s->map_first + s->map_count, idx;
	struct unwind_mapping *m;

	for (int i = 0; i < MAP_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		m = bpf_map_lookup_elem(&unwind_mappings, &mid);
		if (!m)
			return NULL;
		if (m->start <= pc)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == s->map_first)
		return NULL;
	idx = lo - 1;
	m = bpf_map_lookup_elem(&unwind_mappings, &idx);
	if (!m || pc >= m->end)
		return NULL;
	return m;
}

/* Last row of t with pc <= off. */
static __always_inline struct unwind_row *find_row(struct unwind_table *t, __u32 off)
{
	__u32 first = t->first, lo = t->first, hi = t->first + t->count, idx;
	struct unwind_row *r;

	for (int i = 0; i < ROW_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		r = bpf_map_lookup_elem(&unwind_rows, &mid);
		if (!r)
			return NULL;
		if (r->pc <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == first)
		return NULL;
	idx = lo - 1;
	return bpf_map_lookup_elem(&unwind_rows, &idx);
}

/* Frame-pointer step. Returns 0 to go on, 1 when the walk ends. */
static __always_inline int fp_step(struct unwind_state *s)
{
	__u64 rec[2];

	if (s->fp == 0)
		return 1; /* end of the frame pointer chain */
	/* No "FP above SP" check: Go's systemstack and cgo switch stacks, and
	 * the frame pointer chain is what crosses back. A chain that loops on
	 * itself ends here; a longer loop ends at the depth limit. */
	if (bpf_probe_read_user(rec, sizeof(rec), (void *)s->fp)) {
		set_reason(s, STOP_READ_FAULT);
		return 1;
	}
	if (rec[1] == 0)
		return 1;
	if (rec[0] == s->fp) {
		set_reason(s, STOP_BAD_FRAME);
		return 1;
	}
	s->sp = s->fp + FP_STEP_SP;
	s->sp_unknown = !FP_STEP_SP_EXACT;
	s->fp = rec[0];
	s->pc = arch_strip_ra(rec[1]);
	s->pc_exact = 0;
	s->trusted = 0;
	return 0;
}

/* Frame pointers nothing vouches for must look like a frame record: at
 * most 16 bytes below SP (Go on arm64 keeps x29 at SP-8), within a stack's
 * reach above it, aligned. */
#define MAX_FP_SPAN (8u << 20)

/* An FP step through code nothing vouches for: the process or its file's
 * table not loaded yet (a new process's first samples), a PC in no known
 * mapping, a file without a table. In code built without frame pointers
 * the FP register holds data, and following it made up a caller: a leaf
 * "called" from 0x23111b55. So the step is taken only if FP looks like a
 * frame record, the return address follows a call instruction and, once
 * the process's mappings are known, lies in one of them; otherwise the
 * walk ends here. Either way the stack is marked with the reason. */
static __always_inline int untrusted_fp_step_in(struct unwind_state *s, bool check_mapping)
{
	if (s->fp + 16 < s->sp || s->fp > s->sp + MAX_FP_SPAN || (s->fp & 7))
		return 1;
	if (fp_step(s))
		return 1;
	if (check_mapping && s->have_proc && !find_mapping(s, s->pc - 1))
		return 1;
	return !arch_ra_after_call(s->pc);
}

static __always_inline int untrusted_fp_step(struct unwind_state *s)
{
	return untrusted_fp_step_in(s, true);
}

/* Code the walker cannot follow yet: the process or the file's table not
 * loaded (NOT_READY), or a PC in no mapping of the snapshot userspace
 * loaded (UNKNOWN_MAPPING: one taken before the loader mapped libc, or a
 * dlopen since; signal_remap asks for another). A CPU sample whose stack
 * is exact so far has its stack copied instead (native_step tail-calls
 * WALK_COPY), for userspace to walk once it has loaded what was missing;
 * otherwise a checked FP step. budget: at most STACK_COPIES_PER_PROC such
 * samples per process image copy (the count lives in seen), for what may
 * never be loaded (a process filtered out or without room, a mapping
 * beyond the per-process limit). Tables pending for a loaded process are
 * being built: every sample copies until they are (a cold agent in an
 * emulated VM takes seconds for libc's). Returns 1 when the walk stops
 * here, as unwind_frame. */
static __always_inline int not_ready_step(struct unwind_state *s, __u32 reason, bool budget)
{
	__u8 *n = NULL;

	if (stack_copy_bytes && s->origin == ORIGIN_CPU && !s->copy_tried && s->stack.reason == STOP_OK) {
		s->copy_tried = 1;
		if (budget)
			n = bpf_map_lookup_elem(&seen, &s->tgid);
		if (!budget || (n && *n <= STACK_COPIES_PER_PROC)) {
			if (n)
				*n += 1;
			s->want_copy = 1;
			set_reason(s, reason);
			return 1;
		}
	}
	set_reason(s, reason);
	return untrusted_fp_step(s);
}

/* An FP step where frame pointers are expected (JIT, fallback rows). */
static __always_inline int expected_fp_step(struct unwind_state *s)
{
	int r = fp_step(s);
	s->trusted = 1;
	return r;
}

static __always_inline void signal_remap(struct unwind_state *s, struct stats *st)
{
	struct unwind_proc *p;
	__u64 now;

	/* A PC reached through frame pointers in code that keeps none is
	 * garbage more often than a new mapping: asking would reread
	 * /proc/PID/maps every second for such processes. */
	if (s->remapped || !s->trusted)
		return;
	s->remapped = 1;
	p = bpf_map_lookup_elem(&unwind_procs, &s->tgid);
	if (!p)
		return;
	now = bpf_ktime_get_boot_ns();
	/* At most one reread of /proc/PID/maps per process and second. */
	if (now - p->remap_ns < 1000000000ull)
		return;
	p->remap_ns = now;
	emit_event(st, s->tgid, PROC_REMAP, 1);
}

/* One frame: find the caller of s->pc. Returns 0 to go on, 1 when done. */
static __always_inline int unwind_frame(struct unwind_state *s, struct stats *st)
{
	struct unwind_mapping *m;
	struct unwind_table *t;
	struct unwind_row *r;
	__u64 pc = s->pc, lookup = s->pc_exact ? pc : pc - 1, cfa, off, v, slot_addr;
	__u32 slot, kind, rule, code, innermost = s->regs_valid;

	s->regs_valid = 0; /* the caller's registers are not known */

	if (!s->have_proc)
		return not_ready_step(s, STOP_NOT_READY, true);
	m = find_mapping(s, lookup);
	if (!m) {
		signal_remap(s, st);
		return not_ready_step(s, STOP_UNKNOWN_MAPPING, true);
	}
	slot = m->table;
	off = lookup - m->bias;
	if (slot == TABLE_VDSO && arch_vdso_sigreturn(pc))
		goto signal;
	if (slot == TABLE_FP || slot == TABLE_VDSO) {
		/* JIT or anonymous code: if frame pointers lead nowhere the
		 * stack is cut short, not whole; that it ended in such code
		 * says more than the failed read (JIT code keeps no frame
		 * pointer in rbp). */
		__u32 before = s->stack.reason;
		if (expected_fp_step(s)) {
			if (before == STOP_OK)
				s->stack.reason = STOP_JIT;
			return 1;
		}
		return 0;
	}
	t = bpf_map_lookup_elem(&unwind_tables, &slot);
	if (t && t->state == TABLE_LAZY) {
		/* Tables are built for sampled files only. A race sends two
		 * events; userspace builds once. */
		t->state = TABLE_PENDING;
		emit_event(st, slot, PROC_TABLE, 0);
	}
	if (t && t->state == TABLE_PENDING)
		return not_ready_step(s, STOP_NOT_READY, false);
	if (!t || t->state != TABLE_READY) {
		set_reason(s, STOP_NO_TABLE);
		return untrusted_fp_step(s);
	}
	off -= t->base;
	if (off >> 32) {
		set_reason(s, STOP_NO_TABLE);
		return untrusted_fp_step(s);
	}
	r = find_row(t, (__u32)off);
	if (!r) {
		set_reason(s, STOP_NO_TABLE);
		return untrusted_fp_step(s);
	}
	kind = r->info & 3;
	rule = (r->info >> 2) & 3;
	switch (kind) {
	case ROW_END:
		return 1;
	case ROW_FALLBACK:
		return expected_fp_step(s);
	case ROW_SIGNAL:
		goto signal;
	}
	code = r->info >> ROW_REG_SHIFT;
	if (s->sp_unknown && rule != CFA_FP) {
		/* After an FP step that could not tell SP (arm64: the frame
		 * record can sit anywhere in a frame), only FP rules apply; but
		 * a row that saved FP at cfa + fp_off * 8 had FP point there
		 * (the frame record), which gives the CFA exactly: a frame
		 * past the vDSO (frame pointers only) keeps its SP for the
		 * runtime walkers and SP rules below it. */
		if (rule != CFA_SP || code || !(r->info & ROW_FP_SAVED))
			return expected_fp_step(s);
		cfa = s->fp - (__s64)r->fp_off * 8;
		goto have_cfa;
	}
	switch (rule) {
	case CFA_SP:
	case CFA_FP:
		cfa = rule == CFA_SP ? s->sp : s->fp;
		if (code) {
			if (bpf_probe_read_user(&v, sizeof(v), (void *)(cfa + (__s64)(__s16)r->cfa_off))) {
				set_reason(s, STOP_READ_FAULT);
				return 1;
			}
			cfa = v + (__u64)code * 8;
		} else {
			cfa += r->cfa_off;
		}
		break;
	case CFA_PLT:
		cfa = s->sp + 8 + ((pc & 15) >= 11 ? 8 : 0);
		break;
	default:
		if (!code)
			return fp_step(s);
		if (!innermost)
			return expected_fp_step(s);
		if (innermost == REGS_USER) {
			cfa = s->regs[code & (CFA_REGS - 1)] + r->cfa_off;
			break;
		}
		if (code == CFA_REG_RAX || code == CFA_REG_R11) {
			/* Entered by `syscall` (0f 05, just before the PC)? It
			 * returns its result in rax and clobbers r11. */
			__u16 insn = 0;
			if (bpf_probe_read_user(&insn, sizeof(insn), (void *)(pc - 2)) || insn == 0x050f)
				return expected_fp_step(s);
		}
		cfa = arch_entry_reg(s, code) + r->cfa_off;
	}
have_cfa:
	/* A table row that leads nowhere: the mapping may be stale (munmap and
	 * a new file at the same address); have the maps reread. CFA == SP is
	 * a frame that has not moved SP and keeps its RA in a register. */
	slot_addr = arch_ra_slot(r, cfa);
	if (cfa < s->sp || (cfa == s->sp && slot_addr)) {
		set_reason(s, STOP_BAD_FRAME);
		signal_remap(s, st);
		return 1;
	}
	if (!slot_addr) {
		/* RA in the link register: known for the innermost frame. */
		if (!innermost)
			return expected_fp_step(s);
		v = innermost == REGS_USER ? s->regs[1] : arch_entry_reg(s, 1);
	} else if (bpf_probe_read_user(&v, sizeof(v), (void *)slot_addr)) {
		set_reason(s, STOP_READ_FAULT);
		signal_remap(s, st);
		return 1;
	}
	v = arch_strip_ra(v);
	if (r->info & ROW_FP_SAVED) {
		__u64 fp;
		if (bpf_probe_read_user(&fp, sizeof(fp), (void *)(cfa + (__s64)r->fp_off * 8))) {
			set_reason(s, STOP_READ_FAULT);
			return 1;
		}
		s->fp = fp;
	}
	if (v == 0)
		return 1; /* undefined RA: outermost frame */
	s->sp = cfa;
	s->sp_unknown = 0;
	s->pc = v;
	s->pc_exact = 0;
	s->trusted = 1;
	return 0;
signal:
	if (arch_signal_frame(s))
		return 1;
	s->sp_unknown = 0;
	s->pc_exact = 1;
	s->trusted = 1;
	return 0;
}

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0x100000001b3ull; /* FNV-1a prime, per 64-bit word */
	h ^= h >> 29;
	return h;
}

#endif /* PROFSYM_UNWIND_H */
