//go:build linux && (amd64 || arm64)

package sampler

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
	"github.com/profsym/profsym/internal/host/runtimes/hotspot"
	v8 "github.com/profsym/profsym/internal/host/runtimes/v8"
)

// newRuntimes makes the host halves of the runtimes cfg enables, over
// their BPF maps, and installs their walkers in the walker's program array
// (slot = runtime kind). A runtime whose walker is not installed leaves its
// processes' stacks native, marked StopRuntime.
func (s *Sampler) newRuntimes() ([]runtimes.Runtime, error) {
	var rts []runtimes.Runtime
	if s.walkHotSpot() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_HOTSPOT), s.objs.HotspotStep); err != nil {
			return nil, fmt.Errorf("installing the HotSpot walker: %w", err)
		}
		rts = append(rts, hotspot.New(s.cfg.Runtimes, s.objs.HotspotProcs, s.objs.HotspotErrors, s.log.Named("hotspot")))
	}
	if s.walkCPython() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_CPYTHON), s.objs.CpythonStep); err != nil {
			return nil, fmt.Errorf("installing the CPython walker: %w", err)
		}
		rts = append(rts, cpython.New(cpython.Options{Logger: s.log.Named("cpython"), Config: s.cfg.Runtimes,
			Procs: s.objs.CpythonProcs, Counters: s.objs.CpythonStats}))
	}
	if s.walkV8() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_V8), s.objs.V8Step); err != nil {
			return nil, fmt.Errorf("installing the V8 walker: %w", err)
		}
		rts = append(rts, v8.New(v8.Options{
			Logger: s.log.Named("v8"), Config: s.cfg.Runtimes,
			Procs: s.objs.V8Procs, Counters: s.objs.V8Stats,
		}))
	}
	return rts, nil
}
