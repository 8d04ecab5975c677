//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
)

// cgroupSet is what selected_cgroups holds, so that SetCgroups writes
// only the difference.
type cgroupSet struct {
	ids map[uint64]struct{}
	all bool // cgroup_select_all: the selection outgrew the map
}

// cgroupSpec sizes selected_cgroups (one entry while nothing is selected:
// the programs never read it then) and sets cgroup_select.
func (s *Sampler) cgroupSpec(spec *ebpf.CollectionSpec) error {
	n := uint32(1)
	if s.cfg.SelectCgroups > 0 {
		n = uint32(s.cfg.SelectCgroups)
	}
	spec.Maps[bpf.ProfileMapSelectedCgroups].MaxEntries = n
	if err := spec.Variables[bpf.ProfileVarCgroupSelect].Set(s.cfg.SelectCgroups > 0); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	return nil
}

// SetCgroups makes ids (cgroup v2 ids: their directories' inode numbers)
// the selected cgroups, when Config.SelectCgroups is set. When there are
// more than Config.SelectCgroups, every cgroup passes until they fit
// again (the caller's filter after sampling then decides): the selection
// must never drop what it selects.
func (s *Sampler) SetCgroups(ids map[uint64]struct{}) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.cfg.SelectCgroups == 0 {
		return fmt.Errorf("sampler: SetCgroups without Config.SelectCgroups")
	}
	m := s.objs.SelectedCgroups
	if len(ids) > s.cfg.SelectCgroups {
		if !s.cgroups.all {
			if err := s.objs.CgroupSelectAll.Set(uint32(1)); err != nil {
				return fmt.Errorf("sampler: %w", err)
			}
			s.cgroups.all = true
			s.log.Warn("more cgroups selected than the selection holds: every cgroup is sampled, and filtered after sampling, until they fit",
				zap.Int("cgroups", len(ids)), zap.Int("max_cgroups", s.cfg.SelectCgroups))
		}
		return nil
	}
	if s.cgroups.ids == nil {
		s.cgroups.ids = map[uint64]struct{}{}
	}
	// Deletions first: the map is full when the old and new sets together
	// pass its size.
	for id := range s.cgroups.ids {
		if _, ok := ids[id]; ok {
			continue
		}
		if err := m.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("sampler: unselecting cgroup %d: %w", id, err)
		}
		delete(s.cgroups.ids, id)
	}
	for id := range ids {
		if _, ok := s.cgroups.ids[id]; ok {
			continue
		}
		if err := m.Put(id, uint8(1)); err != nil {
			return fmt.Errorf("sampler: selecting cgroup %d: %w", id, err)
		}
		s.cgroups.ids[id] = struct{}{}
	}
	if s.cgroups.all {
		if err := s.objs.CgroupSelectAll.Set(uint32(0)); err != nil {
			return fmt.Errorf("sampler: %w", err)
		}
		s.cgroups.all = false
		s.log.Info("the selected cgroups fit again: unselected ones are dropped in the kernel", zap.Int("cgroups", len(ids)))
	}
	return nil
}
