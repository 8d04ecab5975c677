//go:build linux && (amd64 || arm64)

package sampler

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
	"github.com/profsym/profsym/internal/host/runtimes/golabels"
	"github.com/profsym/profsym/internal/host/runtimes/hotspot"
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
	return rts, nil
}

// newLabeler makes the Go labels reader when cfg asks for it.
func (s *Sampler) newLabeler() runtimes.Labeler {
	if !s.cfg.Runtimes.GoLabels {
		return nil
	}
	rc := s.cfg.Runtimes
	rc.SetDefaults()
	return golabels.New(golabels.Options{
		Procs: s.objs.GoProcs, Logger: s.log.Named("golabels"),
		Limits: golabels.Limits{MaxLabels: rc.MaxLabels, MaxBytes: rc.MaxLabelBytes},
	})
}
