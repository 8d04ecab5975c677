/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Ruby: Ruby frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker (walk.h) hands this walker every PC of a Ruby
 * process's VM entry (rb_vm_exec, which runs vm_exec_core: that one is
 * static and Debian strips .symtab, rb_vm_exec is exported). Ruby's VM
 * calls Ruby methods and blocks without a C call: one VM entry runs the
 * control frames from the thread's ec->cfp (innermost) towards the end of
 * its VM stack, each the caller of the one before, down to the first one
 * flagged VM_FRAME_FLAG_FINISH: the one the VM was entered with (the
 * script's top, or a block a C function yielded to). C functions the VM
 * calls are control frames too (VM_FRAME_MAGIC_CFUNC; their C code is
 * native frames above the VM entry). The walker pushes those frames in
 * place of the rb_vm_exec frame (rt_handled), keeps its place in rt_data
 * across its runs within one walk, and goes back to the native walker:
 * Ruby -> Array#each -> block stacks keep their order.
 *
 * The thread's execution context is the TLS variable ruby_current_ec: the
 * host resolves its offset from the thread pointer (the TLS descriptor or
 * GOT slot the dynamic loader filled in), so every thread finds its own.
 *
 * A Ruby frame is pushed as ptr = the rb_iseq_t, aux = the instruction
 * index of its pc (pc - iseq_encoded) and the method entry of its local
 * environment (the method a block is in), packed (RUBY_IDX_SHIFT): the
 * host names it "Class#method" / "block in Class#method" from both and
 * finds the line at the index; it checks the iseq and the entry are still
 * such objects and the index inside the iseq. A C function frame is
 * pushed as ptr = its method entry (rb_callable_method_entry_t), aux = 0.
 *
 * Offsets come from the host (internal/host/runtimes/ruby), per Ruby
 * version; every one is bounded here again for the verifier and for
 * hostile processes.
 */
#ifndef PROFSYM_RUBY_H
#define PROFSYM_RUBY_H

/* Frame kinds of Ruby's block (runtime.h). */
enum ruby_frame_kind {
	FRAME_RUBY_ISEQ = FRAME_RUBY_FIRST,      /* a method, block, class body, top: ptr iseq, aux pc */
	FRAME_RUBY_CFUNC = FRAME_RUBY_FIRST + 1, /* a C function: ptr method entry */
};

enum ruby_limits {
	RUBY_FRAMES_PER_PROG = 16, /* control frames per run */
	RUBY_CFP_READ = 64,        /* bytes of a control frame read */
	RUBY_EC_READ = 32,         /* bytes of an execution context read */
	RUBY_MAX_PROCS = 4096,
	RUBY_MAX_STACK = 64 << 20, /* the most VM stack a thread is believed to have */
	RUBY_MAX_TLS_MODULE = 1 << 16,
};

/* Why a Ruby walk ended early (ruby_counters.errors). */
enum ruby_error {
	RUBY_ERR_NOT_ATTACHED = 0, /* no ruby_procs entry (yet) */
	RUBY_ERR_REFUSED = 1,      /* the host refused this Ruby */
	RUBY_ERR_READ_EC = 2,      /* the thread's execution context unreadable */
	RUBY_ERR_BAD_EC = 3,       /* an execution context whose cfp is outside its stack */
	RUBY_ERR_READ_FRAME = 4,   /* a control frame unreadable */
	RUBY_ERR_READ_ENV = 5,     /* a frame's environment (flags) unreadable */
	RUBY_ERR_STACK_END = 6,    /* more VM entries than FINISH frames */
	RUBY_ERR_NO_TP = 7,        /* no thread pointer (not x86-64) */
	RUBY_ERRORS = 8,
};

/* vm_core.h: frame magic and flags of ep[VM_ENV_DATA_INDEX_FLAGS]. */
enum ruby_frame_flags {
	RUBY_FRAME_MAGIC_MASK = 0x7fff0001,
	RUBY_FRAME_MAGIC_CFUNC = 0x55550001,
	RUBY_FRAME_MAGIC_IFUNC = 0x66660001,
	RUBY_FRAME_MAGIC_DUMMY = 0x79990001,
	RUBY_FRAME_FLAG_FINISH = 0x0020,
	RUBY_ENV_FLAG_LOCAL = 0x0002,
};

/* An iseq frame's aux: the method entry (or cref) of its local
 * environment in the low RUBY_IDX_SHIFT bits (user addresses of x86-64
 * fit), the pc's instruction index (pc - iseq_encoded, in VALUEs) above;
 * RUBY_IDX_UNKNOWN when unreadable or too large. */
#define RUBY_IDX_SHIFT 47
#define RUBY_ADDR_MASK ((1ull << RUBY_IDX_SHIFT) - 1)
#define RUBY_IDX_UNKNOWN ((1ull << (64 - RUBY_IDX_SHIFT)) - 1)
#define RUBY_EP_HOPS 4 /* block nesting followed to the method's environment */

/* Per process, written by the host at attach. Offsets are bytes. */
struct ruby_proc {
	__s64 ec_tls;       /* ruby_current_ec: offset from the thread pointer, or in the TLS block */
	__u32 tls_module;   /* tls_dtv: libruby's TLS module id */
	__u8 refused;       /* 1: the host refused this Ruby */
	__u8 tls_dtv;       /* 1: ec_tls is in the block the thread's DTV has for tls_module */
	__u8 tls_candidates; /* not 0: ec_tls unknown, bit i says it may be 8 * i (see ruby_find_ec) */
	__u8 pad;
	__u16 cfp_size;     /* sizeof(rb_control_frame_t) */
	__u16 ec_vm_stack;  /* rb_execution_context_t.vm_stack */
	__u16 ec_stack_len; /* rb_execution_context_t.vm_stack_size (in VALUEs) */
	__u16 ec_cfp;       /* rb_execution_context_t.cfp */
	__u16 cfp_pc;       /* rb_control_frame_t.pc */
	__u16 cfp_iseq;     /* rb_control_frame_t.iseq */
	__u16 cfp_ep;       /* rb_control_frame_t.ep */
	__u16 iseq_body;    /* rb_iseq_t.body */
	__u16 body_encoded; /* rb_iseq_constant_body.iseq_encoded */
};

struct ruby_counters {
	__u64 walks;  /* samples that reached a Ruby VM entry */
	__u64 frames; /* Ruby frames pushed */
	__u64 errors[RUBY_ERRORS];
};

struct ruby_bufs {
	__u8 ec[RUBY_EC_READ];
	__u8 cfp[RUBY_CFP_READ];
	__u64 env[3]; /* ep[-2] (method entry), ep[-1], ep[0] (flags) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RUBY_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct ruby_proc);
} ruby_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct ruby_bufs);
} ruby_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ruby_counters);
} ruby_stats SEC(".maps");

/* rt_data use: [0] the next control frame, [1] RUBY_STARTED once the
 * thread's frames were found in this walk, [2] the end of its VM stack
 * (control frames live below it, the caller at the higher address).
 * Frames only move towards the end: a walk cannot loop, and it ends at
 * the end of the stack (the depth limit bounds it besides). */
#define RUBY_STARTED 1

#define RUBY_LOAD(buf, size, type, off) \
	((off) <= (size) - sizeof(type) ? *(type *)((buf) + ((off) & ((size) - 1))) : (type)0)

struct thread_struct___ruby {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___ruby {
	struct thread_struct___ruby thread;
} __attribute__((preserve_access_index));

/* x86-64: the thread pointer is fsbase (as cpython.h reads it).
 * libruby's ruby_current_ec is general-dynamic TLS (Debian): the host
 * gives its module id, read from the GOT slot the loader filled. */
static __always_inline __u64 ruby_thread_pointer(void)
{
#if defined(__TARGET_ARCH_x86)
	struct task_struct___ruby *t = (void *)bpf_get_current_task();
	return BPF_CORE_READ(t, thread.fsbase);
#else
	return 0;
#endif
}

/* Asks the host to attach (again) to a Ruby process it has no entry for:
 * a process reread (PROC_REMAP), at most every 100 ms. */
static __always_inline void ruby_ask_attach(struct unwind_state *s, struct stats *st)
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

/* Reads the execution context whose address is at slot: its current
 * control frame and the end of its VM stack. Returns 0, or why not. */
static __always_inline __u32 ruby_read_ec(struct ruby_proc *p, struct ruby_bufs *b, __u64 slot, __u64 *cfp, __u64 *end)
{
	__u64 ec, stack, len, cur;

	if (bpf_probe_read_user(&ec, sizeof(ec), (void *)slot) || ec == 0 ||
	    bpf_probe_read_user(b->ec, RUBY_EC_READ, (void *)ec))
		return RUBY_ERR_READ_EC;
	stack = RUBY_LOAD(b->ec, RUBY_EC_READ, __u64, p->ec_vm_stack);
	len = RUBY_LOAD(b->ec, RUBY_EC_READ, __u64, p->ec_stack_len);
	cur = RUBY_LOAD(b->ec, RUBY_EC_READ, __u64, p->ec_cfp);
	if (len == 0 || len > RUBY_MAX_STACK / 8 || cur < stack || cur >= stack + len * 8)
		return RUBY_ERR_BAD_EC;
	*cfp = cur;
	*end = stack + len * 8;
	return 0;
}

static __always_inline int ruby_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, slot = s->slot, err = RUBY_ERR_NOT_ATTACHED, magic;
	struct ruby_proc *p = bpf_map_lookup_elem(&ruby_procs, &s->tgid);
	struct ruby_bufs *b = bpf_map_lookup_elem(&ruby_scratch, &slot);
	struct ruby_counters *cs = bpf_map_lookup_elem(&ruby_stats, &zero);
	__u64 cur, end, tp, dtv, pc, iseq, ep, size, flags, me, body, enc, idx;

	if (!b || !cs)
		goto fail;
	if (!p) {
		ruby_ask_attach(s, st);
		goto fail;
	}
	err = RUBY_ERR_REFUSED;
	size = p->cfp_size;
	if (p->refused || size < 8 || size > RUBY_CFP_READ)
		goto fail;
	if (!(s->rt_data[1] & RUBY_STARTED)) {
		s->rt_data[1] |= RUBY_STARTED;
		cs->walks++;
		err = RUBY_ERR_NO_TP;
		tp = ruby_thread_pointer();
		if (tp == 0)
			goto fail;
		err = RUBY_ERR_READ_EC;
		/* glibc x86-64: tcbhead_t.dtv at tp + 8, 16-byte dtv_t entries
		 * whose first word is the module's block. */
		if (p->tls_dtv) {
			if (p->tls_module == 0 || p->tls_module > RUBY_MAX_TLS_MODULE ||
			    bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + 8)) ||
			    bpf_probe_read_user(&tp, sizeof(tp), (void *)(dtv + 16 * (__u64)p->tls_module)) ||
			    tp == 0 || tp == ~0ull)
				goto fail;
		}
		if (p->tls_candidates) {
			/* A build that hides ruby_current_ec: the host gave the
			 * slots of libruby's TLS block it may be; the first whose
			 * value reads as an execution context is it, kept. */
			err = RUBY_ERR_BAD_EC;
			for (int i = 0; i < 8; i++) {
				if (!(p->tls_candidates & (1u << i)))
					continue;
				if (!ruby_read_ec(p, b, tp + 8 * i, &cur, &end)) {
					p->ec_tls = 8 * i;
					p->tls_candidates = 0;
					err = 0;
					break;
				}
			}
			if (err)
				goto fail;
		} else if ((err = ruby_read_ec(p, b, tp + p->ec_tls, &cur, &end))) {
			goto fail;
		}
		s->rt_data[0] = cur;
		s->rt_data[2] = end;
	}
	cur = s->rt_data[0];
	end = s->rt_data[2];
	for (int i = 0; i < RUBY_FRAMES_PER_PROG; i++) {
		err = RUBY_ERR_STACK_END;
		if (cur + size > end)
			goto fail;
		err = RUBY_ERR_READ_FRAME;
		if (probe_read_user_upto(b->cfp, size, RUBY_CFP_READ, cur))
			goto fail;
		pc = RUBY_LOAD(b->cfp, RUBY_CFP_READ, __u64, p->cfp_pc);
		iseq = RUBY_LOAD(b->cfp, RUBY_CFP_READ, __u64, p->cfp_iseq);
		ep = RUBY_LOAD(b->cfp, RUBY_CFP_READ, __u64, p->cfp_ep);
		err = RUBY_ERR_READ_ENV;
		if (ep < 16 || bpf_probe_read_user(b->env, sizeof(b->env), (void *)(ep - 16)))
			goto fail;
		flags = b->env[2];
		magic = flags & RUBY_FRAME_MAGIC_MASK;
		if (magic == RUBY_FRAME_MAGIC_CFUNC) {
			if (push_runtime_frame(s, FRAME_RUBY_CFUNC, b->env[0], 0))
				return finish_walk(s, st);
			cs->frames++;
		} else if (magic != RUBY_FRAME_MAGIC_IFUNC && magic != RUBY_FRAME_MAGIC_DUMMY && iseq != 0 && pc != 0) {
			/* The method entry is in the local environment: a block's
			 * is a few previous environments up. */
			for (int h = 0; h < RUBY_EP_HOPS && !(b->env[2] & RUBY_ENV_FLAG_LOCAL); h++) {
				ep = b->env[1] & ~3ull;
				if (ep < 16 || bpf_probe_read_user(b->env, sizeof(b->env), (void *)(ep - 16)))
					b->env[2] = 0, h = RUBY_EP_HOPS;
			}
			me = (b->env[2] & RUBY_ENV_FLAG_LOCAL) ? b->env[0] & RUBY_ADDR_MASK : 0;
			idx = RUBY_IDX_UNKNOWN;
			if (!bpf_probe_read_user(&body, sizeof(body), (void *)(iseq + p->iseq_body)) &&
			    !bpf_probe_read_user(&enc, sizeof(enc), (void *)(body + p->body_encoded)) && pc >= enc &&
			    (pc - enc) / 8 < RUBY_IDX_UNKNOWN)
				idx = (pc - enc) / 8;
			if (push_runtime_frame(s, FRAME_RUBY_ISEQ, iseq, me | idx << RUBY_IDX_SHIFT))
				return finish_walk(s, st);
			cs->frames++;
		}
		cur += size;
		if (flags & RUBY_FRAME_FLAG_FINISH) {
			s->rt_data[0] = cur;
			goto done;
		}
	}
	/* This VM entry runs more frames: another run of this walker. */
	s->rt_data[0] = cur;
	if (walk_tail_call(ctx, s, st, progs, WALK_RUBY)) {
		set_reason(s, STOP_DEPTH);
		return finish_walk(s, st);
	}
	err = RUBY_ERR_READ_FRAME;
fail:
	if (cs && err < RUBY_ERRORS)
		cs->errors[err]++;
	/* The rest of the stack keeps its native frames. */
	set_reason(s, STOP_RUNTIME);
	s->rt_kind = RUNTIME_NONE;
	return walk_native(ctx, s, st, progs);
done:
	s->rt_handled = 1;
	return walk_native(ctx, s, st, progs);
}

WALK_PROGRAM("perf_event", ruby_step, unwind_progs, ruby_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct ruby_bufs *unused_ruby_bufs __attribute__((unused));
enum ruby_frame_kind *unused_ruby_frame_kind __attribute__((unused));
enum ruby_limits *unused_ruby_limits __attribute__((unused));
enum ruby_error *unused_ruby_error __attribute__((unused));
enum ruby_frame_flags *unused_ruby_frame_flags __attribute__((unused));

#endif /* PROFSYM_RUBY_H */
