package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadata"
)

// profilingReceiver runs one sampler and reports every ReportInterval to
// the profiles and/or logs consumer.
type profilingReceiver struct {
	cfg      *Config
	set      receiver.Settings
	log      *zap.Logger
	tel      *metadata.TelemetryBuilder
	obs      *receiverhelper.ObsReport
	filter   *profbuild.Filter
	ocFilter *profbuild.Filter  // off-CPU's targets
	pods     *podTargets        // the Kubernetes targets' pod selections
	profiles xconsumer.Profiles // nil unless a profiles pipeline uses it
	logs     consumer.Logs      // nil unless a logs pipeline uses it

	sampler    *sampler.Sampler
	builder    *profbuild.Builder
	cancel     context.CancelFunc
	loops      sync.WaitGroup // report loop
	last       sampler.Stats  // counters already reported
	lastUnwind unwind.Stats
	// lastRuntimes: the runtime walkers' counters already reported.
	lastRuntimes runtimeCounters
	from         time.Time // start of the current interval
}

func newReceiver(cfg *Config, set receiver.Settings) (*profilingReceiver, error) {
	f, ocf, pods, err := cfg.filters()
	if err != nil {
		return nil, err
	}
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	// The standard otelcol_receiver_accepted/refused_* of both signals.
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{ReceiverID: set.ID, ReceiverCreateSettings: set})
	if err != nil {
		return nil, err
	}
	return &profilingReceiver{cfg: cfg, set: set, log: set.Logger, tel: tel, obs: obs, filter: f, ocFilter: ocf, pods: pods}, nil
}

// start loads the sampler. Missing privileges or kernel features fail here,
// in one line naming all of them.
func (r *profilingReceiver) start(_ context.Context, _ component.Host) error {
	if err := sampler.CheckPrerequisites(); err != nil {
		return fmt.Errorf("profiling receiver cannot sample: %w", err)
	}
	uw, err := r.cfg.Unwinding.sampler()
	if err != nil {
		return fmt.Errorf("profiling receiver: %w", err)
	}
	uw.Logger = r.log // SetDefaults gave it a no-op one
	rts, err := r.cfg.runtimes()
	if err != nil {
		return fmt.Errorf("profiling receiver: %w", err)
	}
	var oc offcpu.Config
	if r.cfg.OffCPU.Enabled {
		if oc, err = r.cfg.OffCPU.sampler(); err != nil {
			return fmt.Errorf("profiling receiver: %w", err)
		}
		if f := r.ocFilter; !f.All() {
			oc.Select = func(pid int) bool { return f.MatchPID("", pid) }
		}
	}
	// The loops' context: the pod watch starts first, so that the
	// selection in the kernel starts with the node's pods.
	ctx, cancel := context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			cancel()
			r.loops.Wait()
		}
	}()
	if err := r.watchPods(ctx); err != nil {
		return fmt.Errorf("profiling receiver: %w", err)
	}
	sel := r.cgroupSelection()
	maxCgroups := 0
	if sel != nil {
		maxCgroups = r.cfg.Selection.MaxCgroups
	}
	s, err := sampler.New(sampler.Config{
		SelectCgroups: maxCgroups,
		OffCPU:        oc,
		Runtimes:      rts,
		SampleRate:    r.cfg.SampleRate,
		MaxStackDepth: r.cfg.MaxStackDepth,
		KernelStacks:  r.cfg.KernelStacks,
		Logger:        r.log,
		Unwinding:     uw,
		// Snapshots are taken in the sampler's reader goroutine: no
		// hand-off (a wake-up) per event. r.builder is set before Start.
		OnEvent: func(ev sampler.Event) { r.builder.HandleEvent(ev) },
	})
	if err != nil {
		return fmt.Errorf("profiling receiver: %w", err)
	}
	var unwinder profbuild.Unwinder
	if u := s.Unwinder(); u != nil {
		unwinder = u
	}
	var rtSet profbuild.Runtimes
	if rs := s.Runtimes(); rs != nil {
		rtSet = rs
	}
	r.builder = profbuild.New(profbuild.Options{
		Unwinder:      unwinder,
		Runtimes:      rtSet,
		ExecTimes:     s,
		Wall:          r.cfg.OffCPU.Wall,
		SampleRate:    r.cfg.SampleRate,
		KernelSymbols: r.cfg.KernelSymbols,
		PerfMaps:      r.cfg.PerfMaps,
		Logs:          r.logs != nil,
		Filter:        r.filter,
		ScopeVersion:  r.set.BuildInfo.Version,
		Logger:        r.log,
	})
	// The selection is in place before the first sample.
	if sel != nil {
		if err := sel.selectCgroups(s, r.log); err != nil {
			return errors.Join(fmt.Errorf("profiling receiver: %w", err), s.Close())
		}
	}
	if err := s.Start(); err != nil {
		s.Close()
		return fmt.Errorf("profiling receiver: %w", err)
	}
	r.sampler = s
	r.from = time.Now()
	started = true
	r.cancel = cancel
	r.loops.Add(1)
	go r.reportLoop(ctx)
	if sel != nil {
		r.loops.Add(1) // shutdown waits for it: no update after Close
		go func() {
			defer r.loops.Done()
			sel.h.Watch(ctx, r.cfg.Selection.RescanInterval, sel.m, s.SetCgroups, r.log)
		}()
	}
	if f := r.ocFilter; oc.Select != nil && f.Generation != nil {
		r.loops.Add(1)
		go func() {
			defer r.loops.Done()
			r.retakeOffCPU(ctx, s, f.Generation)
		}()
	}
	if r.cfg.KernelStacks {
		r.loops.Add(1) // shutdown waits for it: no file left open
		go func() {
			defer r.loops.Done()
			r.builder.Warm()
		}()
	}
	r.log.Info("profiling receiver started", zap.Int("sample_rate", r.cfg.SampleRate),
		zap.String("unwinding", uw.Mode.String()), zap.Bool("off_cpu", oc.Enabled),
		zap.Duration("report_interval", r.cfg.ReportInterval), zap.Bool("kernel_stacks", r.cfg.KernelStacks),
		zap.Bool("cgroup_selection", sel != nil),
		zap.Bool("profiles", r.profiles != nil), zap.Bool("logs", r.logs != nil))
	return nil
}

func (r *profilingReceiver) reportLoop(ctx context.Context) {
	defer r.loops.Done()
	t := time.NewTicker(r.cfg.ReportInterval)
	defer t.Stop()
	var names <-chan time.Time
	if iv := r.cfg.Interpreters.NameInterval; iv > 0 && iv < r.cfg.ReportInterval && r.sampler.Runtimes() != nil {
		nt := time.NewTicker(iv)
		defer nt.Stop()
		names = nt.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.report(ctx)
		case <-names:
			r.stage(ctx)
		}
	}
}

// stage drains ahead of the report while a runtime's processes are walked,
// so that their frames are named before the runtime frees what they point
// at (interpreters.name_interval). Other hosts keep one drain per report.
func (r *profilingReceiver) stage(ctx context.Context) {
	if r.sampler.Runtimes().Walking() == 0 {
		return
	}
	if err := r.builder.Stage(r.sampler, r.from); err != nil {
		r.tel.ReceiverProfilingReportsFailed.Add(ctx, 1)
		r.log.Warn("draining the sampler ahead of the report failed", zap.Error(err))
	}
}

// retakeOffCPU has the processes off_cpu.targets left out asked about
// again whenever a target's pods change (a pod labelled into the selection
// after its processes' first waits), checked every rescan_interval.
func (r *profilingReceiver) retakeOffCPU(ctx context.Context, s *sampler.Sampler, generation func() uint64) {
	t := time.NewTicker(r.cfg.Selection.RescanInterval)
	defer t.Stop()
	gen := generation()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g := generation(); g != gen {
			gen = g
			n := s.RetakeOffCPUAnswers()
			r.log.Debug("off-CPU targets' pods changed: processes left out are asked about again", zap.Int("processes", n))
		}
	}
}

// report drains one interval and hands it to the consumers.
func (r *profilingReceiver) report(ctx context.Context) {
	began := time.Now()
	rep, err := r.builder.Collect(r.sampler, r.from)
	r.from = began
	if err != nil {
		r.tel.ReceiverProfilingReportsFailed.Add(ctx, 1)
		r.log.Warn("draining the sampler failed", zap.Error(err))
		return
	}
	r.record(ctx, rep, time.Since(began))
	if rep.Rows == 0 {
		return
	}
	var errs []error
	if r.profiles != nil {
		octx := r.obs.StartProfilesOp(ctx)
		err := r.profiles.ConsumeProfiles(octx, rep.Profiles)
		r.obs.EndProfilesOp(octx, "ebpf", rep.Profiles.SampleCount(), err)
		errs = append(errs, err)
	}
	if r.logs != nil {
		octx := r.obs.StartLogsOp(ctx)
		err := r.logs.ConsumeLogs(octx, rep.Logs)
		r.obs.EndLogsOp(octx, "ebpf", rep.Logs.LogRecordCount(), err)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		r.tel.ReceiverProfilingReportsFailed.Add(ctx, 1)
		r.log.Warn("next consumer refused the profiles", zap.Error(err))
	}
}

// record updates the receiver's own metrics.
func (r *profilingReceiver) record(ctx context.Context, rep profbuild.Report, took time.Duration) {
	r.tel.ReceiverProfilingReportDuration.Record(ctx, took.Seconds())
	r.tel.ReceiverProfilingSamples.Add(ctx, int64(rep.Samples))
	r.tel.ReceiverProfilingSamplesFiltered.Add(ctx, int64(rep.Filtered))
	for reason, n := range rep.Failures {
		r.tel.ReceiverProfilingNormalizationFailures.Add(ctx, n, reasonAttr(reason))
	}
	for reason, n := range rep.UnwindStops {
		r.tel.ReceiverProfilingUnwindStacks.Add(ctx, n, reasonAttr(reason))
	}
	if u := r.sampler.Unwinder(); u != nil {
		us := u.Stats()
		r.tel.ReceiverProfilingUnwindTableBytes.Record(ctx, us.RowBytes)
		r.tel.ReceiverProfilingUnwindTables.Record(ctx, int64(us.Tables), stateAttr("ready"))
		r.tel.ReceiverProfilingUnwindTables.Record(ctx, int64(us.TablesPending), stateAttr("pending"))
		r.tel.ReceiverProfilingUnwindTables.Record(ctx, int64(us.TablesLazy), stateAttr("unsampled"))
		r.tel.ReceiverProfilingUnwindTables.Record(ctx, int64(us.TablesNone), stateAttr("none"))
		r.tel.ReceiverProfilingUnwindTableRows.Record(ctx, int64(us.Rows))
		addDelta(ctx, r.tel.ReceiverProfilingUnwindTableEvictions, us.Evictions, r.lastUnwind.Evictions)
		addDelta(ctx, r.tel.ReceiverProfilingUnwindFallbacks, us.NoRoom, r.lastUnwind.NoRoom, reasonAttr("tables_full"))
		addDelta(ctx, r.tel.ReceiverProfilingUnwindFallbacks, us.ProcsNoRoom, r.lastUnwind.ProcsNoRoom, reasonAttr("mappings_full"))
		addDelta(ctx, r.tel.ReceiverProfilingUnwindFallbacks, us.BuildFailures, r.lastUnwind.BuildFailures, reasonAttr("no_unwind_info"))
		r.lastUnwind = us
	}
	r.tel.ReceiverProfilingProcessesTracked.Record(ctx, int64(r.builder.Tracked()))
	r.recordRuntimes(ctx, r.sampler.Runtimes(), r.sampler.ThreadContextStats())
	st, err := r.sampler.Stats()
	if err != nil {
		return
	}
	addDelta(ctx, r.tel.ReceiverProfilingSamplesLost, st.LostStack, r.last.LostStack, reasonAttr("stack"))
	addDelta(ctx, r.tel.ReceiverProfilingSamplesLost, st.LostMapFull, r.last.LostMapFull, reasonAttr("map_full"))
	addDelta(ctx, r.tel.ReceiverProfilingSamplesLost, st.LostRingbuf, r.last.LostRingbuf, reasonAttr("ringbuf"))
	addDelta(ctx, r.tel.ReceiverProfilingSamplesLost, st.LostDrain, r.last.LostDrain, reasonAttr("drain"))
	addDelta(ctx, r.tel.ReceiverProfilingStacksTruncated, st.Truncated, r.last.Truncated)
	addDelta(ctx, r.tel.ReceiverProfilingProcessEventsLost, st.LostEvents, r.last.LostEvents)
	if r.cfg.OffCPU.Enabled {
		r.recordOffCPU(ctx, st.OffCPU, r.last.OffCPU)
		r.recordSelection(ctx, "off_cpu", st.OffCPU.Selection, r.last.OffCPU.Selection)
	}
	r.recordSelection(ctx, "cpu", st.Selection, r.last.Selection)
	r.last = st
	r.log.Debug("profiling report", zap.Uint64("samples", rep.Samples), zap.Int("rows", rep.Rows),
		zap.Any("normalization_failures", rep.Failures), zap.Duration("took", took))
}

func stateAttr(state string) metric.RecordOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("state", state)))
}

func reasonAttr(reason string) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))
}

func addDelta(ctx context.Context, c metric.Int64Counter, now, before uint64, opts ...metric.AddOption) {
	if now > before {
		c.Add(ctx, int64(now-before), opts...)
	}
}

// shutdown stops reporting, emits what was sampled since the last report
// (receivers stop before the rest of the pipeline, so it can still be
// consumed) and releases the sampler.
func (r *profilingReceiver) shutdown(ctx context.Context) error {
	defer r.tel.Shutdown()
	if r.sampler == nil {
		return nil
	}
	r.cancel()
	r.loops.Wait()
	if ctx.Err() == nil {
		r.report(ctx)
	}
	err := r.sampler.Close() // also ends the event loop
	r.sampler = nil
	return err
}

// recordOffCPU counts the waits off CPU since the last report.
func (r *profilingReceiver) recordOffCPU(ctx context.Context, now, before sampler.OffCPUStats) {
	addDelta(ctx, r.tel.ReceiverProfilingOffCPUWaitsSeen, now.Seen, before.Seen)
	addDelta(ctx, r.tel.ReceiverProfilingOffCPUWaitsChosen, now.Chosen, before.Chosen)
	addDelta(ctx, r.tel.ReceiverProfilingOffCPUWaitsKept, now.Kept, before.Kept)
	for _, d := range []struct {
		reason      string
		now, before uint64
	}{
		{"below_min_wait", now.Short, before.Short},
		{"undecided", now.Undecided, before.Undecided},
		{"waits_full", now.WaitsFull, before.WaitsFull},
		{"stacks_full", now.StacksFull, before.StacksFull},
		{"map_full", now.MapFull, before.MapFull},
		{"stack", now.Stack, before.Stack},
		{"drain", now.Drain, before.Drain},
		{"stale", now.Stale, before.Stale},
		{"never_returned", now.NeverReturned, before.NeverReturned},
	} {
		addDelta(ctx, r.tel.ReceiverProfilingOffCPUWaitsDropped, d.now, d.before, reasonAttr(d.reason))
	}
}
