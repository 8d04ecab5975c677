/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * V8 (Node.js): JavaScript frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker (walk.h) hands this walker every PC in V8's code: the
 * embedded builtins (in node or libnode, and the copy V8 maps into each
 * isolate's code range) and the JIT code in those ranges. V8 keeps a frame pointer in
 * every frame it makes, so each is found from s->fp:
 *   fp + 8   the caller's PC          fp + 0  the caller's fp
 *   fp - 8   a context (tagged: a JavaScript frame) or a frame type marker
 *            (type << 1, untagged: entry, exit, stub, internal frames)
 *   fp - 16  the JSFunction (JavaScript frames)
 *   fp - 32  the BytecodeArray, fp - 40 the bytecode offset as a Smi
 *            (interpreted frames; baseline frames keep the feedback
 *            vector, a heap object, in the offset's slot)
 * (offsets from V8's v8dbg_off_fp_* tables, passed by the host.) A frame
 * with a marker pushes nothing: builtins and stubs between JavaScript
 * frames are V8's plumbing. A JavaScript frame pushes
 *   FRAME_V8_INTERP: ptr = the SharedFunctionInfo, aux = the bytecode
 *                    offset (low 32 bits, from the tagged BytecodeArray) |
 *                    the BytecodeArray's low 32 bits << 32, so that the host
 *                    can tell whether the SFI still has that bytecode;
 *   FRAME_V8_OPT:    ptr = the Code object (Maglev, TurboFan) the function
 *                    runs, aux = the PC's offset in it | the SFI's low 32
 *                    bits << 32 (the host reads the source positions and
 *                    the inlined functions from the code object);
 *   FRAME_V8_JIT:    ptr = the SharedFunctionInfo, aux = the frame's PC:
 *                    other JIT code (baseline, code replaced on the stack,
 *                    code the function no longer has), named by function.
 * JSFunctions are not recorded: young ones move at every scavenge, before
 * the host names them; SFIs and code objects live in the old generation.
 * A frame is interpreted when its PC is in the builtins (the interpreter's
 * trampoline and bytecode handlers run in the interpreted frame) and its
 * slots hold a heap object and a Smi; a JIT frame's slots there are spill
 * slots, which may look alike, so the PC decides.
 * Then the walker steps to the caller by the frame pointer; a caller
 * outside V8's code (C++ that called into JavaScript) goes back to the
 * native walker. A frame that fails a check ends the V8 walk with
 * STOP_RUNTIME: the native walker takes that PC and the rest.
 */
#ifndef PROFSYM_V8_H
#define PROFSYM_V8_H

/* Frame kinds of V8's block (runtime.h). */
enum v8_frame_kind {
	FRAME_V8_INTERP = FRAME_V8_FIRST, /* see above */
	FRAME_V8_JIT = FRAME_V8_FIRST + 1,
	FRAME_V8_OPT = FRAME_V8_FIRST + 2,
};

enum v8_limits {
	V8_FRAMES_PER_PROG = 8, /* V8 frames per run (a small loop for older verifiers) */
	V8_FRAME_READ = 64,      /* bytes read around fp: [fp - 48, fp + 16) */
	V8_FRAME_BELOW = 48,     /* ... of which below fp */
	V8_MAX_FRAME = 1 << 20,  /* a caller's fp at most this far above */
	V8_MAX_PROCS = 4096,
	V8_MAX_BYTECODE = 1 << 24, /* an interpreted frame's bytecode offset is below */
	V8_CALLER_WORDS = 4,       /* stack words searched for a frameless builtin's caller */
};

/* The runtime ranges (unwind_proc.rt) from this one on are spans of V8's
 * JIT code; the one before is the file's own builtins. */
#define V8_CODE_RANGE 1

/* The embedded builtins and up to seven copies: V8 maps a copy into each
 * isolate's code range (short builtin calls), and each worker thread runs
 * an isolate of its own. */
#define V8_BLOBS 8

/* Why a V8 walk ended early (v8_counters.errors). */
enum v8_error {
	V8_ERR_NOT_ATTACHED = 0, /* no v8_procs entry (yet) */
	V8_ERR_REFUSED = 1,      /* the host refused this V8 */
	V8_ERR_READ_FRAME = 2,   /* the frame around fp unreadable */
	V8_ERR_BAD_FP = 3,       /* fp misaligned, or a caller's fp not above it */
	V8_ERR_NOT_FUNCTION = 4, /* a JavaScript frame's function slot holds no heap object */
	V8_ERR_READ_SFI = 5,     /* the function's SharedFunctionInfo unreadable */
	V8_ERRORS = 6,
};

/* Per process, written by the host at attach. Frame offsets are bytes
 * from fp (negative below it), object offsets from the tagged pointer's
 * object start. */
struct v8_proc {
	struct rt_range blob[V8_BLOBS]; /* the embedded builtins, then the isolates' copies (unused: 0, 0) */
	__s16 fp_context;       /* v8dbg_off_fp_context */
	__s16 fp_function;      /* v8dbg_off_fp_function */
	__s16 fp_bytecode;      /* v8dbg_off_fp_bytecode_array */
	__s16 fp_bytecode_off;  /* v8dbg_off_fp_bytecode_offset */
	__u16 fn_shared;        /* JSFunction::shared */
	__u16 map_type;         /* Map::instance_type */
	__u16 fn_code;          /* JSFunction::code */
	__u16 code_start;       /* Code::instruction_start; flags, size follow at */
	__u16 code_flags;       /*   code_flags, code_size (low 4 bits of flags: the kind) */
	__u16 code_size;
	__u16 kind_maglev;      /* optimized code kinds */
	__u16 kind_turbofan;
	__u16 type_sfi;         /* SHARED_FUNCTION_INFO_TYPE */
	__u8 smi_shift;         /* a Smi's value is word >> smi_shift (32, or 1) */
	__u8 ready;             /* 0: refused (stacks stay native) */
};

struct v8_counters {
	__u64 walks;  /* runs of the walker */
	__u64 frames; /* JavaScript frames pushed */
	__u64 typed;  /* frames with a marker stepped over */
	__u64 not_js; /* frames with a context whose function is none (pushed native) */
	__u64 errors[V8_ERRORS];
};

struct v8_bufs {
	__u8 frame[V8_FRAME_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, V8_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct v8_proc);
} v8_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct v8_bufs);
} v8_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct v8_counters);
} v8_stats SEC(".maps");

/* The word at fp + off (off a multiple of 8 in [-V8_FRAME_BELOW, 8]) of
 * the frame buffer; 0 for an offset outside it. */
static __always_inline __u64 v8_slot(struct v8_bufs *b, __s32 off)
{
	__s32 i = off + V8_FRAME_BELOW;

	if (i < 0 || i > V8_FRAME_READ - 8 || (i & 7))
		return 0;
	return *(__u64 *)(b->frame + (i & (V8_FRAME_READ - 8)));
}

/* The word at byte off (a multiple of 8 below 24, as the host checks)
 * of a buffer of 4 words. */
#define V8_WORD(w, off) ((w)[((off) >> 3) & 3])

/* Whether sfi is a tagged pointer to a SharedFunctionInfo: its map's
 * instance type says so. */
static __always_inline int v8_is_sfi(struct v8_proc *p, __u64 sfi)
{
	__u64 map = 0;
	__u16 type = 0;

	if ((sfi & 3) != 1 || bpf_probe_read_user(&map, sizeof(map), (void *)(sfi - 1)) || (map & 3) != 1 ||
	    bpf_probe_read_user(&type, sizeof(type), (void *)(map - 1 + p->map_type)))
		return 0;
	return type == p->type_sfi;
}

/* The optimized code object fn runs at pc, with *off = pc's offset in
 * it; 0 when fn's code is no optimized code holding pc. */
static __always_inline __u64 v8_code(struct v8_proc *p, __u64 fn, __u64 pc, __u64 *off)
{
	__u64 code = 0, w[4] = {}, start, size, kind;

	if (bpf_probe_read_user(&code, sizeof(code), (void *)(fn - 1 + p->fn_code)) || (code & 3) != 1 ||
	    bpf_probe_read_user(w, 24, (void *)(code - 1 + p->code_start)))
		return 0;
	start = w[0];
	kind = (__u32)V8_WORD(w, p->code_flags - p->code_start) & 15;
	size = (__u32)V8_WORD(w, p->code_size - p->code_start);
	if (pc < start || pc - start >= size || (kind != p->kind_maglev && kind != p->kind_turbofan))
		return 0;
	*off = pc - start;
	return code;
}

static __always_inline int v8_in_blob(struct v8_proc *p, __u64 pc)
{
	for (int i = 0; i < V8_BLOBS; i++) {
		if (pc >= p->blob[i].lo && pc < p->blob[i].hi)
			return 1;
	}
	return 0;
}

/* Whether pc is in one of V8's JIT code spans (its copies of the builtins
 * included). */
static __always_inline int v8_in_spans(struct unwind_state *s, __u64 pc)
{
	for (int i = V8_CODE_RANGE; i < RT_RANGES; i++) {
		if (pc >= s->rt[i].lo && pc < s->rt[i].hi)
			return 1;
	}
	return 0;
}

/* A leaf in a builtin that JIT code called without a frame of its own
 * (Builtins_ModulusSmi_Baseline): the JIT code's return address is one of
 * the first words on the stack; the first in JIT code (V8's code spans,
 * not the builtins) is taken, else pc. The host checks it against the
 * function's code. */
static __always_inline __u64 v8_builtin_caller(struct v8_proc *p, struct unwind_state *s, __u64 pc)
{
	__u64 w[V8_CALLER_WORDS] = {};

	if (bpf_probe_read_user(w, sizeof(w), (void *)s->sp))
		return pc;
	for (int i = 0; i < V8_CALLER_WORDS; i++) {
		if (v8_in_spans(s, w[i]) && !v8_in_blob(p, w[i]))
			return w[i] - 1;
	}
	return pc;
}

/* Pushes s->pc as a native frame. Returns 1 when the stack is full. */
static __always_inline int v8_push_pc(struct unwind_state *s)
{
	__u32 n = s->stack.len;

	if (s->pc & ~RT_PTR_MASK)
		return 0;
	if (n >= s->max_frames || n >= MAX_USER_FRAMES) {
		set_reason(s, STOP_DEPTH);
		return 1;
	}
	s->stack.pcs[n & (MAX_USER_FRAMES - 1)] = s->pc | (n && s->pc_exact ? PC_EXACT : 0);
	s->stack.len = n + 1;
	s->hash = mix(s->hash, s->pc);
	return 0;
}

/* Asks the host to attach (again) to a process it has no entry for: its
 * V8 was not set up when the host looked (at most every 100 ms). */
static __always_inline void v8_ask_attach(struct unwind_state *s, struct stats *st)
{
	struct unwind_proc *up = bpf_map_lookup_elem(&unwind_procs, &s->tgid);
	__u64 now;

	if (!up)
		return;
	now = bpf_ktime_get_boot_ns();
	if (now - up->remap_ns < 100000000ull)
		return;
	up->remap_ns = now;
	emit_event(st, s->tgid, PROC_REMAP, 1);
}

static __always_inline int v8_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, slot = s->slot, err = V8_ERR_NOT_ATTACHED, kind;
	struct v8_proc *p = bpf_map_lookup_elem(&v8_procs, &s->tgid);
	struct v8_bufs *b = bpf_map_lookup_elem(&v8_scratch, &slot);
	struct v8_counters *cs = bpf_map_lookup_elem(&v8_stats, &zero);
	__u64 fp, next_fp, ret, marker, fn, sfi, ba, bo, aux, pc, code;
	__s64 off;
	__u64 tagmask = 1;

	if (!b || !cs)
		goto fail;
	if (!p) {
		v8_ask_attach(s, st);
		goto fail;
	}
	err = V8_ERR_REFUSED;
	if (!p->ready || p->smi_shift == 0 || p->smi_shift > 32)
		goto fail;
	if (V8_CODE_RANGE >= RT_RANGES)
		goto fail;
	cs->walks++;
	for (int i = 0; i < V8_FRAMES_PER_PROG; i++) {
		if (runtime_of(s, s->pc_exact ? s->pc : s->pc - 1) != RUNTIME_V8)
			goto back; /* C++ that called JavaScript: native frames */
		fp = s->fp;
		err = V8_ERR_BAD_FP;
		if (fp < V8_FRAME_BELOW || (fp & 7))
			goto fail;
		err = V8_ERR_READ_FRAME;
		if (bpf_probe_read_user(b->frame, V8_FRAME_READ, (void *)(fp - V8_FRAME_BELOW)))
			goto fail;
		next_fp = v8_slot(b, 0);
		ret = v8_slot(b, 8);
		err = V8_ERR_BAD_FP;
		if (next_fp <= fp || next_fp - fp > V8_MAX_FRAME)
			goto fail;
		marker = v8_slot(b, p->fp_context);
		if (marker & tagmask) {
			/* A context: a JavaScript frame. */
			fn = v8_slot(b, p->fp_function);
			err = V8_ERR_NOT_FUNCTION;
			if (!(fn & tagmask) || fn < 4096)
				goto fail;
			err = V8_ERR_READ_SFI;
			if (bpf_probe_read_user(&sfi, sizeof(sfi), (void *)(fn - 1 + p->fn_shared)))
				goto fail;
			if (!v8_is_sfi(p, sfi)) {
				/* Not a JavaScript frame after all (irregexp code
				 * keeps other values there): its PC, as the native
				 * walker would push it. */
				cs->not_js++;
				if (v8_push_pc(s))
					return finish_walk(s, st);
				goto step;
			}
			ba = v8_slot(b, p->fp_bytecode);
			bo = v8_slot(b, p->fp_bytecode_off);
			off = (__s64)bo >> p->smi_shift;
			pc = s->pc_exact ? s->pc : s->pc - 1;
			if ((ba & tagmask) && !(bo & tagmask) && off >= 0 && off < V8_MAX_BYTECODE && v8_in_blob(p, pc)) {
				kind = FRAME_V8_INTERP;
				aux = (__u32)off | (ba << 32);
			} else {
				kind = FRAME_V8_JIT;
				if (s->pc_exact && v8_in_blob(p, pc))
					pc = v8_builtin_caller(p, s, pc);
				aux = pc;
				code = v8_code(p, fn, pc, &aux);
				if (code) {
					kind = FRAME_V8_OPT;
					aux |= sfi << 32;
					sfi = code;
				}
			}
			if (push_runtime_frame(s, kind, sfi, aux))
				return finish_walk(s, st);
			cs->frames++;
		} else {
			cs->typed++;
		}
step:
		s->pc = ret;
		s->sp = fp + 16;
		s->fp = next_fp;
		s->pc_exact = 0;
		s->regs_valid = 0;
		s->trusted = 1;
		s->sp_unknown = 0;
		if (s->pc == 0)
			return finish_walk(s, st);
	}
	/* More V8 frames: another run of this walker. */
	if (walk_tail_call(ctx, s, st, progs, WALK_V8)) {
		set_reason(s, STOP_DEPTH);
		return finish_walk(s, st);
	}
	err = V8_ERR_READ_FRAME;
fail:
	if (cs && err < V8_ERRORS)
		cs->errors[err]++;
	/* The rest of the stack keeps its native frames. */
	set_reason(s, STOP_RUNTIME);
	s->rt_kind = RUNTIME_NONE;
back:
	return walk_native(ctx, s, st, progs);
}

WALK_PROGRAM("perf_event", v8_step, unwind_progs, v8_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct v8_bufs *unused_v8_bufs __attribute__((unused));
enum v8_frame_kind *unused_v8_frame_kind __attribute__((unused));
enum v8_limits *unused_v8_limits __attribute__((unused));
enum v8_error *unused_v8_error __attribute__((unused));

#endif /* PROFSYM_V8_H */
