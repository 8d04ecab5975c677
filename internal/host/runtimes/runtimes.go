// Package runtimes names the frames of language runtimes that the eBPF
// walker finds in user stacks: HotSpot's interpreted and compiled Java
// methods, CPython's code objects, Perl's subs, PHP's functions, Ruby's
// iseqs and V8's JavaScript functions (docs/runtimes.md).
//
// The walker records what it finds as it finds it, a pointer into the
// process and a number beside it (bpf/runtime.h); what they mean lives in
// that process's memory, so these frames are named here, on the host that
// sampled them, not later from a build id. Each runtime is a package below
// this one (hotspot, cpython) implementing Runtime; a Set holds them,
// decides per process which one runs there, tells the BPF walker which code
// that runtime's walker takes (unwind.Manager.SetRuntime), and routes each
// frame to its runtime for a name.
package runtimes

import (
	"errors"
	"fmt"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
)

// Kind is a runtime (enum runtime_kind of bpf/runtime.h).
type Kind uint32

// Runtimes the walker knows.
const (
	KindNone    = Kind(bpf.ProfileRuntimeKindRUNTIME_NONE)
	KindHotSpot = Kind(bpf.ProfileRuntimeKindRUNTIME_HOTSPOT)
	KindCPython = Kind(bpf.ProfileRuntimeKindRUNTIME_CPYTHON)
	KindV8      = Kind(bpf.ProfileRuntimeKindRUNTIME_V8)
	KindPHP     = Kind(bpf.ProfileRuntimeKindRUNTIME_PHP)
	KindPerl    = Kind(bpf.ProfileRuntimeKindRUNTIME_PERL)
	KindRuby    = Kind(bpf.ProfileRuntimeKindRUNTIME_RUBY)
)

// First frame kind of each runtime's block (enum frame_kind): a runtime
// numbers its frame kinds from there, up to the next block (HotSpot's is
// 1-15, kind 0 being no runtime frame; CPython's 16-31; then blocks of 8).
const (
	FrameHotSpotFirst = uint8(bpf.ProfileFrameKindFRAME_HOTSPOT_FIRST)
	FrameCPythonFirst = uint8(bpf.ProfileFrameKindFRAME_CPYTHON_FIRST)
	FrameV8First      = uint8(bpf.ProfileFrameKindFRAME_V8FIRST)
	FramePHPFirst     = uint8(bpf.ProfileFrameKindFRAME_PHP_FIRST)
	FramePerlFirst    = uint8(bpf.ProfileFrameKindFRAME_PERL_FIRST)
	FrameRubyFirst    = uint8(bpf.ProfileFrameKindFRAME_RUBY_FIRST)
	FrameKinds        = uint8(bpf.ProfileFrameKindFRAME_KINDS)
)

// blocks are the frame kind blocks in order: block i runs from its first
// kind up to block i+1's.
var blocks = [...]struct {
	first uint8
	kind  Kind
	typ   string
}{
	{FrameHotSpotFirst, KindHotSpot, frame.TypeJVM},
	{FrameCPythonFirst, KindCPython, frame.TypeCPython},
	{FrameV8First, KindV8, frame.TypeV8JS},
	{FramePHPFirst, KindPHP, frame.TypePHP},
	{FramePerlFirst, KindPerl, frame.TypePerl},
	{FrameRubyFirst, KindRuby, frame.TypeRuby},
	{FrameKinds, KindNone, frame.TypeNative},
}

// KindOf is the runtime whose block a frame kind is in, KindNone for
// none. The blocks are decided here only: each runtime once computed its
// own, and HotSpot's took CPython's first kind (issue 26).
func KindOf(frameKind uint8) Kind {
	for i := 0; i+1 < len(blocks); i++ {
		if frameKind >= blocks[i].first && frameKind < blocks[i+1].first {
			return blocks[i].kind
		}
	}
	return KindNone
}

// Block is the range of frame kinds [first, end) of runtime k; first ==
// end for a kind that has none.
func Block(k Kind) (first, end uint8) {
	for i := 0; i+1 < len(blocks); i++ {
		if blocks[i].kind == k {
			return blocks[i].first, blocks[i+1].first
		}
	}
	return 0, 0
}

// Frame is one runtime frame as the walker recorded it.
type Frame struct {
	Kind uint8  // enum frame_kind: what Ptr and Aux are
	Ptr  uint64 // an address in the process (a method, a code object)
	Aux  uint64 // a bytecode index, a PC offset, ... as Kind says
}

// Symbol is what a runtime frame is called: one frame, or several when
// the runtime inlined methods into it (innermost first, as frame.Frame
// slices always are), and the profile.frame.type of them all.
type Symbol struct {
	Frames []frame.Frame
	Type   string
}

// Runtime is one runtime's host half.
type Runtime interface {
	// Kind says which runtime this is; its walker has that walk_progs slot,
	// and the frames whose kind is in its block (KindOf) are its.
	Kind() Kind
	// Attach inspects a process snapshot. found is false when the process
	// does not run this runtime. Otherwise Attach loads what the BPF
	// walker needs for the process and returns the code ranges (process
	// addresses [lo, hi)) whose frames the walker hands to this runtime's
	// walker; an error says why the process, although it runs this
	// runtime, cannot be walked (its stacks keep their native frames).
	// Ranges returned with an error are that runtime's code, which the
	// walker then only marks (stop reason runtime); nil for none.
	Attach(p *normalize.Process) (ranges [][2]uint64, found bool, err error)
	// Forget drops what Attach loaded for pid (the process exited).
	Forget(pid int)
	// Name names one frame of pid.
	Name(pid int, f Frame) (Symbol, error)
}

// Errors a frame can stay unnamed with, counted by reason.
var (
	// ErrProcessGone: the process exited before its frames were named.
	ErrProcessGone = errors.New("process_gone")
	// ErrBadFrame: what the frame points at failed the runtime's checks
	// (freed, moved, or never what it seemed).
	ErrBadFrame = errors.New("bad_runtime_frame")
	// ErrNotAttached: the frame's process or runtime is not known here.
	ErrNotAttached = errors.New("runtime_not_attached")
)

// Reason maps an error from Name to the reason a frame stays raw.
func Reason(err error) string {
	for _, r := range []error{ErrProcessGone, ErrBadFrame, ErrNotAttached, frame.ErrLimitExceeded} {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	return "runtime_error"
}

// FrameType is the profile.frame.type of a frame kind.
func FrameType(kind uint8) string {
	k := KindOf(kind)
	for _, b := range blocks {
		if k != KindNone && b.kind == k {
			return b.typ
		}
	}
	return frame.TypeNative
}

func kindError(f Frame) error {
	return fmt.Errorf("runtime frame of kind %d: %w", f.Kind, ErrNotAttached)
}

// ObjectID is the 32-bit id a runtime's BPF walker records beside an
// object it pushed a frame for (a code object, a function, a sub): the
// words hashed as bpf/unwind.h's mix does, folded to 32 bits, never 0. A
// runtime names the frame only if the object it reads later hashes to the
// same id.
func ObjectID(words ...uint64) uint32 {
	h := uint64(0xcbf29ce484222325)
	for _, v := range words {
		h ^= v
		h *= 0x100000001b3 // FNV-1a's prime, per 64-bit word
		h ^= h >> 29
	}
	id := uint32(h ^ h>>32)
	if id == 0 {
		id = 1
	}
	return id
}
