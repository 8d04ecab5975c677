//go:build ignore

// SPDX-License-Identifier: GPL-2.0-only
/*
 * profsym CPU sampler.
 *
 * A perf_event program runs on every CPU at the configured frequency and
 * records pid, tid, comm, CPU, kernel and user stack. Two interchangeable
 * programs exist so the trade-off can be re-measured (see
 * internal/sampler/README.md):
 *
 *   profile_agg     aggregates in the kernel: counts in a hash map keyed by
 *                   pid/tid/cpu/stack ids, stacks in STACK_TRACE maps. Two
 *                   buffers; userspace flips active_buf and drains the idle
 *                   one. This is the default.
 *   profile_rb      sends every sample through a ring buffer and lets
 *                   userspace aggregate.
 *
 * Both notify userspace once per new process (events ring buffer), and the
 * tp_btf hooks notify on exec and on process exit so that userspace can read
 * /proc/PID/maps before the address space changes or goes away.
 *
 * User stacks come from bpf_get_stackid (frame pointers) or, when the loader
 * sets unwind_cfi, from the table-driven walker of unwind.h (profile_agg
 * only): its stacks go to the ustacks maps, keyed by a hash of the frames.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "types.h"

#define MAX_STACK_DEPTH 127 /* kernel's sysctl_perf_event_max_stack default */
#define EEXIST 17
#define ENOMEM 12
#define E2BIG 7
#define EFAULT 14
#define PF_EXITING 0x00000004 /* include/linux/sched.h */

char LICENSE[] SEC("license") = "GPL"; /* bpf_get_stack{,id} are GPL-only */

/* Set by the loader before load. */
volatile const bool kernel_stacks = true;
volatile const __u32 max_depth = MAX_STACK_DEPTH;
/* Walk user stacks with unwind tables (unwind.h) instead of frame pointers. */
volatile const bool unwind_cfi = false;

/* Only tasks whose cgroup (v2) is in selected_cgroups are sampled and
 * walked: the receiver's targets all name cgroups. */
volatile const bool cgroup_select = false;

/* Which aggregation buffer (0 or 1) the agg program writes; flipped by
 * userspace through the mmapped .bss before draining the other one. */
__u32 active_buf = 0;

struct sample_key {
	__u32 pid; /* tgid */
	__u32 tid;
	__u32 cpu;
	__s32 kstack; /* stack id, -1 when none */
	__s32 ustack; /* stack id, -1 when none, -2: walked, see uhash */
	__u32 origin; /* enum sample_origin */
	__u64 uhash;  /* key of the walked user stack in ustacks0/1 */
	__u64 labels; /* Go: the running goroutine's labels pointer, 0: none (golabels.h) */
	/* The span the thread published (threadctx.h), zero: none. */
	__u8 trace_id[16];
	__u8 span_id[8];
};

struct sample_value {
	__u64 count;
	__u64 first_ns; /* CLOCK_BOOTTIME */
	__u64 last_ns;
	char comm[16];
};

struct rb_sample {
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 kstack_len; /* frames */
	__u32 ustack_len; /* frames */
	__u32 pad;
	__u64 ts_ns;
	char comm[16];
	/* kstack_len kernel frames, then ustack_len user frames; only the used
	 * part is sent, so a record is a few hundred bytes, not 2 KB. */
	__u64 frames[2 * MAX_STACK_DEPTH];
};

/* Per-CPU counters; userspace sums them. */
struct stats {
	__u64 samples;         /* program runs attributed to a task (idle skipped) */
	__u64 lost_stack;      /* stack id errors: -EEXIST bucket collision, -ENOMEM */
	__u64 lost_map_full;   /* counts hash full */
	__u64 lost_ringbuf;    /* sample ring buffer reserve failed */
	__u64 lost_events;     /* process event ring buffer reserve failed */
	__u64 truncated;       /* a stack reached max_depth (ring buffer mode) */
	__u64 unwind_frames;   /* frames walked with unwind tables or FP fallback */
	__u64 unwind_tail_fail;/* a tail call into the walker failed */
	__u64 stack_copies;    /* not-ready samples whose stack went to userspace (stack_copies) */
	__u64 stack_copy_lost; /* ... that could not be sent (ring full): walked with FP, not_ready */
	__u64 stops[STOP_SLOTS]; /* walked stacks by enum stop_reason */
	__u64 selection[SELECT_VERDICTS]; /* samples by enum select_verdict (cgroup_select) */
};

enum proc_event_kind {
	PROC_NEW = 1,  /* first sample of this tgid */
	PROC_EXEC = 2, /* a sampled tgid replaced its image */
	PROC_EXIT = 3, /* a sampled tgid's last thread is exiting */
	PROC_REMAP = 4, /* a PC in no known mapping: reread /proc/PID/maps */
	PROC_TABLE = 5, /* a table in TABLE_LAZY state was sampled; pid holds its slot */
	PROC_OFFCPU = 6, /* off-CPU profiles must know whether they target this tgid (offcpu.h) */
};

struct proc_event {
	__u32 pid;
	__u32 kind;
	__u64 ts_ns;
	__u32 has_mm; /* exit: address space not yet torn down */
	__u32 pad;
};

/* BTF keeps only types reachable from a symbol; these anchor the ring buffer
 * record types for bpf2go's -type. */
struct rb_sample *unused_rb_sample __attribute__((unused));
struct proc_event *unused_proc_event __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stats);
} stats_map SEC(".maps");

/* Sizes below are defaults; the loader overrides them before load. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sample_key);
	__type(value, struct sample_value);
} counts0 SEC(".maps"), counts1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, MAX_STACK_DEPTH * sizeof(__u64));
} stacks0 SEC(".maps"), stacks1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by the loader per CPU count */
} samples SEC(".maps");

/* Where a ring buffer record is assembled before its used part is copied. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rb_sample);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

/* Never read by a program. Updating an ARRAY_OF_MAPS from userspace makes
 * the kernel wait for an RCU grace period (maybe_wait_bpf_programs()), i.e.
 * for every program that may still use the old active_buf to finish, so the
 * drained buffer is quiescent. */
struct barrier_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} barrier_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct barrier_inner);
} barrier SEC(".maps") = {
	.values = { &barrier_inner },
};

/* The cgroup ids (v2: the directory's inode number) selected, kept
 * current by userspace; one entry unless cgroup_select. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u8);
} selected_cgroups SEC(".maps");

/* Set by userspace (mmapped .bss) while the selection has more cgroups
 * than selected_cgroups holds: then every cgroup passes and the filter
 * after sampling decides, so that nothing selected is lost. */
__u32 cgroup_select_all = 0;

/* tgids already announced to userspace, with 1 + the stack copies of
 * their current image (unwind.h). LRU: an evicted entry only causes a
 * duplicate PROC_NEW, which userspace tolerates. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u8);
} seen SEC(".maps");

/* When each sampled process last replaced its image (CLOCK_BOOTTIME).
 * Userspace gives a stack copy taken before that no user frames
 * (STOP_EXEC): they belong to a program the process no longer runs,
 * whatever snapshot of it userspace read. Written at exec, before any
 * /proc read can show the new image; LRU, kept past exit for the copies
 * still waiting. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} exec_times SEC(".maps");

static __always_inline struct stats *get_stats(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&stats_map, &zero);
}

/* Whether the current task's cgroup is selected; counts the verdict in
 * verdicts. Free when no selection is configured: cgroup_select is a
 * constant, so the verifier drops the rest. */
static __always_inline bool cgroup_selected(__u64 *verdicts)
{
	__u64 id;

	if (!cgroup_select)
		return true;
	id = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&selected_cgroups, &id) && !cgroup_select_all) {
		verdicts[SELECT_NOT_SELECTED]++;
		return false;
	}
	verdicts[SELECT_SELECTED]++;
	return true;
}

static __always_inline bool emit_event(struct stats *st, __u32 pid, __u32 kind, __u32 has_mm)
{
	struct proc_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		if (st)
			st->lost_events++;
		return false;
	}
	ev->pid = pid;
	ev->kind = kind;
	ev->ts_ns = bpf_ktime_get_boot_ns();
	ev->has_mm = has_mm;
	ev->pad = 0;
	/* Exits wake nobody: userspace reads them with the next event or its
	 * periodic poll, and a wake-up costs it more CPU than the exit. The
	 * others force one: the default wakes only a reader that has caught up,
	 * and an unread exit before them would keep it asleep. */
	bpf_ringbuf_submit(ev, kind == PROC_EXIT ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP);
	return true;
}

#include "compat.h"
#include "golabels.h"
#include "threadctx.h"
#include "unwind.h"

static __always_inline void announce(struct stats *st, __u32 tgid)
{
	__u8 one = 1;
	__u64 *gone;

	if (bpf_map_lookup_elem(&seen, &tgid))
		return;
	/* A process past its exit event (handle_exit forgot it) still runs
	 * do_exit's tail and is sampled there: announcing it again would have
	 * userspace read the maps of a zombie, empty, in place of the ones its
	 * last samples need. */
	if (BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), flags) & PF_EXITING)
		return;
	/* NOEXIST: when two CPUs race on a new tgid only one announces it. */
	if (bpf_map_update_elem(&seen, &tgid, &one, BPF_NOEXIST))
		return;
	/* Tables marked exited with another start time are a dead process's
	 * whose exit userspace has not handled yet, or never will (a lost
	 * event): this is a new process on its pid, which must not walk with
	 * them nor, once userspace loads its own, be refused for the mark. */
	gone = bpf_map_lookup_elem(&unwind_exits, &tgid);
	if (gone && *gone != BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), group_leader, start_time)) {
		bpf_map_delete_elem(&unwind_procs, &tgid);
		bpf_map_delete_elem(&unwind_exits, &tgid);
	}
	if (!emit_event(st, tgid, PROC_NEW, 1))
		bpf_map_delete_elem(&seen, &tgid); /* retry on the next sample */
}

/* Set by the loader: words of a user stack the walker keeps, at most
 * MAX_USER_FRAMES; the ustacks maps' values hold that many. */
volatile const __u32 max_user_words = MAX_USER_FRAMES;

/* Anchors for bpf2go's -type (see above). */
struct unwind_row *unused_unwind_row __attribute__((unused));
struct unwind_table *unused_unwind_table __attribute__((unused));
struct unwind_mapping *unused_unwind_mapping __attribute__((unused));
struct unwind_proc *unused_unwind_proc __attribute__((unused));
struct user_stack *unused_user_stack __attribute__((unused));
struct go_proc *unused_go_proc __attribute__((unused));
enum stop_reason *unused_stop_reason __attribute__((unused));
enum sample_origin *unused_sample_origin __attribute__((unused));
enum proc_event_kind *unused_proc_event_kind __attribute__((unused));
enum table_state *unused_table_state __attribute__((unused));
enum table_slot *unused_table_slot __attribute__((unused));
enum row_kind *unused_row_kind __attribute__((unused));
enum cfa_rule *unused_cfa_rule __attribute__((unused));
enum stack_word_bits *unused_stack_word_bits __attribute__((unused));
enum runtime_kind *unused_runtime_kind __attribute__((unused));
enum walk_prog *unused_walk_prog __attribute__((unused));
struct stack_copy *unused_stack_copy __attribute__((unused));
enum frame_kind *unused_frame_kind __attribute__((unused));
enum unwind_limits *unused_unwind_limits __attribute__((unused));
enum row_bits *unused_row_bits __attribute__((unused));
enum select_verdict *unused_select_verdict __attribute__((unused));

/* Returns the stack id, -1 for "no stack" (user stack of a kernel thread,
 * kernel stack of a sample taken in user mode), or -2 when the sample must
 * be dropped. */
static __always_inline long stack_id(void *ctx, void *map, __u64 flags, struct stats *st)
{
	long id = bpf_get_stackid(ctx, map, flags);
	if (id >= 0)
		return id;
	if (id == -EFAULT)
		return -1;
	st->lost_stack++;
	return -2;
}

/* Adds one sample to key's row. The key holds the CPU and a perf_event
 * program does not nest on one CPU, so nobody else updates this entry
 * concurrently. */
static __always_inline int count_sample(void *counts, struct sample_key *key, struct stats *st)
{
	__u64 now = bpf_ktime_get_boot_ns();
	struct sample_value *val = bpf_map_lookup_elem(counts, key);

	if (val) {
		val->count++;
		val->last_ns = now;
		return 0;
	}
	struct sample_value nv = {};
	nv.count = 1;
	nv.first_ns = now;
	nv.last_ns = now;
	bpf_get_current_comm(nv.comm, sizeof(nv.comm));
	if (bpf_map_update_elem(counts, key, &nv, BPF_NOEXIST))
		st->lost_map_full++;
	return 0;
}

static __always_inline int record_agg(void *ctx, void *counts, void *stacks, struct stats *st,
				      __u32 tgid, __u32 tid)
{
	struct sample_key key = {};
	long id;

	key.pid = tgid;
	key.tid = tid;
	key.cpu = bpf_get_smp_processor_id();
	key.kstack = -1;
	if (kernel_stacks) {
		id = stack_id(ctx, stacks, 0, st);
		if (id == -2)
			return 0;
		key.kstack = id;
	}
	id = stack_id(ctx, stacks, BPF_F_USER_STACK, st);
	if (id == -2)
		return 0;
	key.ustack = id;
	key.labels = go_labels(tgid, 0); /* arm64: no g without the walker's registers */
	thread_ctx(tgid, &key);

	return count_sample(counts, &key, st);
}

#include "walk.h"
#include "hotspot.h"
#include "cpython.h"
#include "perl.h"
#include "php.h"
#include "ruby.h"
#include "v8.h"
#include "offcpu.h"

SEC("perf_event")
int profile_agg(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct stats *st;

	if (tid == 0) /* idle task */
		return 0;
	st = get_stats();
	if (!st)
		return 0;
	/* Before anything else: an unselected task costs a lookup, no walk,
	 * no announcement (no /proc read in userspace). */
	if (!cgroup_selected(st->selection))
		return 0;
	st->samples++;
	announce(st, tgid);
	if (unwind_cfi)
		return start_walk(ctx, st, tgid, tid, ORIGIN_CPU, &unwind_progs);

	/* Two call sites so the verifier sees one constant map per call. */
	if (active_buf & 1)
		return record_agg(ctx, &counts1, &stacks1, st, tgid, tid);
	return record_agg(ctx, &counts0, &stacks0, st, tgid, tid);
}

SEC("perf_event")
int profile_rb(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__u32 depth = max_depth, zero = 0;
	struct rb_sample *s;
	struct stats *st;
	long n, kn = 0, un = 0;
	__u64 size;

	if (tid == 0)
		return 0;
	st = get_stats();
	if (!st)
		return 0;
	/* Before anything else: an unselected task costs a lookup, no walk,
	 * no announcement (no /proc read in userspace). */
	if (!cgroup_selected(st->selection))
		return 0;
	st->samples++;
	announce(st, tgid);

	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	if (depth > MAX_STACK_DEPTH)
		depth = MAX_STACK_DEPTH;
	s->pid = tgid;
	s->tid = tid;
	s->cpu = bpf_get_smp_processor_id();
	s->pad = 0;
	s->ts_ns = bpf_ktime_get_boot_ns();
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	if (kernel_stacks) {
		n = bpf_get_stack(ctx, s->frames, depth * sizeof(__u64), 0);
		if (n > 0)
			kn = n / sizeof(__u64);
	}
	if (kn > MAX_STACK_DEPTH) /* for the verifier */
		kn = MAX_STACK_DEPTH;
	n = bpf_get_stack(ctx, &s->frames[kn], depth * sizeof(__u64), BPF_F_USER_STACK);
	if (n > 0)
		un = n / sizeof(__u64);
	if (un > MAX_STACK_DEPTH)
		un = MAX_STACK_DEPTH;
	s->kstack_len = kn;
	s->ustack_len = un;
	if (kn == depth || un == depth)
		st->truncated++;
	size = __builtin_offsetof(struct rb_sample, frames) + (kn + un) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (bpf_ringbuf_output(&samples, s, size, 0))
		st->lost_ringbuf++;
	return 0;
}

/* Fires in do_exit() for every thread; only the last one ends the process.
 * signal->live was already decremented, so 0 means the whole group is dead. */
SEC("tp_btf/sched_process_exit")
int handle_exit(__u64 *ctx)
{
	struct task_struct *p = (void *)ctx[0];
	__u64 start;
	__u32 tgid;
	int sampled;

	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	tgid = BPF_CORE_READ(p, tgid);
	bpf_map_delete_elem(&go_procs, &tgid);
	offcpu_forget(tgid);
	sampled = bpf_map_delete_elem(&seen, &tgid) == 0;
	/* Its tables are kept for the rest of do_exit (its user stack may
	 * still be there, see unwind_exits) and marked; userspace deletes both
	 * on PROC_EXIT. A sampled process is marked even with no tables yet:
	 * userspace may be loading them. */
	if (sampled || bpf_map_lookup_elem(&unwind_procs, &tgid)) {
		start = BPF_CORE_READ(p, group_leader, start_time);
		bpf_map_update_elem(&unwind_exits, &tgid, &start, BPF_ANY);
	}
	if (!sampled)
		return 0;
	emit_event(get_stats(), tgid, PROC_EXIT, BPF_CORE_READ(p, mm) != 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int handle_exec(__u64 *ctx)
{
	struct task_struct *p = (void *)ctx[0];
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u64 now;
	__u8 *n;

	/* The old image's mappings are gone; userspace loads the new ones. */
	bpf_map_delete_elem(&unwind_procs, &tgid);
	bpf_map_delete_elem(&go_procs, &tgid); /* maybe no Go binary any more */
	bpf_map_delete_elem(&tctx_procs, &tgid); /* its variable is elsewhere, if anywhere */
	offcpu_forget(tgid); /* its name may have changed */
	/* Only sampled processes: announcing every exec of the host would cost
	 * a /proc read per short-lived process, most of them never sampled. */
	n = bpf_map_lookup_elem(&seen, &tgid);
	if (!n)
		return 0;
	*n = 1; /* a new image: its stack copies start again (unwind.h) */
	now = bpf_ktime_get_boot_ns();
	bpf_map_update_elem(&exec_times, &tgid, &now, BPF_ANY);
	emit_event(get_stats(), tgid, PROC_EXEC, 1);
	return 0;
}
