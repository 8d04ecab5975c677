/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Enumerations shared by the programs and userspace. bpf2go exports them
 * (-type), so the Go side uses these values instead of copies.
 */
#ifndef PROFSYM_TYPES_H
#define PROFSYM_TYPES_H

/* Why a user stack ended, or the first thing that made it less than exact.
 * Generated into Go (bpf2go -type) as sampler.StopReason. */
enum stop_reason {
	STOP_OK = 0,              /* outermost frame reached */
	STOP_NOT_READY = 1,       /* process or table not loaded yet: frame pointers */
	STOP_UNKNOWN_MAPPING = 2, /* PC in no known mapping of the process */
	STOP_NO_TABLE = 3,        /* file without CFI, or evicted, or PC outside its rows */
	STOP_READ_FAULT = 4,      /* reading the stack failed */
	STOP_DEPTH = 5,           /* max depth reached */
	STOP_BAD_FRAME = 6,       /* stack pointer went backwards, or zero PC */
	STOP_FP_ONLY = 7,         /* unwinding.mode frame_pointers: no walk here */
	STOP_JIT = 8,             /* ended in code without unwind info (JIT, anonymous memory) */
	STOP_RUNTIME = 9,         /* a runtime's walker gave up (unknown layout, bad pointer) */
	STOP_STACK_COPY_TRUNCATED = 10, /* a not-ready sample's copied stack ended before the walk did */
	STOP_EXEC = 11,           /* copied stack of the image the process replaced by exec (host walk only) */
	STOP_REASONS = 12,
	STOP_SLOTS = 16,          /* room in stats.stops: a power of two */
};

/* What a walked stack is recorded for (sample_key.origin). */
enum sample_origin {
	ORIGIN_CPU = 0,     /* a CPU-clock sample */
	ORIGIN_OFF_CPU = 1, /* a wait off CPU (offcpu.h): the stack is kept until the thread runs again */
};

/* The cgroup selection's verdict on a CPU sample or on a thread leaving a
 * CPU (stats.selection, offcpu_stats.selection), counted only while
 * selected_cgroups is in use (cgroup_select). */
enum select_verdict {
	SELECT_NOT_SELECTED = 0, /* its cgroup is not selected: dropped before any walk */
	SELECT_SELECTED = 1,     /* selected: walked */
	SELECT_VERDICTS = 2,
};

#endif /* PROFSYM_TYPES_H */
