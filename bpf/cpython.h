/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * CPython: Python frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker (walk.h) hands this walker every PC of a Python
 * process's eval loop (_PyEval_EvalFrameDefault and its .cold part). Each
 * such native frame runs frames of the thread's Python frame chain,
 * innermost first:
 *   CPY_FRAME_OBJECTS (3.9, 3.10) one PyFrameObject per eval call;
 *   CPY_ENTRY_FLAG    (3.11)      _PyInterpreterFrames down to the one
 *                                 marked is_entry;
 *   CPY_ENTRY_SHIM    (3.12+)     _PyInterpreterFrames down to a shim frame
 *                                 owned by the C stack, which the call
 *                                 pushed below them.
 * The walker pushes those frames in place of the eval frame (rt_handled),
 * keeps its place in the chain in rt_data[0] across its runs within one
 * walk, and goes back to the native walker. So Python -> C -> Python
 * stacks (sorted(key=...), ctypes callbacks) keep their order.
 *
 * The chain starts at the sampled thread's PyThreadState, which CPython
 * keeps per thread where the thread pointer leads: under a pthread key
 * (autoTLSkey in 3.6, the runtime's autoTSSkey from 3.7; glibc stores a
 * small key's value in struct pthread, above the thread pointer) or in a
 * thread-local (3.15's _Py_tss_gilstate; static TLS, below it). It is read
 * at the thread pointer plus an offset the host finds at attach (ts_tss).
 * Where that fails (no offset, another libc, a large key), the thread
 * state whose thread_id (pthread_self()) is the thread pointer, found in
 * the interpreters' thread lists, cached per thread. Either way it must
 * carry this thread's id, checked on every use.
 *
 * A Python frame is pushed as ptr = the code object, aux = the instruction
 * (low 32 bits, signed: f_lasti up to 3.10, bytes after co_code_adaptive
 * from 3.11) | a code id << 32 (a hash of the code object's file and name
 * pointers and first line, read here), so that the host, naming the frame
 * later, can tell whether the object at ptr is still the one sampled.
 *
 * Offsets come from the host (internal/host/runtimes/cpython), per
 * interpreter build; every one is bounded here again for the verifier and
 * for hostile processes, and a frame whose f_code is not a code object ends
 * the Python walk (STOP_RUNTIME, native frames from there).
 */
#ifndef PROFSYM_CPYTHON_H
#define PROFSYM_CPYTHON_H

/* Frame kinds of CPython's block (runtime.h). */
enum cpython_frame_kind {
	FRAME_CPYTHON = FRAME_CPYTHON_FIRST, /* a Python function: see above */
};

/* How frames are linked (struct cpython_proc.layout). 0: a Python
 * profsym refused at attach (its stacks stay native, STOP_RUNTIME). */
enum cpython_layout {
	CPY_REFUSED = 0,
	CPY_FRAME_OBJECTS = 1,
	CPY_ENTRY_FLAG = 2,
	CPY_ENTRY_SHIM = 3,
};

enum cpython_limits {
	CPY_FRAMES_PER_PROG = 16, /* Python frames per run */
	CPY_THREAD_SCAN = 96,     /* list steps to find a thread's state */
	CPY_FRAME_READ = 128,     /* at most this much of a frame is read */
	CPY_CODE_READ = 256,      /* ... and of a code object (powers of two) */
	CPY_MAX_PROCS = 4096,
	CPY_MAX_THREADS = 4096,
};

/* Why a Python walk ended early (cpython_counters.errors). */
enum cpython_error {
	CPY_ERR_NOT_ATTACHED = 0, /* no cpython_procs entry (yet) */
	CPY_ERR_REFUSED = 1,      /* the host refused this interpreter */
	CPY_ERR_NO_THREAD = 2,    /* no thread state is this thread's */
	CPY_ERR_READ = 3,         /* a thread state or frame pointer unreadable */
	CPY_ERR_READ_FRAME = 4,
	CPY_ERR_READ_CODE = 5,
	CPY_ERR_NOT_CODE = 6,     /* f_code is no code object */
	CPY_ERR_CHAIN_END = 7,    /* more eval calls than Python frames */
	CPY_ERR_LOOP = 8,         /* a frame links back to itself or to the first */
	CPY_ERRORS = 9,
};

/* A thread's chain starts at its thread state's current frame, or at
 * cframe->current_frame (3.11, 3.12) when CPY_CFRAME is set. */
enum cpython_flags {
	CPY_CFRAME = 1,
};

/* Per process, written by the host at attach. Offsets are bytes. */
struct cpython_proc {
	__u64 runtime;      /* &_PyRuntime */
	__u64 code_type;    /* &PyCode_Type */
	__u64 code_mask;    /* f_code bits that are a pointer (3.14 tags the rest) */
	__u32 layout;       /* enum cpython_layout */
	__u32 flags;        /* enum cpython_flags */
	__u16 interp_head;  /* _PyRuntime.interpreters.head */
	__u16 interp_next;  /* PyInterpreterState.next */
	__u16 threads_head; /* PyInterpreterState: newest thread state */
	__u16 ts_next;      /* PyThreadState.next */
	__u16 ts_thread_id; /* PyThreadState.thread_id */
	__u16 ts_frame;     /* PyThreadState: frame, cframe or current_frame */
	__u16 cframe_frame; /* _PyCFrame.current_frame */
	__u16 f_back;       /* frame: the caller's frame */
	__u16 f_code;
	__u16 f_instr;      /* f_lasti (int) up to 3.10, else the instruction pointer */
	__u16 f_entry;      /* is_entry (3.11) or owner (3.12+), one byte */
	__u16 entry_val;    /* is_entry's value at an eval call's entry; the
			     * least owner value of a shim */
	__u16 frame_size;   /* bytes of a frame to read: <= CPY_FRAME_READ */
	__u16 co_code;      /* PyCodeObject: first code unit (3.11+) */
	__u16 co_filename;  /* PyCodeObject.co_filename; co_name follows */
	__u16 co_name;
	__u16 co_firstlineno;
	__u16 code_size;    /* bytes of a code object to read: <= CPY_CODE_READ */
	__s16 ts_tss;       /* thread pointer + ts_tss: the thread's PyThreadState
			     * (see above); 0: none found */
	__u16 tp_self;      /* thread pointer - pthread_self(), which is what a
			     * thread state's thread_id holds: 0 on x86-64,
			     * sizeof(struct pthread) on arm64's glibc */
};

struct cpython_counters {
	__u64 walks;  /* samples that reached a Python eval loop */
	__u64 frames; /* Python frames pushed */
	__u64 errors[CPY_ERRORS];
};

struct cpython_bufs {
	__u8 frame[CPY_FRAME_READ];
	__u8 code[CPY_CODE_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CPY_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct cpython_proc);
} cpython_procs SEC(".maps");

/* tid -> its PyThreadState, checked against the thread pointer on use. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CPY_MAX_THREADS);
	__type(key, __u32);
	__type(value, __u64);
} cpython_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct cpython_bufs);
} cpython_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpython_counters);
} cpython_stats SEC(".maps");

/* rt_data use: [0] the next frame of the chain, [1] CPY_STARTED once the
 * thread's chain was found in this walk, [2] its first frame. A chain
 * that comes back to its first frame, or a frame that is its own caller,
 * is forged or torn: the walk ends there with STOP_RUNTIME. Longer loops
 * end at the depth limit. */
#define CPY_STARTED 1
#define CPY_INLINE 2 /* up to 3.10: further eval frames go to cpython_inline */

/* The thread pointer: fsbase on x86-64, where pthread_self() is the
 * thread pointer itself (glibc and musl); tpidr_el0 on arm64, where glibc
 * keeps struct pthread just below it (cpython_proc.tp_self). */
static __always_inline __u64 cpython_thread_pointer(void)
{
	struct task_struct *t = (void *)bpf_get_current_task();
#if defined(__TARGET_ARCH_arm64)
	return BPF_CORE_READ(t, thread.uw.tp_value);
#else
	return BPF_CORE_READ(t, thread.fsbase);
#endif
}

/* Loads from the scratch buffers at an offset the host chose: bounded for
 * the verifier (and against a bad layout). */
#define CPY_LOAD(buf, size, type, off) \
	((off) <= (size) - sizeof(type) ? *(type *)((buf) + ((off) & ((size) - 1))) : (type)0)

static __always_inline int cpy_read(void *dst, __u32 size, __u64 addr)
{
	return bpf_probe_read_user(dst, size, (void *)addr);
}

/* The PyThreadState of the sampled thread, 0 when none is found. */
static __always_inline __u64 cpython_tstate(struct cpython_proc *p, struct unwind_state *s)
{
	__u64 tp = cpython_thread_pointer(), ts = 0, interp = 0, id, self;
	__u64 *cached = bpf_map_lookup_elem(&cpython_threads, &s->tid);

	if (tp == 0)
		return 0;
	self = tp - p->tp_self; /* pthread_self(): thread_id's value */
	if (p->ts_tss) {
		if (!cpy_read(&ts, sizeof(ts), tp + (__s64)p->ts_tss) && ts != 0 &&
		    !cpy_read(&id, sizeof(id), ts + p->ts_thread_id) && id == self)
			return ts;
		ts = 0;
	}
	if (cached) {
		ts = *cached;
		if (!cpy_read(&id, sizeof(id), ts + p->ts_thread_id) && id == self)
			return ts;
		bpf_map_delete_elem(&cpython_threads, &s->tid);
		ts = 0;
	}
	if (cpy_read(&interp, sizeof(interp), p->runtime + p->interp_head))
		return 0;
	/* Every interpreter's thread list, newest first; one step each. */
	for (int i = 0; i < CPY_THREAD_SCAN; i++) {
		if (ts == 0) {
			if (interp == 0 || cpy_read(&ts, sizeof(ts), interp + p->threads_head))
				return 0;
			if (cpy_read(&interp, sizeof(interp), interp + p->interp_next))
				interp = 0;
			continue;
		}
		if (cpy_read(&id, sizeof(id), ts + p->ts_thread_id))
			return 0;
		if (id == self) {
			bpf_map_update_elem(&cpython_threads, &s->tid, &ts, BPF_ANY);
			return ts;
		}
		if (cpy_read(&ts, sizeof(ts), ts + p->ts_next))
			return 0;
	}
	return 0;
}

/* Asks the host to attach (again) to a Python process it has no entry
 * for (it was not initialized when the host looked): a process reread
 * (PROC_REMAP), at most every 100 ms. This lasts as long as the process
 * runs Python code without an entry: a moment at its start. */
static __always_inline void cpython_ask_attach(struct unwind_state *s, struct stats *st)
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

/* What cpython_frame did, besides an enum cpython_error. */
enum {
	CPY_PUSHED = 0x100, /* pushed the frame's code object */
	CPY_SHIM,           /* the frame is the shim below an eval call's frames */
	CPY_FULL,           /* the stack is full (STOP_DEPTH set) */
};

/* Reads the Python frame at cur and pushes its code object; *next is its
 * caller's frame, *entry its entry byte. */
static __always_inline __u32 cpython_frame(struct unwind_state *s, struct cpython_proc *p, struct cpython_bufs *b,
					   __u64 fsize, __u64 csize, __u64 cur, __u64 *next, __u8 *entry)
{
	__u64 code, instr, h;

	if (probe_read_user_upto(b->frame, fsize, CPY_FRAME_READ, cur))
		return CPY_ERR_READ_FRAME;
	*next = CPY_LOAD(b->frame, CPY_FRAME_READ, __u64, p->f_back);
	*entry = CPY_LOAD(b->frame, CPY_FRAME_READ, __u8, p->f_entry);
	if (*next == cur || *next == s->rt_data[2])
		return CPY_ERR_LOOP;
	if (p->layout == CPY_ENTRY_SHIM && *entry >= p->entry_val)
		return CPY_SHIM;
	code = CPY_LOAD(b->frame, CPY_FRAME_READ, __u64, p->f_code) & p->code_mask;
	if (p->layout == CPY_FRAME_OBJECTS)
		instr = (__u32)CPY_LOAD(b->frame, CPY_FRAME_READ, __u32, p->f_instr);
	else
		instr = (__u32)(CPY_LOAD(b->frame, CPY_FRAME_READ, __u64, p->f_instr) - code - p->co_code);
	if (code == 0 || probe_read_user_upto(b->code, csize, CPY_CODE_READ, code))
		return CPY_ERR_READ_CODE;
	if (CPY_LOAD(b->code, CPY_CODE_READ, __u64, 8) != p->code_type)
		return CPY_ERR_NOT_CODE;
	h = mix(0xcbf29ce484222325ull, CPY_LOAD(b->code, CPY_CODE_READ, __u64, p->co_filename));
	h = mix(h, CPY_LOAD(b->code, CPY_CODE_READ, __u64, p->co_name));
	h = mix(h, CPY_LOAD(b->code, CPY_CODE_READ, __u32, p->co_firstlineno));
	h = (__u32)(h ^ (h >> 32));
	if (h == 0)
		h = 1;
	if (push_runtime_frame(s, FRAME_CPYTHON, code, instr | h << 32))
		return CPY_FULL;
	return CPY_PUSHED;
}

/* Whether the sizes the host gave are ones the reads take. */
static __always_inline int cpython_sizes_ok(__u64 fsize, __u64 csize)
{
	return fsize != 0 && fsize <= CPY_FRAME_READ && csize >= 16 && csize <= CPY_CODE_READ;
}

/* Called by the native walker (walk.h) at every eval frame of a Python
 * process (enum rt_inline). Up to 3.10 an eval call runs one frame: once
 * this walk has found the thread's chain (CPY_INLINE), each further eval
 * frame's Python frame is pushed here, in the native walker's own run,
 * instead of by two tail calls (there and back), of which a deep stack ran
 * out after about 13 Python frames. */
static __always_inline int cpython_inline(struct unwind_state *s)
{
	__u32 zero = 0, slot = s->slot, r;
	struct cpython_proc *p;
	struct cpython_bufs *b;
	struct cpython_counters *cs;
	__u64 cur = s->rt_data[0], next, fsize, csize;
	__u8 entry;

	if (!(s->rt_data[1] & CPY_INLINE))
		return RT_INLINE_NO;
	p = bpf_map_lookup_elem(&cpython_procs, &s->tgid);
	b = bpf_map_lookup_elem(&cpython_scratch, &slot);
	cs = bpf_map_lookup_elem(&cpython_stats, &zero);
	if (!p || !b || !cs)
		return RT_INLINE_FAILED;
	fsize = p->frame_size;
	csize = p->code_size;
	r = CPY_ERR_CHAIN_END;
	if (cur != 0) {
		r = CPY_ERR_REFUSED;
		if (p->layout == CPY_FRAME_OBJECTS && cpython_sizes_ok(fsize, csize))
			r = cpython_frame(s, p, b, fsize, csize, cur, &next, &entry);
	}
	if (r == CPY_FULL)
		return RT_INLINE_FULL;
	if (r == CPY_PUSHED) {
		cs->frames++;
		s->rt_data[0] = next;
		return RT_INLINE_PUSHED;
	}
	if (r < CPY_ERRORS)
		cs->errors[r]++;
	return RT_INLINE_FAILED;
}

static __always_inline int cpython_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, slot = s->slot, err = CPY_ERR_NOT_ATTACHED;
	__u64 fsize, csize; /* 64-bit: the bounds checked are those of the register passed */
	struct cpython_proc *p = bpf_map_lookup_elem(&cpython_procs, &s->tgid);
	struct cpython_bufs *b = bpf_map_lookup_elem(&cpython_scratch, &slot);
	struct cpython_counters *cs = bpf_map_lookup_elem(&cpython_stats, &zero);
	__u64 cur, next, ts;
	__u32 r;
	__u8 entry;

	if (!b || !cs)
		goto fail;
	if (!p) {
		cpython_ask_attach(s, st);
		goto fail;
	}
	err = CPY_ERR_REFUSED;
	if (p->layout == CPY_REFUSED || p->layout > CPY_ENTRY_SHIM)
		goto fail;
	if (!(s->rt_data[1] & CPY_STARTED)) {
		s->rt_data[1] |= CPY_STARTED;
		cs->walks++;
		err = CPY_ERR_NO_THREAD;
		ts = cpython_tstate(p, s);
		if (!ts)
			goto fail;
		err = CPY_ERR_READ;
		if (cpy_read(&cur, sizeof(cur), ts + p->ts_frame))
			goto fail;
		if ((p->flags & CPY_CFRAME) && (cur == 0 || cpy_read(&cur, sizeof(cur), cur + p->cframe_frame)))
			goto fail;
		s->rt_data[0] = cur;
		s->rt_data[2] = cur;
	}
	cur = s->rt_data[0];
	fsize = p->frame_size;
	csize = p->code_size;
	if (!cpython_sizes_ok(fsize, csize)) {
		err = CPY_ERR_REFUSED;
		goto fail;
	}
	for (int i = 0; i < CPY_FRAMES_PER_PROG; i++) {
		err = CPY_ERR_CHAIN_END;
		if (cur == 0)
			goto fail;
		r = cpython_frame(s, p, b, fsize, csize, cur, &next, &entry);
		if (r == CPY_SHIM) {
			/* The shim below this eval call's frames (3.14: owned by
			 * the interpreter, 3, or the C stack, 4). */
			s->rt_data[0] = next;
			goto done;
		}
		if (r == CPY_FULL)
			return finish_walk(s, st);
		if (r != CPY_PUSHED) {
			err = r;
			goto fail;
		}
		cs->frames++;
		cur = next;
		if (p->layout == CPY_FRAME_OBJECTS) {
			/* One frame per eval call: the native walker pushes the
			 * next eval calls' frames itself (cpython_inline). */
			s->rt_data[0] = cur;
			s->rt_data[1] |= CPY_INLINE;
			goto done;
		}
		if (p->layout == CPY_ENTRY_FLAG && entry == p->entry_val) {
			s->rt_data[0] = cur;
			goto done;
		}
	}
	/* This eval call runs more frames: another run of this walker. */
	s->rt_data[0] = cur;
	if (walk_tail_call(ctx, s, st, progs, WALK_CPYTHON)) {
		set_reason(s, STOP_DEPTH);
		return finish_walk(s, st);
	}
	err = CPY_ERR_READ;
fail:
	if (cs && err < CPY_ERRORS)
		cs->errors[err]++;
	if (err == CPY_ERR_NOT_CODE || err == CPY_ERR_NO_THREAD)
		bpf_map_delete_elem(&cpython_threads, &s->tid);
	/* The rest of the stack keeps its native frames. */
	set_reason(s, STOP_RUNTIME);
	s->rt_kind = RUNTIME_NONE;
	return walk_native(ctx, s, st, progs);
done:
	s->rt_handled = 1;
	return walk_native(ctx, s, st, progs);
}

WALK_PROGRAM("perf_event", cpython_step, unwind_progs, cpython_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct cpython_bufs *unused_cpython_bufs __attribute__((unused));
enum cpython_frame_kind *unused_cpython_frame_kind __attribute__((unused));
enum cpython_layout *unused_cpython_layout __attribute__((unused));
enum cpython_limits *unused_cpython_limits __attribute__((unused));
enum cpython_error *unused_cpython_error __attribute__((unused));
enum cpython_flags *unused_cpython_flags __attribute__((unused));

#endif /* PROFSYM_CPYTHON_H */
