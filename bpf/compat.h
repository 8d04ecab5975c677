/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Kernel compatibility: code paths for helpers older kernels lack, chosen at
 * load time by feature probes (internal/host/sampler/features.go), never by
 * version numbers. The loader sets the constants below; the verifier prunes
 * the branch a kernel cannot run (dead code on frozen .rodata), so a helper
 * the kernel does not know is never seen, and one object loads from 5.10 on.
 */
#ifndef PROFSYM_COMPAT_H
#define PROFSYM_COMPAT_H

/* bpf_task_pt_regs (5.15) and bpf_get_current_task_btf (5.11). */
volatile const bool have_task_pt_regs = true;
/* THREAD_SIZE of the running kernel, for task_pt_regs() without the helper
 * (16 KiB on x86-64 and on arm64 with 4 KiB pages; the loader sets it). */
volatile const __u64 kernel_thread_size = 16384;

/* The current task (a plain pointer: every kernel has this helper). */
static __always_inline struct task_struct *current_task(void)
{
	return (struct task_struct *)bpf_get_current_task();
}

/* The registers the current task saved on its last entry into the kernel,
 * as task_pt_regs() finds them: at the top of its kernel stack, on x86-64
 * (no padding there before FRED, 6.9, which has the helper) and arm64
 * alike. NULL when unknown. The caller checks they are user registers. */
static __always_inline struct pt_regs *current_entry_regs(void)
{
	void *stack;

	if (have_task_pt_regs)
		return (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	stack = BPF_CORE_READ(current_task(), stack);
	if (!stack)
		return NULL;
	return (struct pt_regs *)((char *)stack + kernel_thread_size - bpf_core_type_size(struct pt_regs));
}

/* bpf_probe_read_user of n bytes, 1 <= n <= max (a power of two), with the
 * bound applied to the very register the helper is given: before 5.13 the
 * verifier forgets the bounds of a scalar spilled to the stack between the
 * check and the call, and refuses a read it cannot bound. */
#define probe_read_user_upto(dst, n, max, src)                                 \
	({                                                                     \
		__u64 __n = (n);                                               \
		asm volatile("%[len] += -1\n\t%[len] &= %[lim]\n\t%[len] += 1"        \
			     : [len] "+r"(__n)                                   \
			     : [lim] "i"((max) - 1));                            \
		bpf_probe_read_user((dst), __n, (void *)(src));                \
	})

#endif /* PROFSYM_COMPAT_H */
