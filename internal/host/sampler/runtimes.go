//go:build linux && (amd64 || arm64)

package sampler

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
)

// newRuntimes makes the host halves of the runtimes cfg enables, over
// their BPF maps, and installs their walkers in the walker's program array
// (slot = runtime kind). A runtime whose walker is not installed leaves its
// processes' stacks native, marked StopRuntime.
func (s *Sampler) newRuntimes() ([]runtimes.Runtime, error) {
	var rts []runtimes.Runtime
	if s.cfg.Runtimes.CPython {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_CPYTHON), s.objs.CpythonStep); err != nil {
			return nil, fmt.Errorf("installing the CPython walker: %w", err)
		}
		rts = append(rts, cpython.New(cpython.Options{Logger: s.log.Named("cpython"), Config: s.cfg.Runtimes,
			Procs: s.objs.CpythonProcs, Counters: s.objs.CpythonStats}))
	}
	return rts, nil
}

// sizeRuntimeMaps shrinks the maps of the runtimes that are not walked to
// one entry (the programs that use them load either way).
func (s *Sampler) sizeRuntimeMaps(spec *ebpf.CollectionSpec) {
	if !s.cfg.walking() || !s.cfg.Runtimes.CPython {
		for _, name := range []string{bpf.ProfileMapCpythonProcs, bpf.ProfileMapCpythonThreads} {
			spec.Maps[name].MaxEntries = 1
		}
	}
}
