/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Language runtimes in the user stack walk (docs/runtimes.md).
 *
 * A process whose runtime profsym can walk (HotSpot, CPython) has its kind and
 * up to RT_RANGES code ranges in its unwind_proc entry: the JIT code cache, or
 * the interpreter loop. When the native walker (walk.h) reaches a PC in one of
 * them it tail-calls the runtime's walker (walk_progs slot = enum
 * runtime_kind), which pushes the runtime's frames, leaves the native state
 * (pc, sp, fp) at the next frame the native walker understands, and
 * tail-calls back (WALK_NATIVE). A runtime walker that handled s->pc but
 * wants the native walker to step over its frame without pushing it (CPython:
 * the Python frames replace _PyEval_EvalFrameDefault) sets rt_handled.
 *
 * A runtime frame takes two words of user_stack.pcs:
 *   word 0: RT_FRAME | kind << RT_KIND_SHIFT | ptr (a user address)
 *   word 1: aux (what the kind says: a bytecode index, a PC offset, ...)
 * User addresses never reach bit RT_KIND_SHIFT, so a native PC is never
 * mistaken for one. Userspace names runtime frames on the host
 * (internal/host/runtimes): what they point at lives in the process.
 */
#ifndef PROFSYM_RUNTIME_H
#define PROFSYM_RUNTIME_H

/* Bits of a word of user_stack.pcs (an enum so bpf2go exports them). */
enum stack_word_bits {
	PC_EXACT_BIT = 63,   /* a native PC that is not a return address */
	RT_FRAME_BIT = 62,   /* word 0 of a runtime frame */
	RT_KIND_SHIFT = 56,  /* enum frame_kind, 6 bits */
	RT_KIND_BITS = 6,
};
#define PC_EXACT (1ull << PC_EXACT_BIT)
#define RT_FRAME (1ull << RT_FRAME_BIT)
#define RT_PTR_MASK ((1ull << RT_KIND_SHIFT) - 1)

/* The runtime of a process, and the walk_progs slot of its walker. */
enum runtime_kind {
	RUNTIME_NONE = 0,
	RUNTIME_HOTSPOT = 1,
	RUNTIME_CPYTHON = 2,
	RUNTIME_V8 = 3,
	RUNTIME_PHP = 4,
	RUNTIME_PERL = 5,
	RUNTIME_RUBY = 6,
	RUNTIME_KINDS = 7,
};

/* Slots of a walk_progs array. */
enum walk_prog {
	WALK_NATIVE = 0,
	WALK_HOTSPOT = RUNTIME_HOTSPOT,
	WALK_CPYTHON = RUNTIME_CPYTHON,
	WALK_V8 = RUNTIME_V8,
	WALK_PHP = RUNTIME_PHP,
	WALK_PERL = RUNTIME_PERL,
	WALK_RUBY = RUNTIME_RUBY,
	WALK_COPY = RUNTIME_KINDS, /* copies a not-ready sample's stack (unwind.h) */
	WALK_PROGS = RUNTIME_KINDS + 1,
};

/* Kinds of runtime frames: what word 0's ptr and word 1's aux are. Each
 * runtime numbers its own within its block; RT_KIND_BITS leaves room for 64
 * kinds, so the runtimes after the first two get blocks of 8. */
enum frame_kind {
	FRAME_HOTSPOT_FIRST = 1,  /* 1-15: HotSpot (hotspot.h) */
	FRAME_CPYTHON_FIRST = 16, /* 16-31: CPython (cpython.h) */
	FRAME_V8_FIRST = 32,      /* 32-39: V8 (Node.js) */
	FRAME_PHP_FIRST = 40,     /* 40-47: PHP */
	FRAME_PERL_FIRST = 48,    /* 48-55: Perl */
	FRAME_RUBY_FIRST = 56,    /* 56-63: Ruby */
	FRAME_KINDS = 64,
};

/* CPython: the eval loop and its .cold part; V8: its builtins and up to
 * three spans of JIT code (isolates' code ranges near the binary, whose
 * short builtin calls need no copy, and away from it). */
#define RT_RANGES 4

struct rt_range {
	__u64 lo, hi; /* process addresses [lo, hi) */
};

#endif /* PROFSYM_RUNTIME_H */
