//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
)

// loadObjects loads what the configuration needs and nothing more: a
// mode's maps are tens of MB, a runtime walker is a program the verifier
// must accept. When the kernel's verifier refuses a runtime's walker, the
// sampler loads without that runtime (its processes keep native frames,
// marked runtime) rather than not at all; RefusedRuntimes says which and
// why.
func (s *Sampler) loadObjects(spec *ebpf.CollectionSpec) error {
	for {
		err := s.loadGroups(spec)
		if err == nil {
			return nil
		}
		name, refused := s.refusedRuntime(err)
		if !refused {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				s.log.Debug("BPF verifier rejected the sampler", zap.String("log", fmt.Sprintf("%+v", ve)))
			}
			return loadError(err)
		}
		s.log.Error("this kernel's verifier refused a runtime's walker: its processes keep native frames (stop reason runtime)",
			zap.String("runtime", name), zap.Error(loadError(err)))
		if s.refused == nil {
			s.refused = map[string]error{}
		}
		s.refused[name] = loadError(err)
	}
}

// loadGroups loads the object groups the configuration asks for in one
// collection load (shared maps are created once).
func (s *Sampler) loadGroups(spec *ebpf.CollectionSpec) error {
	var o objects
	groups := []any{&o.commonObjs}
	switch {
	case s.cfg.Mode == ModeRingBuffer:
		groups = append(groups, &o.rbObjs)
	default:
		groups = append(groups, &o.aggObjs)
		if s.cfg.stackCopyBytes() > 0 {
			groups = append(groups, &o.copyObjs)
		}
		if s.walkHotSpot() {
			groups = append(groups, &o.hotspotObjs)
		}
		if s.walkCPython() {
			groups = append(groups, &o.cpythonObjs)
		}
		if s.walkPerl() {
			groups = append(groups, &o.perlObjs)
		}
		if s.walkPHP() {
			groups = append(groups, &o.phpObjs)
		}
		if s.walkRuby() {
			groups = append(groups, &o.rubyObjs)
		}
		if s.walkV8() {
			groups = append(groups, &o.v8Objs)
		}
		if s.offcpu != nil {
			groups = append(groups, &o.offcpuObjs)
			if s.walkHotSpot() {
				groups = append(groups, &o.offcpuHotspotObjs)
			}
			if s.walkCPython() {
				groups = append(groups, &o.offcpuCpythonObjs)
			}
			if s.walkPerl() {
				groups = append(groups, &o.offcpuPerlObjs)
			}
			if s.walkPHP() {
				groups = append(groups, &o.offcpuPhpObjs)
			}
			if s.walkRuby() {
				groups = append(groups, &o.offcpuRubyObjs)
			}
			if s.walkV8() {
				groups = append(groups, &o.offcpuV8Objs)
			}
		}
	}
	// LoadAndAssign takes one struct: make one whose fields point at the
	// groups chosen.
	fields := make([]reflect.StructField, len(groups))
	for i, g := range groups {
		fields[i] = reflect.StructField{Name: fmt.Sprintf("G%d", i), Type: reflect.TypeOf(g)}
	}
	target := reflect.New(reflect.StructOf(fields)).Elem()
	for i, g := range groups {
		target.Field(i).Set(reflect.ValueOf(g))
	}
	if err := spec.LoadAndAssign(target.Addr().Interface(), nil); err != nil {
		return err
	}
	s.objs = o
	return nil
}

// Each runtime's programs, by the runtime's name.
var runtimePrograms = map[string][]string{
	"hotspot": {"hotspot_step", "offcpu_walk_hotspot"},
	"cpython": {"cpython_step", "offcpu_walk_cpython"},
	"perl":    {"perl_step", "offcpu_walk_perl"},
	"php":     {"php_step", "offcpu_walk_php"},
	"ruby":    {"ruby_step", "offcpu_walk_ruby"},
	"v8":      {"v8_step", "offcpu_walk_v8"},
}

// refusedRuntime names the runtime whose program a load failure is about,
// if it is one being loaded.
func (s *Sampler) refusedRuntime(err error) (string, bool) {
	msg := err.Error()
	for name, progs := range runtimePrograms {
		if _, done := s.refused[name]; done {
			continue
		}
		if name == "hotspot" && !s.walkHotSpot() || name == "cpython" && !s.walkCPython() || name == "perl" && !s.walkPerl() || name == "php" && !s.walkPHP() || name == "ruby" && !s.walkRuby() || name == "v8" && !s.walkV8() {
			continue
		}
		for _, p := range progs {
			if strings.Contains(msg, "program "+p+":") {
				return name, true
			}
		}
	}
	return "", false
}

func (s *Sampler) walkHotSpot() bool {
	_, refused := s.refused["hotspot"]
	return s.cfg.walking() && s.cfg.Runtimes.HotSpot && !refused
}

func (s *Sampler) walkCPython() bool {
	_, refused := s.refused["cpython"]
	return s.cfg.walking() && s.cfg.Runtimes.CPython && !refused
}

func (s *Sampler) walkPerl() bool {
	_, refused := s.refused["perl"]
	return s.cfg.walking() && s.cfg.Runtimes.Perl && !refused
}

func (s *Sampler) walkPHP() bool {
	_, refused := s.refused["php"]
	return s.cfg.walking() && s.cfg.Runtimes.PHP && !refused
}

func (s *Sampler) walkRuby() bool {
	_, refused := s.refused["ruby"]
	return s.cfg.walking() && s.cfg.Runtimes.Ruby && !refused
}

func (s *Sampler) walkV8() bool {
	_, refused := s.refused["v8"]
	return s.cfg.walking() && s.cfg.Runtimes.V8 && !refused
}

// RefusedRuntimes says which runtimes the configuration asked for but the
// kernel's verifier refused to load the walkers of, and why.
func (s *Sampler) RefusedRuntimes() map[string]error { return s.refused }
