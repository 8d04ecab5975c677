package profilingreceiver

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/threadctx"
)

// runtimeCounters are the runtime walkers' cumulative counters already
// reported.
type runtimeCounters struct {
	set    runtimes.Stats
	walk   map[string]map[string]uint64
	labels runtimes.LabelStats
	tctx   threadctx.Stats
}

// recordRuntimes reports what the runtime walkers did since the last
// report: processes attached and refused, walks the BPF walkers could not
// finish, frames left unnamed; and what the Go labels and thread context
// readers did.
func (r *profilingReceiver) recordRuntimes(ctx context.Context, s *runtimes.Set, tc threadctx.Stats) {
	if s == nil {
		return
	}
	st, walk := s.Stats(), s.WalkErrors()
	last := r.lastRuntimes
	addDelta(ctx, r.tel.ReceiverProfilingRuntimeAttached, st.Attached, last.set.Attached)
	for rt, n := range st.Failed {
		addDelta(ctx, r.tel.ReceiverProfilingRuntimeRefused, n, last.set.Failed[rt], attrs(attribute.String("runtime", rt)))
	}
	for reason, n := range st.Unnamed {
		addDelta(ctx, r.tel.ReceiverProfilingRuntimeFramesUnnamed, n, last.set.Unnamed[reason], reasonAttr(reason))
	}
	for rt, byReason := range walk {
		for reason, n := range byReason {
			addDelta(ctx, r.tel.ReceiverProfilingRuntimeWalkErrors, n, last.walk[rt][reason],
				attrs(attribute.String("runtime", rt), attribute.String("reason", reason)))
		}
	}
	ls := s.LabelStats()
	addDelta(ctx, r.tel.ReceiverProfilingGoLabelsProcesses, ls.Attached, last.labels.Attached)
	for reason, n := range ls.Refused {
		addDelta(ctx, r.tel.ReceiverProfilingGoLabelsRefused, n, last.labels.Refused[reason], reasonAttr(reason))
	}
	addDelta(ctx, r.tel.ReceiverProfilingGoLabelsUnread, ls.Failed, last.labels.Failed)
	addDelta(ctx, r.tel.ReceiverProfilingThreadContextProcesses, tc.Attached, last.tctx.Attached)
	for reason, n := range tc.Refused {
		addDelta(ctx, r.tel.ReceiverProfilingThreadContextRefused, n, last.tctx.Refused[reason], reasonAttr(reason))
	}
	r.lastRuntimes = runtimeCounters{set: st, walk: walk, labels: ls, tctx: tc}
}

func attrs(kv ...attribute.KeyValue) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}
