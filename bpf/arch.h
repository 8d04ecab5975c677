/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What the walker (unwind.h) needs to know about the CPU, behind small
 * inline functions: the registers of a perf_event sample and of the task's
 * kernel entry, where a row says the return address is, the signal frame
 * layout, pointer authentication. One section per architecture; bpf2go
 * builds one object per target (-target amd64,arm64), which defines
 * __TARGET_ARCH_x86 or __TARGET_ARCH_arm64. Included by unwind.h after
 * struct unwind_state.
 *
 * Row fields per architecture (internal/host/unwind/encode.go writes them):
 *   x86-64  RA at CFA-8; caller's FP at CFA + 8*fp_off when ROW_FP_SAVED;
 *           bits 5-7 a CFA register code or a deref (unwind.h).
 *   arm64   ROW_FP_SAVED: a frame record (x29, x30) at CFA + 8*fp_off;
 *           otherwise fp_off != 0: RA (x30) alone at CFA + 8*fp_off, FP
 *           unchanged; fp_off == 0: RA still in the link register, usable
 *           in the innermost frame only. Bits 5-7 are zero.
 */
#ifndef PROFSYM_ARCH_H
#define PROFSYM_ARCH_H

/* Frame record at FP: [FP] = caller's FP, [FP+8] = RA (x86-64's push rbp;
 * mov rsp,rbp and arm64's stp x29,x30 alike). On x86-64 the caller's SP is
 * FP+16; arm64 compilers put the record anywhere in the frame (gcc at its
 * bottom, Go below SP), so after an FP step SP is unknown there and only
 * FP-based rows or further FP steps may follow (unwind.h). */
#define FP_STEP_SP 16

#if defined(__TARGET_ARCH_x86)

#define FP_STEP_SP_EXACT 1

/* rt_sigframe at SP in __restore_rt (pretcode already popped): ucontext
 * (uc_flags, uc_link, uc_stack = 40 bytes), then sigcontext's rbp, rsp, rip. */
#define SIGFRAME_FP (40 + 80)
#define SIGFRAME_SP (40 + 120)

/* Fills pc, sp, fp and the CFA registers from a sample that hit user mode;
 * false when it hit the kernel. Plain loads from the context. */
static __always_inline bool arch_sample_regs(struct bpf_perf_event_data *ctx, struct unwind_state *s)
{
	if (!(ctx->regs.cs & 3))
		return false;
	s->pc = ctx->regs.ip;
	s->sp = ctx->regs.sp;
	s->fp = ctx->regs.bp;
	/* For CFA-from-register rows (unwind.h). */
	s->regs[1] = ctx->regs.ax;
	s->regs[2] = ctx->regs.dx;
	s->regs[3] = ctx->regs.si;
	s->regs[4] = ctx->regs.di;
	s->regs[5] = ctx->regs.r9;
	s->regs[6] = ctx->regs.r10;
	s->regs[7] = ctx->regs.r11;
	s->rt_reg = ctx->regs.r13; /* HotSpot's bytecode pointer (hotspot.h) */
	return true;
}

/* Fills pc, sp, fp from the registers saved on kernel entry; false unless
 * they are a user context. The rest are read when a row needs one. */
static __always_inline bool arch_entry_regs(struct pt_regs *regs, struct unwind_state *s)
{
	if ((BPF_CORE_READ(regs, cs) & 3) != 3)
		return false;
	s->pc = BPF_CORE_READ(regs, ip);
	s->sp = BPF_CORE_READ(regs, sp);
	s->fp = BPF_CORE_READ(regs, bp);
	return true;
}

/* Register code (see CFA_REGS) as saved on kernel entry. */
static __always_inline __u64 arch_entry_reg(struct unwind_state *s, __u32 code)
{
	struct pt_regs *regs = (struct pt_regs *)s->entry_regs;

	switch (code) {
	case 1: return BPF_CORE_READ(regs, ax);
	case 2: return BPF_CORE_READ(regs, dx);
	case 3: return BPF_CORE_READ(regs, si);
	case 4: return BPF_CORE_READ(regs, di);
	case 5: return BPF_CORE_READ(regs, r9);
	case 6: return BPF_CORE_READ(regs, r10);
	default: return BPF_CORE_READ(regs, r11);
	}
}

/* Where the row says the caller's return address is saved; 0: in the link
 * register (never on x86-64). */
static __always_inline __u64 arch_ra_slot(struct unwind_row *r, __u64 cfa)
{
	return cfa - 8;
}

/* The return address as the unwinder uses it (arm64 strips a PAC). */
static __always_inline __u64 arch_strip_ra(__u64 ra)
{
	return ra;
}

/* The registers of the context a signal interrupted, from the rt_sigframe
 * at SP. Returns 0 to go on, 1 when the walk ends. */
static __always_inline int arch_signal_frame(struct unwind_state *s)
{
	__u64 regs[3]; /* rbp ... rsp, rip are not contiguous with rbp */

	if (bpf_probe_read_user(&regs[0], 8, (void *)(s->sp + SIGFRAME_FP)) ||
	    bpf_probe_read_user(&regs[1], 16, (void *)(s->sp + SIGFRAME_SP))) {
		set_reason(s, STOP_READ_FAULT);
		return 1;
	}
	if (regs[2] == 0)
		return 1;
	s->fp = regs[0];
	s->sp = regs[1];
	s->pc = regs[2];
	return 0;
}

/* Whether pc is the kernel's signal return trampoline in the vdso (x86-64
 * C libraries bring their own, which has a table). */
static __always_inline bool arch_vdso_sigreturn(__u64 pc)
{
	return false;
}

/* Whether ra follows a call instruction, as a return address does: call
 * rel32 (e8) ending at ra, or an indirect call (ff /2) of 2 to 7 bytes.
 * Loose (a lucky byte passes one time in a few hundred), it keeps a frame
 * pointer register that holds data from making up callers. */
static __always_inline bool arch_ra_after_call(__u64 ra)
{
	__u8 b[8];

	if (ra < 8 || bpf_probe_read_user(b, sizeof(b), (void *)(ra - 8)))
		return false;
	if (b[3] == 0xe8)
		return true;
	for (int k = 2; k <= 7; k++) {
		if (k != 5 && b[8 - k] == 0xff && ((b[9 - k] >> 3) & 7) == 2)
			return true;
	}
	return false;
}

#elif defined(__TARGET_ARCH_arm64)

#define FP_STEP_SP_EXACT 0

/* PSTATE.M: EL0 with AArch64 (a 32-bit task has bit 4 set: not walked). */
#define PSR_MODE_MASK 0x1f
/* rt_sigframe at SP in __kernel_rt_sigreturn: siginfo (128 bytes), then
 * ucontext, whose sigcontext is at 176 (after 168 bytes, 16-aligned):
 * fault_address, x0..x30, sp, pc. x29, x30, sp, pc are contiguous. */
#define SIGFRAME_X29 (128 + 176 + 8 + 29 * 8)
/* mov x8, #139 (rt_sigreturn); svc #0 */
#define SIGRETURN_INSNS 0xd4000001d2801168ull
/* User addresses have 48 bits (52-bit user VA needs an mmap hint we do not
 * follow): the bits above hold a pointer authentication code or a tag. */
#define USER_VA_MASK ((1ull << 48) - 1)

static __always_inline bool arch_sample_regs(struct bpf_perf_event_data *ctx, struct unwind_state *s)
{
	if (ctx->regs.pstate & PSR_MODE_MASK)
		return false;
	s->pc = ctx->regs.pc;
	s->sp = ctx->regs.sp;
	s->fp = ctx->regs.regs[29];
	s->regs[1] = ctx->regs.regs[30]; /* the link register */
	s->go_g = ctx->regs.regs[28];    /* Go's g, in Go code (golabels.h) */
	s->rt_reg = ctx->regs.regs[22];  /* HotSpot's bytecode pointer (hotspot.h) */
	return true;
}

static __always_inline bool arch_entry_regs(struct pt_regs *regs, struct unwind_state *s)
{
	if (BPF_CORE_READ(regs, pstate) & PSR_MODE_MASK)
		return false;
	s->pc = BPF_CORE_READ(regs, pc);
	s->sp = BPF_CORE_READ(regs, sp);
	s->fp = BPF_CORE_READ(regs, regs[29]);
	s->go_g = BPF_CORE_READ(regs, regs[28]);
	return true;
}

/* Code 1 is the link register; arm64 rows name no other register. */
static __always_inline __u64 arch_entry_reg(struct unwind_state *s, __u32 code)
{
	struct pt_regs *regs = (struct pt_regs *)s->entry_regs;

	return BPF_CORE_READ(regs, regs[30]);
}

static __always_inline __u64 arch_ra_slot(struct unwind_row *r, __u64 cfa)
{
	if (r->info & ROW_FP_SAVED)
		return cfa + (__s64)r->fp_off * 8 + 8;
	if (r->fp_off == 0)
		return 0;
	return cfa + (__s64)r->fp_off * 8;
}

static __always_inline __u64 arch_strip_ra(__u64 ra)
{
	return ra & USER_VA_MASK;
}

static __always_inline int arch_signal_frame(struct unwind_state *s)
{
	__u64 regs[4]; /* x29, x30, sp, pc */

	if (bpf_probe_read_user(regs, sizeof(regs), (void *)(s->sp + SIGFRAME_X29))) {
		set_reason(s, STOP_READ_FAULT);
		return 1;
	}
	if (regs[3] == 0)
		return 1;
	s->fp = regs[0];
	s->sp = regs[2];
	s->pc = regs[3];
	/* The interrupted frame may be a leaf with its RA still in x30: its
	 * registers are exact, as in a sample's own. */
	s->regs[1] = regs[1];
	s->regs_valid = REGS_USER;
	return 0;
}

/* Whether the instruction before ra is a call: BL, BLR, or the pointer
 * authenticating BLRAA/BLRAB(Z). */
static __always_inline bool arch_ra_after_call(__u64 ra)
{
	__u32 insn;

	if (ra < 4 || (ra & 3) || bpf_probe_read_user(&insn, sizeof(insn), (void *)(ra - 4)))
		return false;
	return (insn & 0xfc000000) == 0x94000000 || (insn & 0xfffffc1f) == 0xd63f0000 ||
	       (insn & 0xfefff800) == 0xd63f0800;
}

/* The kernel's trampoline, __kernel_rt_sigreturn in the vdso, where a
 * handler returns to (arm64 C libraries use no restorer of their own). */
static __always_inline bool arch_vdso_sigreturn(__u64 pc)
{
	__u64 insns = 0;

	return !bpf_probe_read_user(&insns, sizeof(insns), (void *)pc) && insns == SIGRETURN_INSNS;
}

#else
#error "unsupported architecture: profsym's walker knows x86-64 and arm64"
#endif

#endif /* PROFSYM_ARCH_H */
