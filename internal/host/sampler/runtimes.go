//go:build linux && (amd64 || arm64)

package sampler

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
	"github.com/profsym/profsym/internal/host/runtimes/golabels"
	"github.com/profsym/profsym/internal/host/runtimes/hotspot"
	"github.com/profsym/profsym/internal/host/runtimes/perl"
	"github.com/profsym/profsym/internal/host/runtimes/php"
	"github.com/profsym/profsym/internal/host/runtimes/ruby"
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
	if s.walkPerl() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_PERL), s.objs.PerlStep); err != nil {
			return nil, fmt.Errorf("installing the Perl walker: %w", err)
		}
		rts = append(rts, perl.New(perl.Options{
			Logger: s.log.Named("perl"), Config: s.cfg.Runtimes,
			Procs: s.objs.PerlProcs, Counters: s.objs.PerlStats,
		}))
	}
	if s.walkPHP() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_PHP), s.objs.PhpStep); err != nil {
			return nil, fmt.Errorf("installing the PHP walker: %w", err)
		}
		rts = append(rts, php.New(php.Options{
			Logger: s.log.Named("php"), Config: s.cfg.Runtimes,
			Procs: s.objs.PhpProcs, Counters: s.objs.PhpStats,
		}))
	}
	if s.walkRuby() {
		if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_RUBY), s.objs.RubyStep); err != nil {
			return nil, fmt.Errorf("installing the Ruby walker: %w", err)
		}
		rts = append(rts, ruby.New(ruby.Options{
			Logger: s.log.Named("ruby"), Config: s.cfg.Runtimes,
			Procs: s.objs.RubyProcs, Counters: s.objs.RubyStats,
		}))
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
