/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Off-CPU samples: where threads wait, and for how long (docs/off-cpu.md).
 *
 * One tracepoint, sched_switch, does all the work, in the two threads it
 * switches between:
 *
 *  - prev leaves the CPU (offcpu_out). This runs in prev's own context, so
 *    its user memory is readable. Whether to record this wait is decided
 *    now, before its length is known, with a probability that depends only
 *    on the thread's past (offcpu_pick): 1 after a wait that outlasted a
 *    scheduler tick, for as many shorter waits since as the thread has
 *    between such waits (four times that, plus four; none when it has more
 *    than OFFCPU_GAP), then 0.7 of that for each further one, never less
 *    than offcpu_floor / OFFCPU_ONE; never less than offcpu_floor_d for an
 *    uninterruptible wait (disk I/O, page faults: rarer than a storm's
 *    waits and often long, so a lucky one never counts a thousand times its
 *    length); no more than 0.7 for each wait begun runnable in a row before
 *    this runnable one, down to offcpu_floor_r (a busy thread preempted
 *    again and again). A chosen wait's kernel stack is taken then
 *    (offcpu_take; scheduler frames included, which the kernel's walker of
 *    a parked task would leave out) and its user stack walked by the CFI
 *    walker (walk.h; instances below); offcpu_park puts both in the
 *    aggregation buffer of the current generation (offcpu_gen), as a CPU
 *    sample's, and the wait in offcpu_waits.
 *  - next comes back (offcpu_in). A chosen wait of next ends: its length
 *    divided by its probability is added to its row of offcpu_counts0/1 in
 *    the same buffer, so that the sums estimate the true off-CPU time
 *    without bias (Horvitz-Thompson). A wait that began before the last
 *    drain has its stacks in offcpu_ustore and offcpu_kstore, where that
 *    drain carried them, or still in the buffer being drained; they are
 *    copied into the current one.
 *
 * What a thread's recent waits were comes from offcpu_slots, one 64-bit
 * word per thread (indexed by tid: threads whose tids differ by a multiple
 * of OFFCPU_SLOTS share one, and then only lose the prediction, never a
 * wait), read and written with jiffies, not the clock: reading the clock
 * costs more than all the rest on some virtual machines, and only chosen
 * waits need it.
 *
 * Needs BTF (tp_btf), no kprobe (kernels built without CONFIG_KPROBES have
 * none) and no tracefs; helpers of 5.10, but those start_walk uses.
 */
#ifndef PROFSYM_OFFCPU_H
#define PROFSYM_OFFCPU_H

#include "offcpu_maps.h"

/* The walker instances for off-CPU walks. A runtime's walker adds its own
 * here, next to the native one, and the sampler installs it in its slot of
 * offcpu_progs (offCPUWalkers in internal/host/sampler/offcpu.go). */
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_native, offcpu_progs, native_step, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_hotspot, offcpu_progs, hotspot_walk, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_cpython, offcpu_progs, cpython_walk, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_perl, offcpu_progs, perl_walk, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_php, offcpu_progs, php_walk, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_ruby, offcpu_progs, ruby_walk, WALK_SLOT_OFF_CPU)
WALK_PROGRAM("tp_btf/sched_switch", offcpu_walk_v8, offcpu_progs, v8_walk, WALK_SLOT_OFF_CPU)

static __always_inline struct offcpu_stats *offcpu_get_stats(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&offcpu_stats_map, &zero);
}

/* 1: targeted, 0: not, -1: userspace has not decided yet. */
static __always_inline int offcpu_targeted(__u32 tgid)
{
	__u32 i = tgid >> 5;
	__u64 *w = bpf_map_lookup_elem(&offcpu_procs, &i), b;

	if (!w)
		return -1;
	b = *w >> ((tgid & 31) * 2);
	if (!(b & 1))
		return -1;
	return (b >> 1) & 1;
}

/* A process exits or execs: its filter bits are cleared. An answer read
 * before and written after this would stand for the new image: the
 * count in offcpu_forgets moves first, and userspace, which reads it
 * around its answer, answers again (sampler's answer). */
static __always_inline void offcpu_forget(__u32 tgid)
{
	__u32 i = tgid >> 5, slot = tgid & (OFFCPU_FORGET_SLOTS - 1);
	__u64 *w, *n, b;

	if (!offcpu_select)
		return;
	n = bpf_map_lookup_elem(&offcpu_forgets, &slot);
	if (n)
		__sync_fetch_and_add(n, 1);
	w = bpf_map_lookup_elem(&offcpu_procs, &i);
	if (!w)
		return;
	b = (*w >> ((tgid & 31) * 2)) & 3;
	if (b)
		__sync_fetch_and_add(w, -(b << ((tgid & 31) * 2)));
}

#define TASK_UNINTERRUPTIBLE 0x2 /* include/linux/sched.h */

/* prev's state as it leaves the CPU: 0 when still runnable (preempted, or
 * it yielded). */
static __always_inline __u32 offcpu_state(bool preempt, struct task_struct *t)
{
	if (preempt)
		return 0;
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___pre514 *)t)->state;
}

/* A thread's slot: Fibonacci hashing spreads threads of consecutive tids
 * (those a process starts together) over different cache lines, which the
 * CPUs they run on would otherwise pass back and forth on every switch. */
static __always_inline __u64 *offcpu_slot(__u32 tid)
{
	__u32 i = (tid * 2654435769u) >> 16;
	return bpf_map_lookup_elem(&offcpu_slots, &i);
}

/* A uniform 16-bit draw from a per-CPU xorshift64 state. */
static __always_inline __u32 offcpu_rand16(struct offcpu_stats *os)
{
	__u64 x = os->rnd;

	if (!x)
		x = ((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32() | 1;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	os->rnd = x;
	return (x >> 24) & (OFFCPU_ONE - 1);
}

/* offcpu_pick: the probability (x OFFCPU_ONE) of choosing the wait a
 * thread begins, from its slot. A thread new here may wait long. */
static __always_inline __u32 offcpu_pick(__u64 old, __u32 tid)
{
	__u32 level, gap, k;

	if (SLOT_TID(old) != tid || (old & SLOT_OFF))
		return OFFCPU_ONE;
	level = SLOT_LEVEL(old);
	gap = SLOT_GAP(old);
	if (gap <= OFFCPU_GAP) {
		if (level <= 4 * gap + 4)
			return OFFCPU_ONE;
		level -= 4 * gap + 4;
	}
	k = level < OFFCPU_LEVELS ? offcpu_decay[level & (OFFCPU_LEVELS - 1)] : 0;
	return k > offcpu_floor ? k : offcpu_floor;
}

/* Takes prev's kernel stack into sc->k (ctx is the tracepoint's), and its
 * key. */
static __always_inline __u64 offcpu_kernel_stack(void *ctx, struct offcpu_scratch *sc)
{
	struct kernel_stack *k = &sc->k;
	long n = bpf_get_stack(ctx, k->pcs, sizeof(k->pcs), 0);
	__u64 h = 0x9e3779b97f4a7c15ull; /* not ustacks' seed: the two kinds never share a key */
	__u32 skip = 0;

	k->len = n > 0 ? n / sizeof(__u64) : 0;
	if (k->len > OFFCPU_KFRAMES)
		k->len = OFFCPU_KFRAMES;
	if (offcpu_sched_hi) {
		for (int i = 0; i < OFFCPU_SKIP_MAX; i++) {
			if (i >= k->len)
				break;
			if (k->pcs[i] >= offcpu_sched_lo && k->pcs[i] < offcpu_sched_hi) {
				skip = i;
				break;
			}
		}
	}
	k->skip = skip;
	for (int i = 0; i < OFFCPU_KFRAMES; i++) {
		if (i >= k->len)
			break;
		if (i >= skip)
			h = mix(h, k->pcs[i]);
	}
	return k->len > skip ? mix(h, k->len - skip) : 0;
}

/* finish_walk of an off-CPU walk: keeps the chosen wait until its thread
 * runs again. */
static __always_inline int offcpu_park(struct unwind_state *s, struct stats *st)
{
	__u32 zero = 0;
	struct offcpu_scratch *sc = bpf_map_lookup_elem(&offcpu_scratch_map, &zero);
	struct offcpu_stats *os = offcpu_get_stats();
	long err;
	__u64 gen = offcpu_gen;
	void *ustacks = gen & 1 ? (void *)&ustacks1 : (void *)&ustacks0;
	void *kstacks = gen & 1 ? (void *)&offcpu_kstacks1 : (void *)&offcpu_kstacks0;

	if (!sc || !os)
		return 0;
	/* The wait starts now that its stacks are taken: the time they took
	 * is the profiler's, not the thread's. */
	sc->w.ts = bpf_ktime_get_boot_ns();
	sc->w.gen = gen;
	sc->w.uhash = 0;
	/* Still the waiting thread's context (sched_switch runs before the
	 * switch): the goroutine it leaves in a blocking system call. */
	sc->w.labels = go_labels(s->tgid, s->go_g);
	if (s->stack.len > 0) {
		sc->w.uhash = walked_hash(s);
		err = bpf_map_update_elem(ustacks, &sc->w.uhash, &s->stack, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			os->stacks_full++;
			return 0;
		}
	}
	if (sc->w.khash) {
		err = bpf_map_update_elem(kstacks, &sc->w.khash, &sc->k, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			os->stacks_full++;
			return 0;
		}
	}
	if (bpf_map_update_elem(&offcpu_waits, &s->tid, &sc->w, BPF_ANY))
		os->waits_full++;
	return 0;
}

/* prev leaves the CPU: choose the wait, and if chosen have its stacks
 * taken (offcpu_take: a program of its own, so that this one, which runs
 * on every switch, stays small). */
static __always_inline int offcpu_out(void *ctx, struct task_struct *prev, bool preempt, __u64 jiffies,
				      struct offcpu_stats *os)
{
	__u32 tid = prev->pid, k, kr, run, state, zero = 0;
	struct offcpu_scratch *sc;
	__u64 *slot, old, bits;
	bool chosen, runnable;

	if (!tid || !prev->mm || (prev->flags & PF_EXITING))
		return 0; /* idle, kernel thread, or its last switch */
	/* current is still prev here: its cgroup decides, before any walk. */
	if (!cgroup_selected(os->selection))
		return 0;
	if (offcpu_select) {
		int t = offcpu_targeted(prev->tgid);
		if (t < 0) {
			/* Ask userspace, once; it announces the process if it
			 * targets it (ProcessNew): no other gets a snapshot. */
			__u32 tgid = prev->tgid;
			__u8 one = 1;
			os->undecided++;
			if (!bpf_map_update_elem(&offcpu_asked, &tgid, &one, BPF_NOEXIST) &&
			    !emit_event(get_stats(), tgid, PROC_OFFCPU, 1))
				bpf_map_delete_elem(&offcpu_asked, &tgid); /* ask again */
			return 0;
		}
		if (!t)
			return 0;
	}
	os->seen++;
	slot = offcpu_slot(tid);
	if (!slot)
		return 0;
	old = *slot;
	k = offcpu_pick(old, tid);
	state = offcpu_state(preempt, prev);
	runnable = state == 0;
	if ((state & TASK_UNINTERRUPTIBLE) && k < offcpu_floor_d)
		k = offcpu_floor_d;
	run = SLOT_TID(old) == tid ? SLOT_RUN(old) : 0;
	if (runnable) {
		/* A thread busy on a loaded CPU is preempted again and again and
		 * never blocks: its level stays where its last block left it,
		 * often at probability 1, and every preemption would be walked.
		 * Its preemptions in a row decay on their own count instead,
		 * down to offcpu_floor_r. */
		kr = offcpu_decay[run & (OFFCPU_LEVELS - 1)];
		if (kr < offcpu_floor_r)
			kr = offcpu_floor_r;
		if (kr < k)
			k = kr;
		if (run < SLOT_RUN_MAX)
			run++;
	} else {
		run = 0;
	}
	chosen = k >= OFFCPU_ONE || offcpu_rand16(os) < k;
	bits = SLOT_OFF | (chosen ? SLOT_CHOSEN : 0) | (runnable ? SLOT_RUNNABLE : 0) | ((__u64)run << SLOT_RUN_SHIFT);
	if (SLOT_TID(old) == tid)
		bits |= SLOT_HISTORY(old);
	else
		bits |= (__u64)SLOT_COUNT_MAX << SLOT_GAP_SHIFT; /* no rhythm known */
	*slot = ((__u64)tid << SLOT_TID_SHIFT) | bits | (__u16)jiffies;
	if (!chosen)
		return 0;
	os->chosen++;
	sc = bpf_map_lookup_elem(&offcpu_scratch_map, &zero);
	if (!sc)
		return 0;
	sc->w.task_start = prev->start_time;
	sc->w.tgid = prev->tgid;
	sc->w.k = k;
	sc->w.flags = runnable ? OFFCPU_RUNNABLE : 0;
	sc->w.pad = 0;
	bpf_tail_call(ctx, &offcpu_progs, OFFCPU_PROG_TAKE);
	os->lost_stack++; /* not installed */
	return 0;
}

/* Takes the stacks of the wait offcpu_out chose: the kernel stack, then
 * the user stack through the walker, which ends in offcpu_park. */
SEC("tp_btf/sched_switch")
int offcpu_take(__u64 *ctx)
{
	struct task_struct *prev = (void *)ctx[1];
	struct offcpu_scratch *sc;
	struct stats *st = get_stats();
	__u32 zero = 0, tgid = prev->tgid, tid = prev->pid;

	sc = bpf_map_lookup_elem(&offcpu_scratch_map, &zero);
	if (!st || !sc)
		return 0;
	bpf_get_current_comm(sc->w.comm, sizeof(sc->w.comm));
	sc->w.khash = offcpu_kernel_stack(ctx, sc);
	announce(st, tgid);
	return start_walk(ctx, st, tgid, tid, ORIGIN_OFF_CPU, &offcpu_progs);
}

/* Brings the stacks of a wait that began before the last drain into the
 * current buffer: from the store the drain carried them to, or still from
 * the buffer it is emptying. Returns 0, or 1 when they are gone. */
static __always_inline int offcpu_carry(struct offcpu_wait *w, __u64 gen, struct offcpu_stats *os)
{
	void *ustacks = gen & 1 ? (void *)&ustacks1 : (void *)&ustacks0;
	void *kstacks = gen & 1 ? (void *)&offcpu_kstacks1 : (void *)&offcpu_kstacks0;
	void *uprev = gen & 1 ? (void *)&ustacks0 : (void *)&ustacks1;
	void *kprev = gen & 1 ? (void *)&offcpu_kstacks0 : (void *)&offcpu_kstacks1;
	bool prev = w->gen + 1 == gen; /* that buffer is not reused before the next drain */
	struct user_stack *us;
	struct kernel_stack *ks;
	long err;

	if (w->uhash) {
		us = bpf_map_lookup_elem(&offcpu_ustore, &w->uhash);
		if (!us && prev)
			us = bpf_map_lookup_elem(uprev, &w->uhash);
		if (!us)
			return 1;
		err = bpf_map_update_elem(ustacks, &w->uhash, us, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			os->lost_stack++;
			return 1;
		}
	}
	if (w->khash) {
		ks = bpf_map_lookup_elem(&offcpu_kstore, &w->khash);
		if (!ks && prev)
			ks = bpf_map_lookup_elem(kprev, &w->khash);
		if (!ks)
			return 1;
		err = bpf_map_update_elem(kstacks, &w->khash, ks, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			os->lost_stack++;
			return 1;
		}
	}
	return 0;
}

/* Adds a finished wait to its row in the current buffer. (Inlined: a
 * subprogram next to a tail call does not load where the JIT cannot mix
 * them, arm64 before 6.0.) */
static __always_inline void offcpu_count(struct offcpu_wait *w, __u32 tid, struct offcpu_stats *os)
{
	__u64 gen = offcpu_gen, now, d;
	void *counts = gen & 1 ? (void *)&offcpu_counts1 : (void *)&offcpu_counts0;
	struct offcpu_key key = {};
	struct offcpu_value *v;
	__u64 wns, wus, var = 0;
	long err;

	if (w->gen != gen && offcpu_carry(w, gen, os)) {
		os->stale++;
		return;
	}
	/* The thread runs once this program is done: the time it took is
	 * part of the wait. */
	now = bpf_ktime_get_boot_ns();
	d = now - w->ts;
	if (d < offcpu_min_ns) {
		os->short_waits++;
		return;
	}
	if (d >> OFFCPU_MAX_SHIFT)
		d = 1ull << OFFCPU_MAX_SHIFT;
	wns = d * OFFCPU_ONE / (w->k ? w->k : 1);
	if (w->k < OFFCPU_ONE) {
		wus = wns / 1000;
		if (wus >> 31)
			wus = 1ull << 31;
		var = (wus * wus / OFFCPU_ONE) * (OFFCPU_ONE - w->k);
	}
	key.pid = w->tgid;
	key.tid = tid;
	key.flags = w->flags;
	key.khash = w->khash;
	key.uhash = w->uhash;
	key.labels = w->labels;
	v = bpf_map_lookup_elem(counts, &key);
	if (!v) {
		struct offcpu_value nv = {};
		nv.waits = 1;
		nv.ns = wns;
		nv.var_us2 = var;
		nv.first_ns = w->ts;
		nv.last_ns = now;
		__builtin_memcpy(nv.comm, w->comm, sizeof(nv.comm));
		err = bpf_map_update_elem(counts, &key, &nv, BPF_NOEXIST);
		if (!err) {
			os->kept++;
			return;
		}
		/* Another CPU added the row first: add to it. */
		v = err == -EEXIST ? bpf_map_lookup_elem(counts, &key) : NULL;
		if (!v) {
			os->lost_map_full++;
			return;
		}
	}
	/* One row for every CPU the thread may run again on. */
	__sync_fetch_and_add(&v->waits, 1);
	__sync_fetch_and_add(&v->ns, wns);
	__sync_fetch_and_add(&v->var_us2, var);
	if (now > v->last_ns)
		v->last_ns = now; /* a race loses a few ns of a timestamp, no more */
	os->kept++;
}

/* next runs again: end its wait, and count it if it was chosen. */
static __always_inline void offcpu_in(struct task_struct *next, __u64 jiffies, struct offcpu_stats *os)
{
	__u32 tid = next->pid, level, gap;
	struct offcpu_wait *w;
	__u64 *slot, old;

	/* Idle and kernel threads (kworkers, ksoftirqd: many of a host's
	 * switches) never had a wait chosen: no slot lookup for them. A user
	 * thread keeps its mm until its last switch out. */
	if (!tid || !next->mm)
		return;
	slot = offcpu_slot(tid);
	if (!slot)
		return;
	old = *slot;
	if (SLOT_TID(old) == tid && (old & SLOT_OFF)) {
		/* Left by this very thread: it is a user thread, targeted. */
		level = SLOT_LEVEL(old);
		gap = SLOT_GAP(old);
		if (old & SLOT_RUNNABLE) {
			/* waited for a CPU: says nothing of how it blocks */
		} else if ((__u16)jiffies != (__u16)old) {
			gap = level; /* a tick went by: this wait was long */
			level = 0;
		} else if (level < SLOT_COUNT_MAX) {
			level++;
		}
		*slot = ((__u64)tid << SLOT_TID_SHIFT) | ((__u64)level << SLOT_LEVEL_SHIFT) | ((__u64)gap << SLOT_GAP_SHIFT) |
			(old & ((__u64)SLOT_RUN_MAX << SLOT_RUN_SHIFT));
		if (!(old & SLOT_CHOSEN))
			return;
	} else if (offcpu_select && offcpu_targeted(next->tgid) != 1) {
		return;
	}
	/* Chosen, or the slot was another thread's: look the wait up. */
	w = bpf_map_lookup_elem(&offcpu_waits, &tid);
	if (!w)
		return;
	if (w->task_start != next->start_time) {
		os->stale++;
		goto done;
	}
	offcpu_count(w, tid, os);
done:
	/* Last: a deleted entry may be reused by another CPU at once. */
	bpf_map_delete_elem(&offcpu_waits, &tid);
}

SEC("tp_btf/sched_switch")
int offcpu_switch(__u64 *ctx)
{
	bool preempt = ctx[0];
	struct task_struct *prev = (void *)ctx[1], *next = (void *)ctx[2];
	__u64 jiffies = bpf_jiffies64();
	struct offcpu_stats *os = offcpu_get_stats();

	if (!os)
		return 0;
	/* next first: offcpu_out may end in the walker's tail calls. */
	offcpu_in(next, jiffies, os);
	return offcpu_out(ctx, prev, preempt, jiffies, os);
}

/* Anchors for bpf2go's -type. */
struct offcpu_key *unused_offcpu_key __attribute__((unused));
struct offcpu_value *unused_offcpu_value __attribute__((unused));
struct offcpu_wait *unused_offcpu_wait __attribute__((unused));
struct kernel_stack *unused_kernel_stack __attribute__((unused));
struct offcpu_stats *unused_offcpu_stats __attribute__((unused));
enum offcpu_limits *unused_offcpu_limits __attribute__((unused));
enum offcpu_flags *unused_offcpu_flags __attribute__((unused));

#endif /* PROFSYM_OFFCPU_H */
