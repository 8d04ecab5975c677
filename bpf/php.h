/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * PHP: PHP frames in the user stack walk (docs/runtimes.md).
 *
 * The native walker (walk.h) hands this walker every PC of a PHP process's
 * VM loop (execute_ex). PHP 8's VM calls PHP functions without a C call:
 * one execute_ex frame runs the chain of zend_execute_data that starts at
 * executor_globals.current_execute_data (innermost first, linked by
 * prev_execute_data) down to the first one flagged ZEND_CALL_TOP, the one
 * execute_ex was entered with (the script's body, or a function a built-in
 * called back through zend_call_function). Built-in functions the VM calls
 * are in the chain too (their C code is native frames above execute_ex).
 * The walker pushes those frames in place of the execute_ex frame
 * (rt_handled), keeps its place in the chain in rt_data[0] across its runs
 * within one walk, and goes back to the native walker: PHP -> array_map ->
 * closure stacks keep their order.
 *
 * A PHP frame is pushed as ptr = the zend_function, aux = the line of the
 * frame's opline (low 32 bits; 0 for a built-in) | a function id << 32 (a
 * hash of the function's name, class, file and first line pointers and
 * numbers, read here), so that the host, naming the frame later, can tell
 * whether the function at ptr is still the one sampled (functions of a
 * request are freed at its end under FPM).
 *
 * A file's code outside any function ({main}: the script's body, an
 * included file's, eval'd code) has no name, and its op_array is a copy
 * per request even under opcache, freed at the request's end, long before
 * the host names the frame. Its frame is pushed as FRAME_PHP_MAIN: ptr =
 * the op_array's filename zend_string (opcache keeps it in shared memory,
 * past the request), aux = the line | an id of that string (its pointer,
 * hash and length) << 32.
 *
 * executor_globals is a plain global of non-thread-safe builds (Debian's):
 * the host refuses thread-safe ones. Offsets come from the host
 * (internal/host/runtimes/php), per PHP version; every one is bounded here
 * again for the verifier and for hostile processes.
 */
#ifndef PROFSYM_PHP_H
#define PROFSYM_PHP_H

/* Frame kinds of PHP's block (runtime.h). */
enum php_frame_kind {
	FRAME_PHP = FRAME_PHP_FIRST,          /* a PHP or built-in function: see above */
	FRAME_PHP_MAIN = FRAME_PHP_FIRST + 1, /* a file's code outside functions: see above */
};

enum php_limits {
	PHP_FRAMES_PER_PROG = 16, /* PHP frames per run */
	PHP_EX_READ = 64,         /* bytes of a zend_execute_data read */
	PHP_FUNC_READ = 256,      /* at most this much of a zend_function */
	PHP_FUNC_COMMON = 64,     /* its common part, all a built-in has to have */
	PHP_MAX_PROCS = 4096,
};

/* Why a PHP walk ended early (php_counters.errors). */
enum php_error {
	PHP_ERR_NOT_ATTACHED = 0, /* no php_procs entry (yet) */
	PHP_ERR_REFUSED = 1,      /* the host refused this PHP */
	PHP_ERR_READ = 2,         /* executor_globals unreadable */
	PHP_ERR_READ_FRAME = 3,   /* a zend_execute_data unreadable */
	PHP_ERR_READ_FUNC = 4,    /* a zend_function unreadable */
	PHP_ERR_BAD_FUNC = 5,     /* a function of no known type */
	PHP_ERR_CHAIN_END = 6,    /* more execute_ex calls than ZEND_CALL_TOP frames */
	PHP_ERR_LOOP = 7,         /* a frame links back to itself or to the first */
	PHP_ERRORS = 8,
};

/* zend_function.type values (Zend/zend_compile.h). */
enum php_func_type {
	PHP_INTERNAL_FUNCTION = 1,
	PHP_USER_FUNCTION = 2,
	PHP_EVAL_CODE = 4,
};

/* Per process, written by the host at attach. Offsets are bytes. */
struct php_proc {
	__u64 current_ex;     /* &executor_globals.current_execute_data; 0: refused */
	__u32 call_top;       /* the ZEND_CALL_TOP bit of This.u1.type_info */
	__u16 ex_opline;      /* zend_execute_data.opline */
	__u16 ex_func;        /* zend_execute_data.func */
	__u16 ex_info;        /* zend_execute_data.This.u1.type_info */
	__u16 ex_prev;        /* zend_execute_data.prev_execute_data */
	__u16 fn_name;        /* zend_function.common.function_name */
	__u16 fn_scope;       /* zend_function.common.scope */
	__u16 fn_filename;    /* zend_op_array.filename */
	__u16 fn_line_start;  /* zend_op_array.line_start (line_end follows) */
	__u16 fn_size;        /* bytes of a user function to read: <= PHP_FUNC_READ */
	__u16 op_lineno;      /* zend_op.lineno */
	__u16 str_hash;       /* zend_string.h */
	__u16 str_len;        /* zend_string.len */
};

struct php_counters {
	__u64 walks;  /* samples that reached a PHP VM loop */
	__u64 frames; /* PHP frames pushed */
	__u64 errors[PHP_ERRORS];
};

struct php_bufs {
	__u8 ex[PHP_EX_READ];
	__u8 fn[PHP_FUNC_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PHP_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct php_proc);
} php_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WALK_SLOTS); /* enum walk_slot */
	__type(key, __u32);
	__type(value, struct php_bufs);
} php_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct php_counters);
} php_stats SEC(".maps");

/* rt_data use: [0] the next frame of the chain, [1] PHP_STARTED once the
 * chain was found in this walk, [2] its first frame. A chain that comes
 * back to its first frame, or a frame that is its own caller, is forged or
 * torn: the walk ends there with STOP_RUNTIME. Longer loops end at the
 * depth limit. */
#define PHP_STARTED 1

/* Loads from the scratch buffers at an offset the host chose: bounded for
 * the verifier (and against a bad layout). */
#define PHP_LOAD(buf, size, type, off) \
	((off) <= (size) - sizeof(type) ? *(type *)((buf) + ((off) & ((size) - 1))) : (type)0)

/* Asks the host to attach (again) to a PHP process it has no entry for (it
 * had not mapped its binary fully when the host looked): a process reread
 * (PROC_REMAP), at most every 100 ms. */
static __always_inline void php_ask_attach(struct unwind_state *s, struct stats *st)
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

/* The id of a function (see above); the host computes the same (funcID in
 * internal/host/runtimes/php). Never 0. */
static __always_inline __u64 php_func_id(struct php_proc *p, struct php_bufs *b, __u8 type)
{
	__u64 h = mix(0xcbf29ce484222325ull, type);

	h = mix(h, PHP_LOAD(b->fn, PHP_FUNC_READ, __u64, p->fn_name));
	h = mix(h, PHP_LOAD(b->fn, PHP_FUNC_READ, __u64, p->fn_scope));
	if (type != PHP_INTERNAL_FUNCTION) {
		h = mix(h, PHP_LOAD(b->fn, PHP_FUNC_READ, __u64, p->fn_filename));
		h = mix(h, PHP_LOAD(b->fn, PHP_FUNC_READ, __u32, p->fn_line_start));
	}
	h = (__u32)(h ^ (h >> 32));
	return h ? h : 1;
}

/* The id of a filename zend_string at str (see above); the host computes
 * the same (mainID in internal/host/runtimes/php). Never 0; 0 when the
 * string is unreadable. */
static __always_inline __u64 php_main_id(struct php_proc *p, __u64 str)
{
	__u64 hash, len, h;

	if (bpf_probe_read_user(&hash, sizeof(hash), (void *)(str + p->str_hash)) ||
	    bpf_probe_read_user(&len, sizeof(len), (void *)(str + p->str_len)))
		return 0;
	h = mix(0xcbf29ce484222325ull, FRAME_PHP_MAIN);
	h = mix(h, str);
	h = mix(h, hash);
	h = mix(h, len);
	h = (__u32)(h ^ (h >> 32));
	return h ? h : 1;
}

static __always_inline int php_walk(void *ctx, struct unwind_state *s, struct stats *st, void *progs)
{
	__u32 zero = 0, slot = s->slot, err = PHP_ERR_NOT_ATTACHED, info, line;
	__u64 fsize; /* 64-bit: the bounds checked are those of the register passed */
	struct php_proc *p = bpf_map_lookup_elem(&php_procs, &s->tgid);
	struct php_bufs *b = bpf_map_lookup_elem(&php_scratch, &slot);
	struct php_counters *cs = bpf_map_lookup_elem(&php_stats, &zero);
	__u64 cur, prev, fn, opline, file, id;
	__u8 type, kind;

	if (!b || !cs)
		goto fail;
	if (!p) {
		php_ask_attach(s, st);
		goto fail;
	}
	err = PHP_ERR_REFUSED;
	fsize = p->fn_size;
	if (p->current_ex == 0 || fsize < PHP_FUNC_COMMON || fsize > PHP_FUNC_READ)
		goto fail;
	if (!(s->rt_data[1] & PHP_STARTED)) {
		s->rt_data[1] |= PHP_STARTED;
		cs->walks++;
		err = PHP_ERR_READ;
		if (bpf_probe_read_user(&cur, sizeof(cur), (void *)p->current_ex))
			goto fail;
		s->rt_data[0] = cur;
		s->rt_data[2] = cur;
	}
	cur = s->rt_data[0];
	for (int i = 0; i < PHP_FRAMES_PER_PROG; i++) {
		err = PHP_ERR_CHAIN_END;
		if (cur == 0)
			goto fail;
		err = PHP_ERR_READ_FRAME;
		if (bpf_probe_read_user(b->ex, PHP_EX_READ, (void *)cur))
			goto fail;
		prev = PHP_LOAD(b->ex, PHP_EX_READ, __u64, p->ex_prev);
		fn = PHP_LOAD(b->ex, PHP_EX_READ, __u64, p->ex_func);
		info = PHP_LOAD(b->ex, PHP_EX_READ, __u32, p->ex_info);
		opline = PHP_LOAD(b->ex, PHP_EX_READ, __u64, p->ex_opline);
		err = PHP_ERR_LOOP;
		if (prev == cur || prev == s->rt_data[2])
			goto fail;
		/* A frame without a function (zend_call_function's dummy
		 * frame) is no call: stepped over. */
		if (fn != 0) {
			err = PHP_ERR_READ_FUNC;
			/* A built-in's zend_internal_function is shorter than a
			 * user function's op_array: its common part is enough. */
			if (probe_read_user_upto(b->fn, fsize, PHP_FUNC_READ, fn) &&
			    bpf_probe_read_user(b->fn, PHP_FUNC_COMMON, (void *)fn))
				goto fail;
			type = b->fn[0];
			line = 0;
			if (type == PHP_USER_FUNCTION || type == PHP_EVAL_CODE) {
				if (opline == 0 ||
				    bpf_probe_read_user(&line, sizeof(line), (void *)(opline + p->op_lineno)))
					line = 0;
				/* A frame the VM has just entered has no opline yet
				 * (what is there is the VM stack's leftovers): a
				 * line outside the function's is none. */
				if (line < PHP_LOAD(b->fn, PHP_FUNC_READ, __u32, p->fn_line_start) ||
				    line > PHP_LOAD(b->fn, PHP_FUNC_READ, __u32, p->fn_line_start + 4))
					line = 0;
			} else if (type != PHP_INTERNAL_FUNCTION) {
				err = PHP_ERR_BAD_FUNC;
				goto fail;
			}
			kind = FRAME_PHP;
			id = 0;
			if (type != PHP_INTERNAL_FUNCTION &&
			    PHP_LOAD(b->fn, PHP_FUNC_READ, __u64, p->fn_name) == 0) {
				file = PHP_LOAD(b->fn, PHP_FUNC_READ, __u64, p->fn_filename);
				if (file != 0 && (id = php_main_id(p, file)) != 0) {
					kind = FRAME_PHP_MAIN;
					fn = file;
				}
			}
			if (kind == FRAME_PHP)
				id = php_func_id(p, b, type);
			if (push_runtime_frame(s, kind, fn, line | id << 32))
				return finish_walk(s, st);
			cs->frames++;
		}
		cur = prev;
		if (info & p->call_top) {
			s->rt_data[0] = cur;
			goto done;
		}
	}
	/* This execute_ex call runs more frames: another run of this walker. */
	s->rt_data[0] = cur;
	if (walk_tail_call(ctx, s, st, progs, WALK_PHP)) {
		set_reason(s, STOP_DEPTH);
		return finish_walk(s, st);
	}
	err = PHP_ERR_READ;
fail:
	if (cs && err < PHP_ERRORS)
		cs->errors[err]++;
	/* The rest of the stack keeps its native frames. */
	set_reason(s, STOP_RUNTIME);
	s->rt_kind = RUNTIME_NONE;
	return walk_native(ctx, s, st, progs);
done:
	s->rt_handled = 1;
	return walk_native(ctx, s, st, progs);
}

WALK_PROGRAM("perf_event", php_step, unwind_progs, php_walk, WALK_SLOT_CPU)

/* Anchors for bpf2go's -type. */
struct php_bufs *unused_php_bufs __attribute__((unused));
enum php_frame_kind *unused_php_frame_kind __attribute__((unused));
enum php_limits *unused_php_limits __attribute__((unused));
enum php_error *unused_php_error __attribute__((unused));
enum php_func_type *unused_php_func_type __attribute__((unused));

#endif /* PROFSYM_PHP_H */
