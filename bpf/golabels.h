/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Go pprof labels (docs/runtimes.md, "Go pprof labels").
 *
 * A goroutine inside pprof.Do / SetGoroutineLabels has runtime.g.labels set
 * to its label set. At sample time the running goroutine is found from the
 * thread's g (amd64: the TLS slot the Go runtime keeps it in, relative to
 * the fs base; arm64: register x28, which Go code keeps g in), then
 * g.m.curg: the user goroutine also when the sample hit the scheduler (g0)
 * or a signal handler (gsignal). The pointer becomes
 * part of the sample's key (sample_key.labels), so differently labelled
 * samples stay apart; userspace reads the label set it points at from the
 * process. Every read is checked; any failure gives 0 (no labels).
 */
#ifndef PROFSYM_GOLABELS_H
#define PROFSYM_GOLABELS_H

/* Set by the loader: whether go_procs is in use. */
volatile const bool go_labels_on = false;

/* Where a Go process keeps what is read above, by tgid; written by
 * userspace (internal/host/runtimes/golabels) for the Go processes it
 * found. */
struct go_proc {
	__s64 tls_g;      /* g's slot relative to the thread pointer (amd64: fs base) */
	__u32 g_m;        /* offsetof(runtime.g, m) */
	__u32 m_curg;     /* offsetof(runtime.m, curg) */
	__u32 g_labels;   /* offsetof(runtime.g, labels) */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024); /* 28 KB at most; processes past it have no labels */
	__type(key, __u32);
	__type(value, struct go_proc);
} go_procs SEC(".maps");

/* The labels pointer of the goroutine tgid's current thread runs, or 0.
 * g_reg is x28 where the sample left user mode (arm64; unused on x86). */
static __always_inline __u64 go_labels(__u32 tgid, __u64 g_reg)
{
	struct go_proc *gp;
	__u64 g = 0, m = 0, curg = 0, labels = 0;

	if (!go_labels_on)
		return 0;
	gp = bpf_map_lookup_elem(&go_procs, &tgid);
	if (!gp)
		return 0;
#if defined(__TARGET_ARCH_x86)
	__u64 tp = BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), thread.fsbase);

	(void)g_reg;
	if (!tp)
		return 0;
	if (bpf_probe_read_user(&g, sizeof(g), (void *)(tp + gp->tls_g)) || !g)
		return 0;
#else
	g = g_reg;
	if (!g)
		return 0;
#endif
	if (bpf_probe_read_user(&m, sizeof(m), (void *)(g + gp->g_m)) || !m)
		return 0;
	if (bpf_probe_read_user(&curg, sizeof(curg), (void *)(m + gp->m_curg)) || !curg)
		return 0;
#if !defined(__TARGET_ARCH_x86)
	/* x28 is g only in Go code: C code (cgo, the vDSO) may hold anything
	 * there. A real curg runs on that same m. */
	__u64 back = 0;

	if (bpf_probe_read_user(&back, sizeof(back), (void *)(curg + gp->g_m)) || back != m)
		return 0;
#endif
	if (bpf_probe_read_user(&labels, sizeof(labels), (void *)(curg + gp->g_labels)))
		return 0;
	return labels;
}

#endif /* PROFSYM_GOLABELS_H */
