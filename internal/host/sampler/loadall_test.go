//go:build linux && (amd64 || arm64)

package sampler

import (
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/unwind"
)

// TestLoadsEveryProgram loads what the receiver's defaults load and more:
// the CFI walker, every runtime walker, the Go labels and thread context
// reads, and the off-CPU programs with their walker instances. The kernel matrix (make test-kernels) runs it on every
// kernel, so a program an older verifier refuses is found there, not by a
// user whose receiver does not start.
func TestLoadsEveryProgram(t *testing.T) {
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true,
		Runtimes: runtimes.Config{
			HotSpot: true, CPython: true, Perl: true, PHP: true, Ruby: true, V8: true,
			GoLabels: true, MaxLabels: runtimes.DefaultMaxLabels, MaxLabelBytes: runtimes.DefaultMaxLabelBytes,
			ThreadContext: true,
		},
		OffCPU: offcpu.Config{Enabled: true},
		// unwind_copy too (newSampler leaves copies off otherwise).
		Unwinding: unwind.Config{StackCopyBytes: unwind.DefaultStackCopyBytes},
	})
	if copies := runtime.GOARCH == "amd64"; (s.objs.UnwindCopy != nil) != copies {
		t.Errorf("unwind_copy loaded: %v, want %v (stack copies are x86-64's)", s.objs.UnwindCopy != nil, copies)
	}
	if s.Runtimes() == nil {
		t.Fatal("no runtimes with every runtime on")
	}
	for name, err := range s.RefusedRuntimes() {
		t.Errorf("the verifier refused the %s walker: %v", name, err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := s.Drain(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: samples %d, unwind frames %d, stops %v", st.Samples, st.UnwindFrames, st.Stops)
}

// TestRefusedRuntimeWalker: a runtime walker the verifier refuses (here
// made so: it reads its stack out of bounds) leaves the sampler running
// without that runtime, not failing to start.
func TestRefusedRuntimeWalker(t *testing.T) {
	specHook = func(spec *ebpf.CollectionSpec) {
		spec.Programs["cpython_step"].Instructions = asm.Instructions{
			asm.LoadMem(asm.R0, asm.R10, 8, asm.DWord), // above the frame
			asm.Return(),
		}
	}
	t.Cleanup(func() { specHook = nil })
	s := newSampler(t, Config{SampleRate: 99, Runtimes: runtimes.Config{HotSpot: true, CPython: true, PHP: true, Ruby: true}})
	refused := s.RefusedRuntimes()
	if _, ok := refused["cpython"]; !ok || len(refused) != 1 {
		t.Fatalf("refused %v, want cpython alone", refused)
	}
	t.Logf("refused: %v", refused["cpython"])
	if s.objs.CpythonStep != nil || s.objs.HotspotStep == nil || s.objs.PhpStep == nil || s.objs.RubyStep == nil {
		t.Errorf("loaded cpython %v, hotspot %v, php %v, ruby %v", s.objs.CpythonStep, s.objs.HotspotStep, s.objs.PhpStep, s.objs.RubyStep)
	}
}

// TestRefusedPerlWalker: the Perl walker refused leaves the others.
func TestRefusedPerlWalker(t *testing.T) {
	specHook = func(spec *ebpf.CollectionSpec) {
		spec.Programs["perl_step"].Instructions = asm.Instructions{
			asm.LoadMem(asm.R0, asm.R10, 8, asm.DWord), // above the frame
			asm.Return(),
		}
	}
	t.Cleanup(func() { specHook = nil })
	s := newSampler(t, Config{SampleRate: 99, Runtimes: runtimes.Config{CPython: true, Perl: true}})
	refused := s.RefusedRuntimes()
	if _, ok := refused["perl"]; !ok || len(refused) != 1 {
		t.Fatalf("refused %v, want perl alone", refused)
	}
	if s.objs.PerlStep != nil || s.objs.CpythonStep == nil {
		t.Errorf("loaded perl %v, cpython %v", s.objs.PerlStep, s.objs.CpythonStep)
	}
}
