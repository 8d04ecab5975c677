/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * HotSpot (Java) frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker hands a PC in a JVM's code cache to hotspot_walk,
 * which walks the frames there the way HotSpot itself does:
 *
 *   interpreter    frame pointer chain; Method* and the bytecode pointer
 *                  sit in fixed slots below the frame pointer (r13 holds
 *                  the live bytecode pointer of the innermost frame)
 *   nmethod        compiled code keeps no frame pointer: the caller's SP is
 *                  SP + the nmethod's frame size, the return address and
 *                  the caller's saved rbp just below it (C1, C2 and the
 *                  wrappers of native methods alike)
 *   stubs          frame size when the blob has one, else the frame
 *                  pointer (the call stub, most StubRoutines), or only a
 *                  return address (vtable and itable stubs)
 *
 * A PC is mapped to its CodeBlob through the code heap's segment map, as
 * HotSpot's CodeHeap::find_start does. Everything the walker needs from
 * the JVM's own layout (field offsets, the heaps) comes from userspace
 * (internal/host/runtimes/hotspot), which reads libjvm's gHotSpotVM*
 * tables. Frames are pushed as (pointer, aux) pairs and named there:
 *
 *   FRAME_HS_INTERPRETED  Method*,   bci | (ConstMethod* >> 3) << 32
 *   FRAME_HS_COMPILED     nmethod*,  pc offset | HS_PC_LEAF | compile id << 32
 *   FRAME_HS_STUB         CodeBlob*, pc offset from the blob's code
 *
 * The high words let userspace check that what a pointer points at is
 * still what was sampled (methods are freed when classes unload, nmethods
 * when the code cache is flushed).
 */
#ifndef PROFSYM_HOTSPOT_H
#define PROFSYM_HOTSPOT_H

enum hotspot_frame_kind {
	FRAME_HS_INTERPRETED = FRAME_HOTSPOT_FIRST,
	FRAME_HS_COMPILED = FRAME_HOTSPOT_FIRST + 1,
	FRAME_HS_STUB = FRAME_HOTSPOT_FIRST + 2,
};

enum hotspot_limits {
	HS_HEAPS = 4,            /* code heaps: non-nmethods, profiled, non-profiled */
	HS_FRAMES_PER_PROG = 5,  /* Java frames per program run */
	HS_SEGMAP_STEPS = 24,    /* blobs up to 24 * 254 segments (390 KB of 64-byte segments) */
	HS_BLOB_BYTES = 512,     /* the part of a CodeBlob read at once (nmethod fields included) */
	HS_RA_SLOTS = 4,         /* words searched above an innermost compiled frame */
	HS_MAX_FRAME = 1 << 20,  /* bytes: larger frames are taken for garbage */
	HS_BCI_NONE = 0xffff,    /* no bytecode index (native methods, a stale bcp) */
	HS_PC_LEAF = 1u << 31,   /* aux of a compiled frame: the PC was interrupted, not a return address */
};

/* Why a walk in the code cache gave up (hotspot_errors slots). */
enum hotspot_error {
	HS_ERR_NO_PROC = 0,     /* no hotspot_procs entry: the JVM cannot be walked */
	HS_ERR_NO_BLOB = 1,     /* PC in no code heap, or on a free or unmarked segment */
	HS_ERR_BLOB_READ = 2,   /* the CodeBlob could not be read or is not the PC's */
	HS_ERR_INTERP = 3,      /* an interpreter frame failed its checks */
	HS_ERR_RA = 4,          /* no return address where a compiled frame keeps it */
	HS_ERR_STUB = 5,        /* a stub frame that could not be stepped */
	HS_ERRORS = 6,
	HS_ERR_SLOTS = 8,
};

/* How this JDK lays out a CodeBlob (from its tables). */
enum hotspot_flags {
	HS_CODE_OFFSETS = 1, /* code begin and deopt handler are int offsets from the blob (8, 23+), not pointers */
	HS_COMPLETE_16 = 2,  /* _frame_complete_offset is an int16_t (23+), not an int */
};

struct hotspot_heap {
	__u64 lo, hi; /* the heap's reserved memory */
	__u64 segmap; /* its segment map: one byte per segment */
};

/* Per JVM process (hotspot_procs), written by userspace. Offsets are in
 * bytes; interpreter slots are relative to the frame pointer. */
struct hotspot_proc {
	struct hotspot_heap heaps[HS_HEAPS];
	__u64 code_lo, code_hi;     /* the whole code cache */
	__u64 interp_lo, interp_hi; /* the template interpreter's code */
	__u64 call_stub_ret;        /* StubRoutines::_call_stub_return_address */
	__u32 nheaps;
	__u32 seg_shift;            /* log2 of the segment size */
	__u16 blob_name, blob_size, blob_code_begin, blob_frame_complete, blob_frame_size;
	__u16 nm_compile_id, nm_orig_pc, nm_deopt;
	__u16 method_const, cm_size, cm_code_size;
	__u16 heap_block;           /* HeapBlock header before each blob */
	__u16 blob_bytes;           /* the part of a blob holding the fields above, <= HS_BLOB_BYTES */
	__s16 if_sender_sp, if_method, if_bcp;
	__u16 broken; /* a JVM profsym cannot walk: its stacks say runtime */
	__u16 flags;  /* enum hotspot_flags */
	__u16 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct hotspot_proc);
} hotspot_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[HS_ERR_SLOTS]);
} hotspot_errors SEC(".maps");

struct hotspot_blob {
	__u8 b[HS_BLOB_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct hotspot_blob);
} hotspot_scratch SEC(".maps");

/* First four bytes of CodeBlob::_name, little-endian, of the blob kinds
 * walked differently from plain stubs. */
#define HS_NAME_NMETHOD 0x74656d6e /* "nmethod" */
#define HS_NAME_NATIVE 0x6974616e  /* "native nmethod" */
#define HS_NAME_VTABLE 0x62617476  /* "vtable chunks" (vtable and itable stubs) */
#define HS_NAME_INTERP 0x65746e49  /* "Interpreter" */

/* What differs between the architectures: where the interpreter keeps the
 * bytecode pointer while it runs (x86-64 r13, arm64 x22: the
 * templateInterpreterGenerator of each), what a ret is, and where a frame
 * not set up keeps its return address (on the stack on x86-64, in the link
 * register on arm64). The frame layouts match: a compiled frame's size
 * covers the saved frame pointer and return address at its top, an
 * interpreted or stub frame links through [fp, ra] at its frame pointer.
 * Every return address read from a frame goes through arch_strip_ra: with
 * -XX:UseBranchProtection (arm64) the JVM signs the ones it saves. */
#define HS_WALKS 1

static __always_inline int hs_in_code(struct hotspot_proc *p, __u64 pc)
{
	return pc >= p->code_lo && pc < p->code_hi;
}

#if defined(__TARGET_ARCH_x86)
/* The live bytecode pointer saved on kernel entry. */
static __always_inline __u64 hs_entry_bcp(struct unwind_state *s)
{
	struct pt_regs *regs = (struct pt_regs *)s->entry_regs;

	return BPF_CORE_READ(regs, r13);
}

static __always_inline int hs_at_ret(__u64 pc)
{
	__u8 insn = 0;

	return !bpf_probe_read_user(&insn, 1, (void *)pc) && insn == 0xc3;
}

/* The caller of the innermost frame of a blob whose frame is not (or no
 * longer) set up: the return address is at SP, or at SP+8 above the saved
 * rbp. Returns 0 when neither is a code cache address. */
static __always_inline int hs_bare_return(struct hotspot_proc *p, struct unwind_state *s)
{
	__u64 w[2];

	if (bpf_probe_read_user(w, sizeof(w), (void *)s->sp))
		return 1;
	if (hs_in_code(p, w[0])) {
		s->pc = w[0];
		s->sp += 8;
		return 0;
	}
	if (hs_in_code(p, w[1])) {
		s->fp = w[0];
		s->pc = w[1];
		s->sp += 16;
		return 0;
	}
	return 1;
}
#else
static __always_inline __u64 hs_entry_bcp(struct unwind_state *s)
{
	struct pt_regs *regs = (struct pt_regs *)s->entry_regs;

	return BPF_CORE_READ(regs, regs[22]);
}

static __always_inline int hs_at_ret(__u64 pc)
{
	__u32 insn = 0;

	return !bpf_probe_read_user(&insn, sizeof(insn), (void *)pc) && insn == 0xd65f03c0; /* ret x30 */
}

/* The caller of the innermost frame of a blob whose frame is not (or no
 * longer) set up: the return address is still in the link register, known
 * only for the sample's own frame. SP and FP are the caller's already. */
static __always_inline int hs_bare_return(struct hotspot_proc *p, struct unwind_state *s)
{
	__u64 lr;

	if (s->regs_valid == REGS_USER)
		lr = s->regs[1];
	else if (s->regs_valid == REGS_ENTRY)
		lr = arch_entry_reg(s, 1);
	else
		return 1;
	lr = arch_strip_ra(lr);
	if (!hs_in_code(p, lr))
		return 1;
	s->pc = lr;
	return 0;
}
#endif

static __always_inline void hs_error(__u32 e)
{
	__u32 zero = 0;
	__u64 *c = bpf_map_lookup_elem(&hotspot_errors, &zero);

	if (c)
		c[e & (HS_ERR_SLOTS - 1)]++;
}

static __always_inline __u64 hs_field(struct hotspot_blob *b, __u32 off)
{
	if (off > HS_BLOB_BYTES - 8)
		return 0;
	return *(__u64 *)&b->b[off];
}

/* The CodeBlob holding pc, through its heap's segment map: each segment's
 * byte says how many segments back to go, 0 at a block's first segment,
 * 0xff on free segments. Returns 0 when none. */
static __always_inline __u64 hs_find_blob(struct hotspot_proc *p, __u64 pc)
{
	__u32 shift = p->seg_shift & 31;
	__u64 lo = 0, segmap = 0, seg;
	__u8 tag;

	for (int i = 0; i < HS_HEAPS; i++) {
		if (i < p->nheaps && pc >= p->heaps[i].lo && pc < p->heaps[i].hi) {
			lo = p->heaps[i].lo;
			segmap = p->heaps[i].segmap;
			break;
		}
	}
	if (!lo)
		return 0;
	seg = (pc - lo) >> shift;
	for (int i = 0; i < HS_SEGMAP_STEPS; i++) {
		if (bpf_probe_read_user(&tag, sizeof(tag), (void *)(segmap + seg)))
			return 0;
		if (tag == 0)
			return lo + (seg << shift) + p->heap_block;
		if (tag == 0xff || tag > seg)
			return 0;
		seg -= tag;
	}
	return 0;
}

/* Steps a frame that keeps rbp: the return address above the saved rbp.
 * Any return address is accepted when any_ra (the call stub returns to
 * libjvm); otherwise it must be in the code cache. */
static __always_inline int hs_fp_step(struct hotspot_proc *p, struct unwind_state *s, int any_ra)
{
	__u64 rec[2];

	if (s->fp < s->sp || s->fp - s->sp > HS_MAX_FRAME)
		return 1;
	if (bpf_probe_read_user(rec, sizeof(rec), (void *)s->fp))
		return 1;
	rec[1] = arch_strip_ra(rec[1]);
	if (!any_ra && !hs_in_code(p, rec[1]))
		return 1;
	s->sp = s->fp + 16;
	s->fp = rec[0];
	s->pc = rec[1];
	return 0;
}

/* What a frame's step did. */
enum {
	HS_NEXT = 0,    /* a frame pushed, the state at its caller */
	HS_UNKNOWN = 1, /* the PC's frame is not one it understands: state untouched */
	HS_FULL = 2,    /* the stack is full (reason set) */
	HS_STUCK = 3,   /* a frame pushed, but its caller not found */
};

/* An interpreted frame: Method* and bcp in their slots below rbp. */
static __always_inline int hs_interpreted(struct hotspot_proc *p, struct unwind_state *s, int leaf)
{
	__u64 method, cm, bcp = 0, bci = HS_BCI_NONE, start, rec[2], sender_sp;
	__u16 code_size = 0;

	if (s->fp <= s->sp || s->fp - s->sp > HS_MAX_FRAME || (s->fp & 7))
		return HS_UNKNOWN;
	if (bpf_probe_read_user(&method, sizeof(method), (void *)(s->fp + p->if_method)) ||
	    bpf_probe_read_user(&sender_sp, sizeof(sender_sp), (void *)(s->fp + p->if_sender_sp)) ||
	    bpf_probe_read_user(rec, sizeof(rec), (void *)s->fp))
		return HS_UNKNOWN;
	if (!method || (method & 7) ||
	    bpf_probe_read_user(&cm, sizeof(cm), (void *)(method + p->method_const)) ||
	    !cm || (cm & 7) ||
	    bpf_probe_read_user(&code_size, sizeof(code_size), (void *)(cm + p->cm_code_size)))
		return HS_UNKNOWN;
	/* The live bytecode pointer is in r13 while the innermost frame runs;
	 * the frame's slot holds it from the last call out. */
	start = cm + p->cm_size;
	if (leaf == REGS_USER)
		bcp = s->rt_reg;
	else if (leaf == REGS_ENTRY)
		bcp = hs_entry_bcp(s);
	if (bcp < start || bcp >= start + code_size) {
		if (bpf_probe_read_user(&bcp, sizeof(bcp), (void *)(s->fp + p->if_bcp)))
			bcp = 0;
	}
	if (bcp >= start && bcp < start + code_size)
		bci = bcp - start;
	if (push_runtime_frame(s, FRAME_HS_INTERPRETED, method, bci | (((cm >> 3) & 0xffffffffull) << 32)))
		return HS_FULL;
	s->pc = arch_strip_ra(rec[1]);
	s->fp = rec[0];
	s->sp = sender_sp;
	return HS_NEXT;
}

/* A compiled frame (nmethod, native wrapper): SP + frame size. */
static __always_inline int hs_compiled(struct hotspot_proc *p, struct unwind_state *s, struct hotspot_blob *b,
				       __u64 blob, __u64 code, __u64 fsize, __u32 complete)
{
	__u64 pc = s->pc, deopt = hs_field(b, p->nm_deopt), w[2], cfa, v;
	__u32 id = (__u32)hs_field(b, p->nm_compile_id), aux;
	__s32 orig = (__s32)hs_field(b, p->nm_orig_pc);

	if (p->flags & HS_CODE_OFFSETS)
		deopt = blob + (__u32)deopt;

	/* A frame being deoptimized returns to the deopt handler; the PC it
	 * had is saved in the frame. */
	if (!s->pc_exact && pc == deopt && orig > 0 && orig < HS_MAX_FRAME &&
	    !bpf_probe_read_user(&v, sizeof(v), (void *)(s->sp + orig)) && v >= code && v < deopt)
		pc = v;
	aux = (__u32)(pc - code) & ~HS_PC_LEAF;
	if (s->pc_exact)
		aux |= HS_PC_LEAF;
	if (push_runtime_frame(s, FRAME_HS_COMPILED, blob, aux | ((__u64)id << 32)))
		return HS_FULL;
	/* An interrupted PC (not a return address) may be in the prologue
	 * or the epilogue, where the frame is not all there. */
	if (s->pc_exact && pc < code + complete)
		return hs_bare_return(p, s) ? HS_STUCK : HS_NEXT;
	cfa = s->sp + fsize;
#if defined(__TARGET_ARCH_arm64)
	/* A call from C2 code into the VM's C code leaves a breadcrumb below
	 * the frame first (aarch64.ad: zr and the return address, for
	 * JavaFrameAnchor::capture_last_Java_pc): the frame is 16 bytes up. */
	if (!s->pc_exact && !bpf_probe_read_user(w, sizeof(w), (void *)s->sp) && w[0] == 0 &&
	    arch_strip_ra(w[1]) == s->pc)
		cfa += 16;
#endif
	if (bpf_probe_read_user(w, sizeof(w), (void *)(cfa - 16)))
		return HS_STUCK;
	w[1] = arch_strip_ra(w[1]);
	if (!hs_in_code(p, w[1]) && s->pc_exact) {
		/* Past the epilogue's pops, at the ret; or below the frame
		 * by a few pushed words (x86-64). */
		if (hs_at_ret(pc))
			return hs_bare_return(p, s) ? HS_STUCK : HS_NEXT;
#if defined(__TARGET_ARCH_x86)
		for (int i = 1; i <= HS_RA_SLOTS; i++) {
			if (bpf_probe_read_user(w, sizeof(w), (void *)(cfa - 16 + 8 * i)))
				return HS_STUCK;
			if (hs_in_code(p, w[1])) {
				cfa += 8 * i;
				break;
			}
		}
#else
		/* Between the epilogue's add to SP and the ret (the safepoint
		 * poll): the frame is gone, the return address is in lr. */
		return hs_bare_return(p, s) ? HS_STUCK : HS_NEXT;
#endif
	}
	if (!hs_in_code(p, w[1]))
		return HS_STUCK;
	s->fp = w[0];
	s->pc = w[1];
	s->sp = cfa;
	return HS_NEXT;
}

/* A stub: vtable and itable stubs keep only the return address; blobs
 * with a frame size keep it like compiled code; the rest keep rbp. */
static __always_inline int hs_stub(struct hotspot_proc *p, struct unwind_state *s, __u64 blob, __u64 code,
				   __u64 fsize, __u32 complete, __u32 name)
{
	int interrupted = s->pc_exact;
	__u64 w[2], cfa;

	if (push_runtime_frame(s, FRAME_HS_STUB, blob, (__u32)(s->pc - code)))
		return HS_FULL;
	if (name == HS_NAME_VTABLE)
		return hs_bare_return(p, s) ? HS_STUCK : HS_NEXT;
	if (fsize) {
		if (interrupted && s->pc < code + complete)
			return hs_bare_return(p, s) ? HS_STUCK : HS_NEXT;
		cfa = s->sp + fsize;
		if (bpf_probe_read_user(w, sizeof(w), (void *)(cfa - 16)))
			return HS_STUCK;
		w[1] = arch_strip_ra(w[1]);
		if (!hs_in_code(p, w[1]))
			return HS_STUCK;
		s->fp = w[0];
		s->pc = w[1];
		s->sp = cfa;
		return HS_NEXT;
	}
	if (s->pc == p->call_stub_ret)
		return hs_fp_step(p, s, 1) ? HS_STUCK : HS_NEXT;
	if (!hs_fp_step(p, s, 0))
		return HS_NEXT;
	return interrupted && !hs_bare_return(p, s) ? HS_NEXT : HS_STUCK;
}

/* One frame in the code cache. */
static __always_inline int hs_frame(struct hotspot_proc *p, struct unwind_state *s, struct hotspot_blob *b)
{
	__u64 lookup = s->pc_exact ? s->pc : s->pc - 1, blob, code, fsize;
	__u32 name = 0, size, complete, err = HS_ERR_BLOB_READ;
	int leaf = s->regs_valid, r;

	if (lookup >= p->interp_lo && lookup < p->interp_hi) {
		r = hs_interpreted(p, s, leaf);
		err = HS_ERR_INTERP;
		goto out;
	}
	blob = hs_find_blob(p, lookup);
	if (!blob) {
		err = HS_ERR_NO_BLOB;
		r = HS_UNKNOWN;
		goto out;
	}
	/* Only the header's part the fields live in (a third less to copy
	 * than the whole buffer on JDK 17). */
	if (bpf_probe_read_user(b, ((__u32)p->blob_bytes - 1) % HS_BLOB_BYTES + 1, (void *)blob)) {
		r = HS_UNKNOWN;
		goto out;
	}
	code = hs_field(b, p->blob_code_begin);
	if (p->flags & HS_CODE_OFFSETS)
		code = blob + (__u32)code;
	size = (__u32)hs_field(b, p->blob_size);
	fsize = (__u64)(__u32)hs_field(b, p->blob_frame_size) * 8;
	complete = (__u32)hs_field(b, p->blob_frame_complete);
	/* Sign-extended: -1 (never complete) stays past any PC. */
	if (p->flags & HS_COMPLETE_16)
		complete = (__u32)(__s32)(__s16)complete;
	if (lookup < code || lookup >= blob + size || fsize > HS_MAX_FRAME ||
	    bpf_probe_read_user(&name, sizeof(name), (void *)hs_field(b, p->blob_name))) {
		r = HS_UNKNOWN;
		goto out;
	}
	switch (name) {
	case HS_NAME_NMETHOD:
	case HS_NAME_NATIVE:
		r = hs_compiled(p, s, b, blob, code, fsize, complete);
		err = HS_ERR_RA;
		break;
	case HS_NAME_INTERP:
		r = hs_interpreted(p, s, leaf);
		err = HS_ERR_INTERP;
		break;
	default:
		r = hs_stub(p, s, blob, code, fsize, complete, name);
		err = HS_ERR_STUB;
	}
out:
	if (r == HS_NEXT) {
		s->regs_valid = 0;
		s->pc_exact = 0;
		s->trusted = 1;
	} else if (r != HS_FULL) {
		hs_error(err);
		set_reason(s, STOP_RUNTIME);
	}
	return r;
}

static __always_inline int hotspot_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	struct hotspot_proc *p = bpf_map_lookup_elem(&hotspot_procs, &s->tgid);
	struct hotspot_blob *b;
	__u32 slot = s->slot;
	int r;

	b = bpf_map_lookup_elem(&hotspot_scratch, &slot);
	if (!HS_WALKS || !p || p->broken || !b) {
		/* Known to run HotSpot, but not walkable: its native frames,
		 * marked. A JVM still starting up (no entry yet) gets walked
		 * once userspace looks again: ask it to (at most once a
		 * second). */
		hs_error(HS_ERR_NO_PROC);
		set_reason(s, STOP_RUNTIME);
		if (!p)
			signal_remap(s, st);
		s->rt_kind = RUNTIME_NONE;
		return walk_native(ctx, s, st, progs);
	}
	for (int i = 0; i < HS_FRAMES_PER_PROG; i++) {
		r = hs_frame(p, s, b);
		if (r == HS_UNKNOWN) {
			/* Not a frame this walker knows (a forged or moving
			 * code cache): the native walker takes this PC and the
			 * rest, as it would without a walker for it. */
			s->rt_kind = RUNTIME_NONE;
			return walk_native(ctx, s, st, progs);
		}
		if (r != HS_NEXT || s->pc == 0)
			return finish_walk(s, st);
		if (!hs_in_code(p, s->pc - 1))
			return walk_native(ctx, s, st, progs);
	}
	walk_tail_call(ctx, s, st, progs, WALK_HOTSPOT);
	set_reason(s, STOP_DEPTH);
	return finish_walk(s, st);
}

WALK_PROGRAM("perf_event", hotspot_step, unwind_progs, hotspot_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct hotspot_proc *unused_hotspot_proc __attribute__((unused));
enum hotspot_frame_kind *unused_hotspot_frame_kind __attribute__((unused));
enum hotspot_limits *unused_hotspot_limits __attribute__((unused));
enum hotspot_error *unused_hotspot_error __attribute__((unused));
enum hotspot_flags *unused_hotspot_flags __attribute__((unused));

#endif /* PROFSYM_HOTSPOT_H */
