/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Off-CPU samples' constants, types and maps (the programs: offcpu.h).
 */
#ifndef PROFSYM_OFFCPU_MAPS_H
#define PROFSYM_OFFCPU_MAPS_H

/* The drain's generation: userspace increments it when it flips
 * active_buf (before the barrier), and off-CPU samples use buffer gen & 1,
 * so that a wait knows whether a drain went by since it began. */
__u64 offcpu_gen = 0;

/* Set by the loader before load. */
/* Waits shorter than this (ns) are not recorded. */
volatile const __u64 offcpu_min_ns = 0;
/* The least probability of choosing a wait, x OFFCPU_ONE; of an
 * uninterruptible one (TASK_UNINTERRUPTIBLE: I/O, page faults). */
volatile const __u32 offcpu_floor = 66;
volatile const __u32 offcpu_floor_d = 65536;
/* The least probability of a wait the thread begins runnable (preempted),
 * after OFFCPU_LEVELS such waits in a row; 65536 keeps the thread's own. */
volatile const __u32 offcpu_floor_r = 65536;
/* Only processes userspace marked in offcpu_procs. */
volatile const bool offcpu_select = false;
/* [__sched_text_start, __sched_text_end): where a blocked task's kernel
 * stack begins; frames before it are the tracepoint's own call path. */
volatile const __u64 offcpu_sched_lo = 0;
volatile const __u64 offcpu_sched_hi = 0;

enum offcpu_limits {
	OFFCPU_ONE = 65536,     /* probability 1; probabilities are k / OFFCPU_ONE */
	OFFCPU_SLOTS = 65536,   /* offcpu_slots entries, a power of two */
	OFFCPU_KFRAMES = 64,    /* kernel frames kept per wait */
	OFFCPU_SKIP_MAX = 8,    /* tracepoint frames looked past, at most */
	OFFCPU_MAX_SHIFT = 47,  /* waits are capped at 2^47 ns (39 h) */
	OFFCPU_LEVELS = 32,     /* short waits since a long one that change the probability */
	OFFCPU_GAP = 8,         /* a thread with at most this many short waits between long ones has them all */
	OFFCPU_FORGET_SLOTS = 8192, /* offcpu_forgets entries, a power of two */
};

/* offcpu_key.flags */
enum offcpu_flags {
	OFFCPU_RUNNABLE = 1, /* switched out runnable (preempted, yield): waited for a CPU */
};

/* The probability of choosing a thread's wait L waits past its window:
 * 0.7^L, x OFFCPU_ONE. A thread whose waits are long, or long every few
 * waits (an fsync: short waits for the pages, a long one for the disk),
 * has all of them recorded; one that waits long after many short waits
 * still has a fair chance; one whose waits are all short (a context-switch
 * storm, where a tick only now and then falls in a wait) costs a walk now
 * and then. */
static const __u32 offcpu_decay[OFFCPU_LEVELS] = {
	65536, 45875, 32113, 22479, 15735, 11015, 7710, 5397, 3778, 2645, 1851, 1296, 907, 635, 444, 311,
	218, 152, 107, 75, 52, 37, 26, 18, 13, 9, 6, 4, 3, 2, 1, 1,
};

/* A slot of offcpu_slots: tid (22 bits: PID_MAX_LIMIT is 2^22), whether
 * the thread is off CPU, whether this wait was chosen, whether it left
 * runnable, its level (short waits since its last long one, 7 bits), its
 * run (waits it began runnable since it last blocked, 5 bits), its gap
 * (short waits between its last two long ones, 7 bits), and the low 16
 * bits of the jiffies when it left the CPU (a wait of exactly 2^16 ticks
 * looks short: only the prediction suffers). */
#define SLOT_TID_SHIFT 42
#define SLOT_OFF (1ull << 41)
#define SLOT_CHOSEN (1ull << 40)
#define SLOT_RUNNABLE (1ull << 39)
#define SLOT_LEVEL_SHIFT 32
#define SLOT_RUN_SHIFT 24
#define SLOT_RUN_MAX (OFFCPU_LEVELS - 1)
#define SLOT_GAP_SHIFT 16
#define SLOT_COUNT_MAX 127
#define SLOT_TID(v) ((__u32)((v) >> SLOT_TID_SHIFT))
#define SLOT_LEVEL(v) ((__u32)((v) >> SLOT_LEVEL_SHIFT) & SLOT_COUNT_MAX)
#define SLOT_GAP(v) ((__u32)((v) >> SLOT_GAP_SHIFT) & SLOT_COUNT_MAX)
#define SLOT_RUN(v) ((__u32)((v) >> SLOT_RUN_SHIFT) & SLOT_RUN_MAX)
#define SLOT_HISTORY(v) ((v) & (((__u64)SLOT_COUNT_MAX << SLOT_LEVEL_SHIFT) | ((__u64)SLOT_COUNT_MAX << SLOT_GAP_SHIFT)))

/* Key of offcpu_counts0/1: one row per thread, stacks and flags. */
struct offcpu_key {
	__u32 pid; /* tgid */
	__u32 tid;
	__u32 cpu;   /* 0: rows are added to atomically, not kept per CPU */
	__u32 flags; /* enum offcpu_flags */
	__u64 khash; /* kernel stack in offcpu_kstacks0/1, 0 when none */
	__u64 uhash; /* user stack in ustacks0/1, 0 when none */
	__u64 labels; /* the Go label set of the goroutine that waited (golabels.h), 0 when none */
};

struct offcpu_value {
	__u64 waits;    /* waits recorded */
	__u64 ns;       /* sum of length / probability: the estimate of their time */
	__u64 var_us2;  /* sum of (1 - p) (length / p)^2 in us^2: its variance */
	__u64 first_ns; /* CLOCK_BOOTTIME: start of the first wait */
	__u64 last_ns;  /* end of the last */
	char comm[16];
};

struct kernel_stack {
	__u32 len;  /* frames in pcs */
	__u32 skip; /* leading frames before the scheduler's: the tracepoint's */
	__u64 pcs[OFFCPU_KFRAMES];
};

/* A chosen wait, from its start to the thread's return. */
struct offcpu_wait {
	__u64 ts;         /* CLOCK_BOOTTIME when the thread left the CPU */
	__u64 task_start; /* its task's start_time: a reused tid is another thread */
	__u64 gen;        /* offcpu_gen when it began: its stacks are in buffer gen & 1 */
	__u64 khash;      /* its kernel stack, 0 when none */
	__u64 uhash;      /* its user stack, 0 when none */
	__u32 tgid;
	__u32 k;     /* probability of having chosen it, x OFFCPU_ONE */
	__u32 flags; /* enum offcpu_flags */
	__u32 pad;
	__u64 labels; /* go_labels() when it left the CPU */
	char comm[16];
};

/* Per-CPU counters and state; userspace sums the counters. */
struct offcpu_stats {
	__u64 seen;        /* waits of targeted user threads */
	__u64 chosen;      /* of those, chosen: stacks taken */
	__u64 kept;        /* recorded, weighted, in the counts */
	__u64 short_waits; /* chosen but shorter than offcpu_min_ns */
	__u64 undecided;   /* waits of a process the filter had no answer for yet */
	__u64 waits_full;  /* offcpu_waits full: a chosen wait dropped */
	__u64 stacks_full; /* a stack map full: a chosen wait dropped */
	__u64 stale;       /* a reused tid, or the stacks of a wait across drains were gone */
	__u64 lost_map_full; /* counts full: a finished wait dropped */
	__u64 lost_stack;  /* its stacks could not be copied for the drain */
	__u64 selection[SELECT_VERDICTS]; /* switches away from user threads by enum select_verdict (cgroup_select) */
	__u64 rnd;         /* xorshift state: cheaper than a helper call per switch */
};

/* Scratch: a chosen wait and its kernel stack while its user stack is
 * walked. */
struct offcpu_scratch {
	struct offcpu_wait w;
	struct kernel_stack k;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_stats);
} offcpu_stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_scratch);
} offcpu_scratch_map SEC(".maps");

/* Sizes below are placeholders; the loader sets them from the config (one
 * entry each while off-CPU sampling is off). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, OFFCPU_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} offcpu_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* tid */
	__type(value, struct offcpu_wait);
} offcpu_waits SEC(".maps");

/* Stacks of waits that span a drain, by their keys in the aggregation
 * buffers' maps: the drain carries them here from the buffer it empties,
 * and deletes those no such wait uses any more. Only userspace writes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u64));
	__uint(value_size, sizeof(struct user_stack)); /* as ustacks0/1's */
} offcpu_ustore SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct kernel_stack);
} offcpu_kstore SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_value);
} offcpu_counts0 SEC(".maps"), offcpu_counts1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct kernel_stack);
} offcpu_kstacks0 SEC(".maps"), offcpu_kstacks1 SEC(".maps");

/* The per-process filter (offcpu_select): two bits per tgid, 32 tgids a
 * word: bit 2n says userspace decided, bit 2n+1 that the process is
 * targeted. Userspace sets them through mmap (compare-and-swap), the
 * kernel side clears them at exit and exec (atomic add), so that a reused
 * pid or a new image is decided again. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} offcpu_procs SEC(".maps");

/* offcpu_forget's calls, counted in slot tgid % OFFCPU_FORGET_SLOTS before
 * it clears the process's bits. Userspace reads the count before it reads
 * a process and after it writes the answer: when it moved, an exec or exit
 * may have come between, and it answers again (sampler's answer); another
 * pid of the same slot costs only that. Mapped, like offcpu_procs: no
 * syscall to read it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* OFFCPU_FORGET_SLOTS with offcpu_select */
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64); /* an array's values are 8 bytes apart whatever their size */
} offcpu_forgets SEC(".maps");

/* tgids the off-CPU filter has been asked about (PROC_OFFCPU) and not yet
 * answered; LRU: an evicted one is asked about again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} offcpu_asked SEC(".maps");

/* The walker's programs for off-CPU walks, by enum walk_prog, and in slot
 * OFFCPU_PROG_TAKE the one that takes a chosen wait's stacks: a tail call
 * stays within one program type and, for tp_btf, one tracepoint. */
#define OFFCPU_PROG_TAKE WALK_PROGS
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, WALK_PROGS + 1);
	__type(key, __u32);
	__type(value, __u32);
} offcpu_progs SEC(".maps");

#endif /* PROFSYM_OFFCPU_MAPS_H */
