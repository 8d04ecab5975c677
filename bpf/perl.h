/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Perl: Perl frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker (walk.h) hands this walker every PC of a Perl
 * process's run loop (Perl_runops_standard). Each run loop on the C stack
 * runs part of the interpreter's context stack: the contexts of the
 * current stackinfo (PL_curstackinfo->si_cxstack), from the topmost
 * sub/eval/format (si_cxsubix) down the old_cxsubix links, then the
 * outer stackinfo (si_prev). A run loop that call_sv (an XS function, a
 * named sort sub) started begins at a sub context whose retop is NULL:
 * the walker stops there, and the next run loop goes on below it. A
 * stackinfo pushed for a callback (sort { }, magic) ends with its run
 * loop too. So Perl -> C -> Perl stacks keep their order. The main
 * program is one last frame below the main stackinfo's contexts.
 *
 * The interpreter is the sampled thread's: pthread_getspecific(PL_thr_key)
 * on threaded builds (glibc keeps key k's value in the thread's own
 * struct pthread, at the thread pointer + tls_data + 16 * k), else, or
 * when that is empty, PL_curinterp.
 *
 * Frames (kinds of Perl's block, runtime.h):
 *   PERL_SUB   ptr = the CV, aux = line | id << 32: id is a hash of the
 *              CV's GV and file pointers, read here, so the host can tell
 *              whether the CV at ptr is still the one sampled;
 *   PERL_EVAL  ptr = the COP running in the eval, aux = its line;
 *   PERL_MAIN  ptr = the COP running in the main program, aux = its line.
 * The line of a frame is its COP's: PL_curcop for the innermost, and the
 * caller's blk_oldcop saved in the context of the frame it called; a sub
 * that has run no statement yet (PL_curcop is still its caller's) has the
 * line of its first statement.
 *
 * Offsets come from the host (internal/host/runtimes/perl), per Perl
 * version; every one is bounded here again.
 */
#ifndef PROFSYM_PERL_H
#define PROFSYM_PERL_H

enum perl_frame_kind {
	FRAME_PERL_SUB = FRAME_PERL_FIRST,
	FRAME_PERL_EVAL = FRAME_PERL_FIRST + 1,
	FRAME_PERL_MAIN = FRAME_PERL_FIRST + 2,
};

enum perl_limits {
	PERL_CX_PER_PROG = 12, /* contexts per run */
	PERL_CX_READ = 128,    /* at most this much of a context is read (a power of two) */
	PERL_MAX_CXIX = 1 << 20,
	PERL_MAX_PROCS = 4096,
	PERL_TLS_KEYS = 32, /* keys glibc keeps in struct pthread itself */
};

enum perl_error {
	PERL_ERR_NOT_ATTACHED = 0, /* no perl_procs entry (yet) */
	PERL_ERR_REFUSED = 1,      /* the host refused this interpreter */
	PERL_ERR_NO_INTERP = 2,    /* no interpreter for this thread */
	PERL_ERR_READ = 3,         /* interpreter or stackinfo unreadable */
	PERL_ERR_READ_CX = 4,
	PERL_ERR_READ_CV = 5,
	PERL_ERR_NOT_CV = 6,   /* a sub context's cv is no CV */
	PERL_ERR_BAD_IX = 7,   /* a context index out of bounds or not decreasing */
	PERL_ERRORS = 8,
};

/* Per process, written by the host at attach. Offsets are bytes. */
struct perl_proc {
	__u64 curinterp;  /* &PL_curinterp */
	__u64 thr_key;    /* &PL_thr_key, 0 on unthreaded builds */
	__u32 valid;      /* 0: refused (stacks stay native, STOP_RUNTIME) */
	__u16 tls_data;   /* thread pointer + this + 16 * key: the key's value */
	__u16 i_stackinfo; /* interpreter: PL_curstackinfo */
	__u16 i_curcop;    /* interpreter: PL_curcop */
	__u16 i_op;        /* interpreter: PL_op */
	__u16 si_cxstack;
	__u16 si_prev;
	__u16 si_cxmax;
	__u16 si_cxsubix;
	__u16 cx_size;    /* sizeof(PERL_CONTEXT): <= PERL_CX_READ */
	__u16 cx_oldcop;
	__u16 cx_retop;
	__u16 cx_oldsubix;
	__u16 cx_cv;
	__u16 xcv_gv;     /* XPVCV: xcv_gv_u; xcv_file */
	__u16 xcv_file;
	__u16 cop_line;
	__u16 xcv_start;  /* XPVCV: xcv_start_u, the sub's first op */
	__u16 op_type;    /* OP: the 16 bits whose low 9 are op_type */
	__u16 op_nextstate; /* OP_NEXTSTATE; OP_DBSTATE follows */
	__u8 type_cv;     /* SVt_PVCV */
	__u8 cxt_sub;     /* CXt_SUB; CXt_FORMAT, CXt_EVAL follow */
	__u8 cxp_evalblock;
	__u8 pad;
};

struct perl_counters {
	__u64 walks;  /* samples that reached a Perl run loop */
	__u64 frames; /* Perl frames pushed */
	__u64 errors[PERL_ERRORS];
};

struct perl_bufs {
	__u8 cx[PERL_CX_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PERL_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct perl_proc);
} perl_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct perl_bufs);
} perl_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct perl_counters);
} perl_stats SEC(".maps");

/* rt_data use: [0] the stackinfo being walked, [1] PERL_STARTED |
 * PERL_DONE | PERL_PUSHED | the next context index (low 32 bits, signed),
 * [2] the COP of the next frame pushed. */
#define PERL_STARTED (1ull << 40)
#define PERL_DONE (1ull << 41)
#define PERL_PUSHED (1ull << 42) /* a sub or eval frame was pushed */

#define PERL_LOAD(buf, size, type, off) \
	((off) <= (size) - sizeof(type) ? *(type *)((buf) + ((off) & ((size) - 1))) : (type)0)

static __always_inline int perl_read(void *dst, __u32 size, __u64 addr)
{
	return bpf_probe_read_user(dst, size, (void *)addr);
}

/* The sampled thread's interpreter, 0 when none is found. */
static __always_inline __u64 perl_interp(struct perl_proc *p)
{
	__u64 tp, interp = 0;
	__u32 key;

	if (p->thr_key && !perl_read(&key, sizeof(key), p->thr_key) && key < PERL_TLS_KEYS) {
		tp = cpython_thread_pointer(); /* cpython.h: the same thread pointer */
		if (tp && !perl_read(&interp, sizeof(interp), tp + p->tls_data + 16 * (__u64)key) && interp)
			return interp;
	}
	if (perl_read(&interp, sizeof(interp), p->curinterp))
		return 0;
	return interp;
}

/* Reads stackinfo si's topmost sub context index into *ix; 0 on success. */
static __always_inline int perl_si(struct perl_proc *p, __u64 si, __s32 *ix)
{
	return perl_read(ix, sizeof(*ix), si + p->si_cxsubix);
}

/* The line of a sub that was entered but has run no statement yet
 * (PL_curcop is still its caller's): its first op's, a nextstate COP.
 * Else line stays. */
static __always_inline __u32 perl_first_line(struct perl_proc *p, __u64 body, __u32 line)
{
	__u64 start;
	__u16 type;
	__u32 first;

	if (perl_read(&start, sizeof(start), body + p->xcv_start) || start == 0 ||
	    perl_read(&type, sizeof(type), start + p->op_type))
		return line;
	type &= 0x1ff;
	if (type != p->op_nextstate && type != p->op_nextstate + 1)
		return line;
	if (perl_read(&first, sizeof(first), start + p->cop_line))
		return line;
	return first;
}

static __always_inline int perl_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, slot = s->slot, err = PERL_ERR_NOT_ATTACHED, line, type;
	struct perl_proc *p = bpf_map_lookup_elem(&perl_procs, &s->tgid);
	struct perl_bufs *b = bpf_map_lookup_elem(&perl_scratch, &slot);
	struct perl_counters *cs = bpf_map_lookup_elem(&perl_stats, &zero);
	__u64 interp, si, cop, op, cxs, cv, body, gv, file, retop, prev, h, size;
	__s32 ix, next, cxmax;
	__u32 flags;
	__u8 cxtype;

	if (!b || !cs)
		goto fail;
	if (!p) {
		cpython_ask_attach(s, st); /* the same request: reread the process */
		goto fail;
	}
	err = PERL_ERR_REFUSED;
	size = p->cx_size;
	if (!p->valid || size < 16 || size > PERL_CX_READ)
		goto fail;
	if (!(s->rt_data[1] & PERL_STARTED)) {
		cs->walks++;
		err = PERL_ERR_NO_INTERP;
		interp = perl_interp(p);
		if (!interp)
			goto fail;
		err = PERL_ERR_READ;
		if (perl_read(&si, sizeof(si), interp + p->i_stackinfo) || si == 0 ||
		    perl_read(&cop, sizeof(cop), interp + p->i_curcop) || perl_read(&op, sizeof(op), interp + p->i_op))
			goto fail;
		if (op == 0 && !perl_read(&prev, sizeof(prev), si + p->si_prev) && prev) {
			/* No run loop runs this stackinfo: the last one that did
			 * returned (PL_op NULL), to C that pushed it and runs
			 * more of it later (sort between two comparisons). */
			si = prev;
		}
		if (perl_si(p, si, &ix))
			goto fail;
		s->rt_data[0] = si;
		s->rt_data[1] = PERL_STARTED | (__u32)ix;
		s->rt_data[2] = cop;
	}
	if (s->rt_data[1] & PERL_DONE)
		goto done; /* run loops below the main program's: nothing left */
	si = s->rt_data[0];
	ix = (__s32)(__u32)s->rt_data[1];
	cop = s->rt_data[2];
	for (int i = 0; i < PERL_CX_PER_PROG; i++) {
		if (ix < 0) {
			err = PERL_ERR_READ;
			if (perl_read(&prev, sizeof(prev), si + p->si_prev))
				goto fail;
			if (prev == 0) {
				/* The main program, below everything. */
				line = 0;
				if (cop)
					perl_read(&line, sizeof(line), cop + p->cop_line);
				if (push_runtime_frame(s, FRAME_PERL_MAIN, cop, line))
					return finish_walk(s, st);
				cs->frames++;
				s->rt_data[1] |= PERL_DONE;
				goto done;
			}
			/* This stackinfo's run loop ends here: the outer one's
			 * is further down the C stack. */
			if (perl_si(p, prev, &ix))
				goto fail;
			si = prev;
			goto next_loop;
		}
		err = PERL_ERR_READ;
		if (perl_read(&cxs, sizeof(cxs), si + p->si_cxstack) ||
		    perl_read(&cxmax, sizeof(cxmax), si + p->si_cxmax))
			goto fail;
		err = PERL_ERR_BAD_IX;
		if (ix > cxmax || ix >= PERL_MAX_CXIX)
			goto fail;
		err = PERL_ERR_READ_CX;
		if (cxs == 0 || probe_read_user_upto(b->cx, size, PERL_CX_READ, cxs + (__u64)ix * size))
			goto fail;
		cxtype = b->cx[0];
		type = cxtype & 0xf;
		retop = PERL_LOAD(b->cx, PERL_CX_READ, __u64, p->cx_retop);
		next = PERL_LOAD(b->cx, PERL_CX_READ, __s32, p->cx_oldsubix);
		err = PERL_ERR_BAD_IX;
		if (next >= ix)
			goto fail;
		line = 0;
		if (cop)
			perl_read(&line, sizeof(line), cop + p->cop_line);
		if (type == p->cxt_sub || type == p->cxt_sub + 1) {
			cv = PERL_LOAD(b->cx, PERL_CX_READ, __u64, p->cx_cv);
			err = PERL_ERR_READ_CV;
			if (cv == 0 || perl_read(&body, sizeof(body), cv) || body == 0 ||
			    perl_read(&flags, sizeof(flags), cv + 12) || perl_read(&gv, sizeof(gv), body + p->xcv_gv) ||
			    perl_read(&file, sizeof(file), body + p->xcv_file))
				goto fail;
			err = PERL_ERR_NOT_CV;
			if ((flags & 0xff) != p->type_cv)
				goto fail;
			/* Only the innermost: a recursive sub's callers share
			 * its COPs. */
			if (!(s->rt_data[1] & PERL_PUSHED) && cop == PERL_LOAD(b->cx, PERL_CX_READ, __u64, p->cx_oldcop))
				line = perl_first_line(p, body, line);
			h = mix(mix(0xcbf29ce484222325ull, gv), file);
			h = (__u32)(h ^ (h >> 32));
			if (h == 0)
				h = 1;
			if (push_runtime_frame(s, FRAME_PERL_SUB, cv, line | h << 32))
				return finish_walk(s, st);
			cs->frames++;
			s->rt_data[1] |= PERL_PUSHED;
			cop = PERL_LOAD(b->cx, PERL_CX_READ, __u64, p->cx_oldcop);
		} else if (type == p->cxt_sub + 2) {
			/* An eval; not the one call_sv(G_EVAL) wraps around a
			 * call from C, which is no frame of the program's. */
			if (!(retop == 0 && (cxtype & p->cxp_evalblock))) {
				if (push_runtime_frame(s, FRAME_PERL_EVAL, cop, line))
					return finish_walk(s, st);
				cs->frames++;
				s->rt_data[1] |= PERL_PUSHED;
				cop = PERL_LOAD(b->cx, PERL_CX_READ, __u64, p->cx_oldcop);
			}
			retop = 1; /* not where a run loop starts */
		}
		ix = next;
		if ((type == p->cxt_sub || type == p->cxt_sub + 1) && retop == 0) {
			/* call_sv started the run loop here: the rest is the
			 * next one's, and its stackinfo's if this one ends. */
			if (ix < 0) {
				err = PERL_ERR_READ;
				if (perl_read(&prev, sizeof(prev), si + p->si_prev))
					goto fail;
				if (prev) {
					if (perl_si(p, prev, &ix))
						goto fail;
					si = prev;
				}
			}
			goto next_loop;
		}
	}
	/* More contexts than one run takes: another run, same run loop. */
	s->rt_data[0] = si;
	s->rt_data[1] = (s->rt_data[1] & ~0xffffffffull) | (__u32)ix;
	s->rt_data[2] = cop;
	if (walk_tail_call(ctx, s, st, progs, WALK_PERL)) {
		set_reason(s, STOP_DEPTH);
		return finish_walk(s, st);
	}
	err = PERL_ERR_READ;
	goto fail;
next_loop:
	s->rt_data[0] = si;
	s->rt_data[1] = (s->rt_data[1] & ~0xffffffffull) | (__u32)ix;
	s->rt_data[2] = cop;
done:
	s->rt_handled = 1;
	return walk_native(ctx, s, st, progs);
fail:
	if (cs && err < PERL_ERRORS)
		cs->errors[err]++;
	set_reason(s, STOP_RUNTIME);
	s->rt_kind = RUNTIME_NONE;
	return walk_native(ctx, s, st, progs);
}

WALK_PROGRAM("perf_event", perl_step, unwind_progs, perl_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct perl_bufs *unused_perl_bufs __attribute__((unused));
enum perl_frame_kind *unused_perl_frame_kind __attribute__((unused));
enum perl_limits *unused_perl_limits __attribute__((unused));
enum perl_error *unused_perl_error __attribute__((unused));

#endif /* PROFSYM_PERL_H */
