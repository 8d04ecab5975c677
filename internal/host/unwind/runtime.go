package unwind

import "github.com/profsym/profsym/bpf"

// Runtime is a language runtime of a process (HotSpot, CPython): the code
// ranges whose frames the BPF walker hands to that runtime's walker
// (bpf/runtime.h).
type Runtime struct {
	Kind   uint32      // enum runtime_kind (bpf.ProfileRuntimeKind*)
	Ranges [][2]uint64 // process addresses [lo, hi); at most MaxRuntimeRanges
}

// MaxRuntimeRanges is how many code ranges a process's runtime can have.
const MaxRuntimeRanges = len(bpf.ProfileUnwindProc{}.Rt)
