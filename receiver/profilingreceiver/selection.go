package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/host/cgsel"
	"github.com/profsym/profsym/internal/host/sampler"
)

// mountinfo is where the cgroup v2 hierarchy is looked for (tests: a
// cgroup v1 host's).
var mountinfo = "/proc/self/mountinfo"

// cgroupSelection is the selection of targets in the kernel: the cgroups
// whose paths a target matches, below the v2 hierarchy.
type cgroupSelection struct {
	h cgsel.Hierarchy
	m cgsel.Matcher
}

// cgroupSelection returns the selection in the kernel, or nil when the
// targets are filtered after sampling only: no targets, a target that
// names no cgroup, or a host without cgroup v2 (the log says which).
func (r *profilingReceiver) cgroupSelection() *cgroupSelection {
	if r.filter.All() {
		return nil
	}
	match, below, ok := r.filter.CgroupMatcher()
	if !ok {
		r.log.Info("a target names no cgroup: targets are filtered after sampling (every process is sampled and walked)")
		return nil
	}
	h, ok, err := cgsel.Find(mountinfo)
	if err != nil || !ok {
		r.log.Warn("no cgroup v2 hierarchy (a cgroup v1 host): targets by cgroup are filtered after sampling (every process is sampled and walked)",
			zap.Error(err))
		return nil
	}
	return &cgroupSelection{h: h, m: cgsel.Matcher{Match: match, Below: below}}
}

// selectCgroups puts the cgroups selected now in the sampler, before it
// starts.
func (c *cgroupSelection) selectCgroups(s *sampler.Sampler, log *zap.Logger) error {
	ids, err := c.h.Scan(c.m)
	if err != nil {
		return err
	}
	if err := s.SetCgroups(ids); err != nil {
		return fmt.Errorf("selecting cgroups: %w", err)
	}
	log.Info("targets are selected in the kernel, by cgroup", zap.String("cgroup2", c.h.Dir), zap.Int("cgroups", len(ids)))
	return nil
}

func verdictAttrs(origin, verdict string) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("origin", origin), attribute.String("verdict", verdict)))
}

// recordSelection counts the selection's verdicts since the last report.
func (r *profilingReceiver) recordSelection(ctx context.Context, origin string, now, before sampler.SelectionStats) {
	addDelta(ctx, r.tel.ReceiverProfilingSelectionVerdicts, now.Selected, before.Selected, verdictAttrs(origin, "selected"))
	addDelta(ctx, r.tel.ReceiverProfilingSelectionVerdicts, now.NotSelected, before.NotSelected, verdictAttrs(origin, "not_selected"))
}
