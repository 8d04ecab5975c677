/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Minimal, hand-written stand-in for a bpftool-generated vmlinux.h.
 *
 * Only what profile.c uses is declared. Kernel structs carry
 * preserve_access_index so that field offsets are relocated against the
 * running kernel's BTF at load time (CO-RE): the layout written here does
 * not need to match any real kernel, only the field names and types do.
 * Generating this file from the build machine's kernel would make the
 * committed object depend on that kernel, which CI cannot reproduce.
 */
#ifndef PROFSYM_VMLINUX_H
#define PROFSYM_VMLINUX_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
enum { false = 0, true = 1 };

/* UAPI constants (include/uapi/linux/bpf.h); these are ABI and never change. */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PROG_ARRAY = 3,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_STACK_TRACE = 7,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_MMAPABLE = (1U << 10),
};

enum {
	BPF_F_SKIP_FIELD_MASK = 0xffULL,
	BPF_F_USER_STACK = (1ULL << 8),
	BPF_F_FAST_STACK_CMP = (1ULL << 9),
	BPF_F_REUSE_STACKID = (1ULL << 10),
	BPF_F_USER_BUILD_ID = (1ULL << 11),
};

enum {
	BPF_RB_NO_WAKEUP = (1ULL << 0),
	BPF_RB_FORCE_WAKEUP = (1ULL << 1),
};

#if defined(__TARGET_ARCH_x86)
/*
 * Registers as the kernel saves them on entry (arch/x86/include/asm/ptrace.h).
 * Relocated via CO-RE when read from a task (bpf_task_pt_regs); the perf_event
 * context holds the UAPI twin (bpf_user_pt_regs_t), whose layout is the same
 * on x86-64, so the same declaration serves both.
 */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
} __attribute__((preserve_access_index));

typedef struct pt_regs bpf_user_pt_regs_t;
#elif defined(__TARGET_ARCH_arm64)
/* The perf_event context's registers (UAPI, arch/arm64/include/uapi/asm/
 * ptrace.h): a fixed ABI, read as is. */
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};

typedef struct user_pt_regs bpf_user_pt_regs_t;

/* Registers saved on kernel entry (arch/arm64/include/asm/ptrace.h), read
 * from a task with CO-RE: the UAPI registers first, in an anonymous union. */
struct pt_regs {
	union {
		struct user_pt_regs user_regs;
		struct {
			__u64 regs[31];
			__u64 sp;
			__u64 pc;
			__u64 pstate;
		};
	};
} __attribute__((preserve_access_index));
#else
#error "profsym's BPF programs support x86-64 and arm64 (bpf2go -target amd64,arm64)"
#endif

/* The perf_event program context (UAPI, include/uapi/linux/bpf_perf_event.h);
 * the verifier rewrites accesses to it. */
struct bpf_perf_event_data {
	bpf_user_pt_regs_t regs;
	__u64 sample_period;
	__u64 addr;
};

/* Kernel-internal types, relocated via CO-RE. */
typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long start_code;
} __attribute__((preserve_access_index));

/* The user thread pointer (golabels.h, threadctx.h): x86's fs base,
 * arm64's tpidr_el0 as saved for the task. */
#if defined(__TARGET_ARCH_arm64)
struct thread_struct {
	struct {
		unsigned long tp_value;
	} uw;
} __attribute__((preserve_access_index));
#else
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));
#endif

struct task_struct {
	unsigned int __state; /* "state" (a long) before 5.14: see task_struct___pre514 */
	unsigned int flags;
	int pid;
	int tgid;
	void *stack; /* the kernel stack: pt_regs at its top (compat.h) */
	struct mm_struct *mm;
	struct signal_struct *signal;
	__u64 start_time; /* ns since boot (monotonic); tells a reused pid apart */
	struct task_struct *group_leader;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

/* The task's state field before Linux 5.14 renamed it (CO-RE flavor). */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

#endif /* PROFSYM_VMLINUX_H */
