//go:build linux && (amd64 || arm64)

// Package sampler loads profsym's eBPF CPU sampler (package bpf), attaches it
// to a CPU-clock perf event on every online CPU and hands out aggregated raw
// samples: pid, tid, comm, CPU, user and kernel program counters, count and
// time range. It does no symbolization; user PCs are raw virtual addresses of
// the sampled process, to be mapped through /proc/PID/maps by the caller, who
// learns about new, exec'ing and exiting processes through Events.
package sampler

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/threadctx"
	"github.com/profsym/profsym/internal/host/unwind"
)

// cpuEvent is one online CPU's perf event and the link attaching the
// sampling program to it; the Sampler owns both.
type cpuEvent struct {
	cpu  int
	fd   int
	link link.Link
}

// Sampler owns every kernel object it creates: the BPF programs and maps
// (objs), one perf event fd and link per CPU, the tracing links and the ring
// buffer readers. Close releases all of them.
type Sampler struct {
	cfg  Config
	log  *zap.Logger
	objs objects

	cpus      []cpuEvent
	tracing   []link.Link
	eventsRd  *ringbuf.Reader
	samplesRd *ringbuf.Reader // ModeRingBuffer only
	// samplesFlushed: the reader has read what was in the ring at a Flush.
	samplesFlushed chan struct{}
	copiesRd       *ringbuf.Reader // nil unless stacks are copied (copies.go)
	events         chan Event
	eventsClosed   bool
	wg             sync.WaitGroup

	mu sync.Mutex // serializes Start, Drain and Close
	// mapsMu orders ExecTime's map reads before the maps are closed.
	mapsMu     sync.RWMutex
	mapsClosed bool
	started    bool
	closed     bool
	active     uint32 // kernel aggregation: buffer the program writes

	paths          kernelPaths        // code paths chosen for this kernel
	perfIoctl      bool               // programs attached by PERF_EVENT_IOC_SET_BPF, not links
	unwinder       *unwind.Manager    // nil unless walking with unwind tables
	runtimes       *runtimes.Set      // nil unless walking, with a runtime enabled
	threadCtx      *threadctx.Tracker // nil unless thread_context is on (also in runtimes)
	offcpu         *offcpuState       // nil unless off-CPU samples are on
	agg            *rbAggregator      // ModeRingBuffer only
	truncatedUser  atomic.Uint64      // counted in Go (kernel aggregation)
	lostEventsUser atomic.Uint64
	lostDrain      atomic.Uint64 // samples whose stack a drain could not read
	drainErrors    atomic.Uint64
	copyStops      [NumStopReasons]atomic.Uint64 // how the host walks of stack copies ended

	drainHook func(*drain) // tests: wraps the maps a drain reads

	refused map[string]error // runtimes whose walkers the verifier refused

	cgroups cgroupSet // Config.SelectCgroups: what selected_cgroups holds
}

// Kernel objects, in groups per mode: only the chosen mode's objects are
// loaded, so the other's maps (up to tens of MB of stack buckets) are never
// created.
type commonObjs struct {
	HandleExit *ebpf.Program  `ebpf:"handle_exit"`
	HandleExec *ebpf.Program  `ebpf:"handle_exec"`
	StatsMap   *ebpf.Map      `ebpf:"stats_map"`
	Events     *ebpf.Map      `ebpf:"events"`
	Seen       *ebpf.Map      `ebpf:"seen"`
	ExecTimes  *ebpf.Map      `ebpf:"exec_times"`
	ActiveBuf  *ebpf.Variable `ebpf:"active_buf"`

	SelectedCgroups *ebpf.Map      `ebpf:"selected_cgroups"`
	CgroupSelectAll *ebpf.Variable `ebpf:"cgroup_select_all"`
}

type aggObjs struct {
	ProfileAgg   *ebpf.Program `ebpf:"profile_agg"`
	Counts0      *ebpf.Map     `ebpf:"counts0"`
	Counts1      *ebpf.Map     `ebpf:"counts1"`
	Stacks0      *ebpf.Map     `ebpf:"stacks0"`
	Stacks1      *ebpf.Map     `ebpf:"stacks1"`
	Barrier      *ebpf.Map     `ebpf:"barrier"`
	BarrierInner *ebpf.Map     `ebpf:"barrier_inner"`

	UnwindStep     *ebpf.Program `ebpf:"unwind_step"`
	UnwindProgs    *ebpf.Map     `ebpf:"unwind_progs"`
	UnwindProcs    *ebpf.Map     `ebpf:"unwind_procs"`
	UnwindExits    *ebpf.Map     `ebpf:"unwind_exits"`
	UnwindMappings *ebpf.Map     `ebpf:"unwind_mappings"`
	UnwindTables   *ebpf.Map     `ebpf:"unwind_tables"`
	UnwindRows     *ebpf.Map     `ebpf:"unwind_rows"`
	UnwindScratch  *ebpf.Map     `ebpf:"unwind_scratch"`
	Ustacks0       *ebpf.Map     `ebpf:"ustacks0"`
	Ustacks1       *ebpf.Map     `ebpf:"ustacks1"`
	GoProcs        *ebpf.Map     `ebpf:"go_procs"`
	TctxProcs      *ebpf.Map     `ebpf:"tctx_procs"`
}

// The stack copy of not-ready samples (copies.go), loaded only when on.
type copyObjs struct {
	UnwindCopy  *ebpf.Program `ebpf:"unwind_copy"`
	StackCopies *ebpf.Map     `ebpf:"stack_copies"`
	CopyScratch *ebpf.Map     `ebpf:"stack_copy_scratch"`
}

// The runtime walkers' objects, loaded only for the runtimes walked.
type hotspotObjs struct {
	HotspotStep    *ebpf.Program `ebpf:"hotspot_step"`
	HotspotProcs   *ebpf.Map     `ebpf:"hotspot_procs"`
	HotspotErrors  *ebpf.Map     `ebpf:"hotspot_errors"`
	HotspotScratch *ebpf.Map     `ebpf:"hotspot_scratch"`
}

type cpythonObjs struct {
	CpythonStep    *ebpf.Program `ebpf:"cpython_step"`
	CpythonProcs   *ebpf.Map     `ebpf:"cpython_procs"`
	CpythonThreads *ebpf.Map     `ebpf:"cpython_threads"`
	CpythonScratch *ebpf.Map     `ebpf:"cpython_scratch"`
	CpythonStats   *ebpf.Map     `ebpf:"cpython_stats"`
}

type perlObjs struct {
	PerlStep    *ebpf.Program `ebpf:"perl_step"`
	PerlProcs   *ebpf.Map     `ebpf:"perl_procs"`
	PerlScratch *ebpf.Map     `ebpf:"perl_scratch"`
	PerlStats   *ebpf.Map     `ebpf:"perl_stats"`
}
type phpObjs struct {
	PhpStep    *ebpf.Program `ebpf:"php_step"`
	PhpProcs   *ebpf.Map     `ebpf:"php_procs"`
	PhpScratch *ebpf.Map     `ebpf:"php_scratch"`
	PhpStats   *ebpf.Map     `ebpf:"php_stats"`
}
type rubyObjs struct {
	RubyStep    *ebpf.Program `ebpf:"ruby_step"`
	RubyProcs   *ebpf.Map     `ebpf:"ruby_procs"`
	RubyScratch *ebpf.Map     `ebpf:"ruby_scratch"`
	RubyStats   *ebpf.Map     `ebpf:"ruby_stats"`
}
type v8Objs struct {
	V8Step    *ebpf.Program `ebpf:"v8_step"`
	V8Procs   *ebpf.Map     `ebpf:"v8_procs"`
	V8Scratch *ebpf.Map     `ebpf:"v8_scratch"`
	V8Stats   *ebpf.Map     `ebpf:"v8_stats"`
}

type rbObjs struct {
	ProfileRb *ebpf.Program `ebpf:"profile_rb"`
	Samples   *ebpf.Map     `ebpf:"samples"`
	Scratch   *ebpf.Map     `ebpf:"scratch"`
}

// ringSize gives each CPU 256 KiB of sample ring: at 99 Hz and a few hundred
// bytes a record that is several seconds of slack for a descheduled reader.
func ringSize(cpus int) uint32 {
	size := uint32(1 << 18)
	for size < uint32(max(cpus, 1))<<18 && size < 1<<26 {
		size <<= 1
	}
	return size
}

type objects struct {
	commonObjs
	aggObjs     // zero in ModeRingBuffer
	rbObjs      // zero in ModeKernelAggregation
	copyObjs    // zero unless stacks are copied
	hotspotObjs // zero unless HotSpot is walked
	cpythonObjs // zero unless CPython is walked
	perlObjs    // zero unless Perl is walked
	phpObjs     // zero unless PHP is walked
	rubyObjs    // zero unless Ruby is walked
	v8Objs      // zero unless V8 is walked
	offcpuObjs  // zero unless off-CPU samples are on
	offcpuHotspotObjs
	offcpuCpythonObjs
	offcpuPerlObjs
	offcpuPhpObjs
	offcpuRubyObjs
	offcpuV8Objs
}

func (o *objects) profile() *ebpf.Program {
	if o.ProfileAgg != nil {
		return o.ProfileAgg
	}
	return o.ProfileRb
}

func (o *objects) counts(i uint32) *ebpf.Map {
	if i == 0 {
		return o.Counts0
	}
	return o.Counts1
}

func (o *objects) stacks(i uint32) *ebpf.Map {
	if i == 0 {
		return o.Stacks0
	}
	return o.Stacks1
}

func (o *objects) ustacks(i uint32) *ebpf.Map {
	if i == 0 {
		return o.Ustacks0
	}
	return o.Ustacks1
}

func (o *objects) close() error {
	var errs []error
	for _, p := range []*ebpf.Program{o.HandleExit, o.HandleExec, o.ProfileAgg, o.ProfileRb, o.UnwindStep, o.UnwindCopy, o.CpythonStep, o.HotspotStep, o.OffcpuWalkHotspot, o.OffcpuWalkCpython, o.PerlStep, o.OffcpuWalkPerl, o.PhpStep, o.OffcpuWalkPhp, o.RubyStep, o.OffcpuWalkRuby, o.V8Step, o.OffcpuWalkV8} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	for _, m := range []*ebpf.Map{
		o.StatsMap, o.Events, o.Seen, o.Counts0, o.Counts1,
		o.Stacks0, o.Stacks1, o.Barrier, o.BarrierInner, o.Samples, o.Scratch,
		o.UnwindProgs, o.UnwindProcs, o.UnwindExits, o.UnwindMappings, o.UnwindTables, o.UnwindRows, o.UnwindScratch,
		o.Ustacks0, o.Ustacks1, o.StackCopies, o.CopyScratch, o.CpythonProcs, o.CpythonThreads, o.CpythonScratch, o.CpythonStats,
		o.HotspotProcs, o.HotspotErrors, o.HotspotScratch, o.SelectedCgroups, o.PerlProcs, o.PerlScratch, o.PerlStats, o.PhpProcs, o.PhpScratch, o.PhpStats, o.RubyProcs, o.RubyScratch, o.RubyStats, o.V8Procs, o.V8Scratch, o.V8Stats, o.GoProcs, o.TctxProcs, o.ExecTimes,
	} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	errs = append(errs, o.offcpuObjs.close()...)
	*o = objects{}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() error {
	if c.SampleRate == 0 {
		c.SampleRate = 99
	}
	if c.SampleRate < 0 {
		return fmt.Errorf("sampler: SampleRate %d Hz must be positive", c.SampleRate)
	}
	if c.MaxStackDepth == 0 {
		c.MaxStackDepth = MaxStackDepth
	}
	if c.MaxStackDepth < 1 || c.MaxStackDepth > MaxStackDepth {
		return fmt.Errorf("sampler: MaxStackDepth %d outside 1..%d", c.MaxStackDepth, MaxStackDepth)
	}
	if c.StackMapEntries == 0 {
		c.StackMapEntries = 16384
	}
	if c.CountMapEntries == 0 {
		c.CountMapEntries = 16384
	}
	if c.SelectCgroups < 0 || c.SelectCgroups > MaxSelectCgroups {
		return fmt.Errorf("sampler: SelectCgroups %d outside 0..%d", c.SelectCgroups, MaxSelectCgroups)
	}
	if c.Mode != ModeKernelAggregation && c.Mode != ModeRingBuffer {
		return fmt.Errorf("sampler: unknown mode %v", c.Mode)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Unwinding.Logger == nil {
		c.Unwinding.Logger = c.Logger
	}
	c.Unwinding.SetDefaults()
	c.Runtimes.SetDefaults()
	if err := c.Runtimes.Validate(); err != nil {
		return err
	}
	if err := c.offCPUValidate(); err != nil {
		return err
	}
	return c.Unwinding.Validate()
}

// userStackBytes is the size of a walked stack in the maps that hold them:
// struct user_stack's length and reason, and MaxStackWords words.
func (c *Config) userStackBytes() int { return 8 + 8*c.Unwinding.MaxStackWords }

// walking reports whether user stacks are walked with unwind tables.
func (c *Config) walking() bool {
	return c.Mode == ModeKernelAggregation && c.Unwinding.Mode == unwind.ModeAuto
}

// New checks prerequisites, loads the BPF objects and attaches the sampling
// program to a disabled perf event on every online CPU. Sampling begins with
// Start.
func New(cfg Config) (s *Sampler, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := CheckPrerequisites(); err != nil {
		return nil, err
	}
	s = &Sampler{cfg: cfg, log: cfg.Logger, events: make(chan Event, 4096), samplesFlushed: make(chan struct{}, 1)}
	if cfg.OffCPU.Enabled {
		s.offcpu = &offcpuState{cfg: cfg.OffCPU}
	}
	// Not s: every failing return below sets s to nil before this runs.
	owner := s
	defer func() {
		if err != nil {
			owner.release()
		}
	}()
	if err := s.load(); err != nil {
		return nil, err
	}
	if err := s.openPerfEvents(); err != nil {
		return nil, err
	}
	for _, p := range []*ebpf.Program{s.objs.HandleExit, s.objs.HandleExec} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return nil, fmt.Errorf("sampler: attaching %s: %w", p, err)
		}
		s.tracing = append(s.tracing, l)
	}
	if cfg.walking() {
		if err := s.objs.UnwindProgs.Put(uint32(0), s.objs.UnwindStep); err != nil {
			return nil, fmt.Errorf("sampler: installing the unwinder: %w", err)
		}
		if cfg.stackCopyBytes() > 0 {
			if err := s.objs.UnwindProgs.Put(uint32(bpf.ProfileWalkProgWALK_COPY), s.objs.UnwindCopy); err != nil {
				return nil, fmt.Errorf("sampler: installing the stack copy: %w", err)
			}
		}
		s.unwinder, err = unwind.New(cfg.Unwinding, unwind.Maps{
			Procs: s.objs.UnwindProcs, Exits: s.objs.UnwindExits, Mappings: s.objs.UnwindMappings,
			Tables: s.objs.UnwindTables, Rows: s.objs.UnwindRows, Sync: s.sync, Seen: s.objs.Seen, ExecTimes: s.objs.ExecTimes,
		})
		if err != nil {
			return nil, fmt.Errorf("sampler: %w", err)
		}
		if cfg.Runtimes.Enabled() {
			rts, err := s.newRuntimes()
			if err != nil {
				return nil, fmt.Errorf("sampler: %w", err)
			}
			s.runtimes = runtimes.NewSet(s.log, s.unwinder, rts...)
			if l := s.newLabeler(); l != nil {
				s.runtimes.SetLabeler(l)
			}
			if s.cfg.Runtimes.ThreadContext {
				s.threadCtx = threadctx.New(threadctx.Options{
					Procs: s.objs.TctxProcs, Logger: s.log.Named("threadctx"),
				})
				s.runtimes.AddWatcher(s.threadCtx)
			}
		}
	}
	if cfg.stackCopyBytes() > 0 {
		if s.copiesRd, err = ringbuf.NewReader(s.objs.StackCopies); err != nil {
			return nil, fmt.Errorf("sampler: stack copies ring buffer: %w", err)
		}
	}
	if s.eventsRd, err = ringbuf.NewReader(s.objs.Events); err != nil {
		return nil, fmt.Errorf("sampler: events ring buffer: %w", err)
	}
	if cfg.Mode == ModeRingBuffer {
		if s.samplesRd, err = ringbuf.NewReader(s.objs.Samples); err != nil {
			return nil, fmt.Errorf("sampler: samples ring buffer: %w", err)
		}
		s.agg = newRBAggregator(cfg.MaxStackDepth)
	}
	unwinding := unwind.ModeFramePointers
	if cfg.walking() {
		unwinding = unwind.ModeAuto
	}
	s.log.Info("sampler ready", zap.Int("cpus", len(s.cpus)), zap.Int("hz", cfg.SampleRate),
		zap.Stringer("mode", cfg.Mode), zap.Int("max_stack_depth", cfg.MaxStackDepth),
		zap.Bool("kernel_stacks", cfg.KernelStacks), zap.Stringer("unwinding", unwinding),
		zap.Int64("max_table_bytes", cfg.Unwinding.MaxTableBytes),
		zap.Bool("task_pt_regs_helper", s.paths.taskPtRegs), zap.Bool("perf_link", !s.perfIoctl))
	return s, nil
}

func (s *Sampler) load() error {
	spec, err := bpf.LoadProfile()
	if err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if err := spec.Variables[bpf.ProfileVarKernelStacks].Set(s.cfg.KernelStacks); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if err := spec.Variables[bpf.ProfileVarMaxDepth].Set(uint32(s.cfg.MaxStackDepth)); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	for _, name := range []string{bpf.ProfileMapStacks0, bpf.ProfileMapStacks1} {
		// The kernel walks value_size/8 frames, so this is the depth cap.
		spec.Maps[name].ValueSize = uint32(8 * s.cfg.MaxStackDepth)
		spec.Maps[name].MaxEntries = uint32(s.cfg.StackMapEntries)
	}
	for _, name := range []string{bpf.ProfileMapCounts0, bpf.ProfileMapCounts1} {
		spec.Maps[name].MaxEntries = uint32(s.cfg.CountMapEntries)
	}
	if err := spec.Variables[bpf.ProfileVarUnwindCfi].Set(s.cfg.walking()); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if err := spec.Variables[bpf.ProfileVarStackCopyBytes].Set(s.cfg.stackCopyBytes()); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	spec.Maps[bpf.ProfileMapStackCopies].MaxEntries = uint32(unix.Getpagesize())
	if s.cfg.stackCopyBytes() > 0 {
		spec.Maps[bpf.ProfileMapStackCopies].MaxEntries = copyRing
	}
	s.paths = probePaths()
	if err := spec.Variables[bpf.ProfileVarHaveTaskPtRegs].Set(s.paths.taskPtRegs); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if err := spec.Variables[bpf.ProfileVarKernelThreadSize].Set(s.paths.threadSize); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	// Unwind maps are referenced by profile_agg either way; without the
	// walker they shrink to one entry.
	u := s.cfg.Unwinding
	sizes := map[string]uint32{
		bpf.ProfileMapUnwindProcs: uint32(u.MaxProcesses), bpf.ProfileMapUnwindExits: uint32(u.MaxProcesses),
		bpf.ProfileMapUnwindMappings: uint32(u.MaxMappings),
		bpf.ProfileMapUnwindTables:   uint32(u.MaxTables), bpf.ProfileMapUnwindRows: u.Rows(),
		bpf.ProfileMapUstacks0: uint32(s.cfg.StackMapEntries), bpf.ProfileMapUstacks1: uint32(s.cfg.StackMapEntries),
	}
	// Go labels: read only where the walker runs; the map stays
	// referenced (profile_agg), one entry when unused.
	goLabels := s.cfg.walking() && s.cfg.Runtimes.GoLabels
	if err := spec.Variables[bpf.ProfileVarGoLabelsOn].Set(goLabels); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if !goLabels {
		spec.Maps[bpf.ProfileMapGoProcs].MaxEntries = 1
	}
	tctx := s.cfg.walking() && s.cfg.Runtimes.ThreadContext
	if err := spec.Variables[bpf.ProfileVarThreadCtxOn].Set(tctx); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if !tctx {
		spec.Maps[bpf.ProfileMapTctxProcs].MaxEntries = 1
	}
	for name, n := range sizes {
		if !s.cfg.walking() {
			n = 1
		}
		spec.Maps[name].MaxEntries = n
	}
	// The walker keeps MaxStackWords words of a stack, and the maps that
	// hold walked stacks keep that much of each.
	if err := spec.Variables[bpf.ProfileVarMaxUserWords].Set(uint32(s.cfg.Unwinding.MaxStackWords)); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	for _, name := range []string{bpf.ProfileMapUstacks0, bpf.ProfileMapUstacks1, bpf.ProfileMapOffcpuUstore} {
		spec.Maps[name].ValueSize = uint32(s.cfg.userStackBytes())
	}
	ncpu := runtime.NumCPU()
	if cpus, err := onlineCPUs(); err == nil {
		ncpu = len(cpus)
	}
	spec.Maps[bpf.ProfileMapSamples].MaxEntries = ringSize(ncpu)
	if err := s.offCPUSpec(spec); err != nil {
		return err
	}
	if err := s.cgroupSpec(spec); err != nil {
		return err
	}
	// The other mode's maps are not loaded, so not charged.
	skip := []string{bpf.ProfileMapSamples, bpf.ProfileMapScratch}
	if s.cfg.Mode == ModeRingBuffer {
		skip = []string{bpf.ProfileMapCounts0, bpf.ProfileMapCounts1, bpf.ProfileMapStacks0, bpf.ProfileMapStacks1}
	}
	if err := raiseMemlock(memlockNeed(spec, ncpu, skip)); err != nil {
		return err
	}

	if specHook != nil {
		specHook(spec)
	}
	return s.loadObjects(spec)
}

// specHook lets a test change the programs before they load.
var specHook func(*ebpf.CollectionSpec)

// ProgramStats returns the cumulative run time and run count of the sampling
// program (its tail calls included), as counted by the kernel while
// kernel.bpf_stats_enabled is on (ebpf.EnableStats); zeros otherwise.
func (s *Sampler) ProgramStats() (time.Duration, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, 0, ErrClosed
	}
	ps, err := s.objs.profile().Stats()
	if err != nil {
		return 0, 0, err
	}
	return ps.Runtime, ps.RunCount, nil
}

// Unwinder returns the unwind table manager, nil when user stacks are walked
// with frame pointers. Callers feed it process snapshots (Track) on
// ProcessNew, ProcessExec and ProcessMapsChanged, and Forget on ProcessExit.
func (s *Sampler) Unwinder() *unwind.Manager { return s.unwinder }

// Runtimes returns the language runtimes the walker follows, nil when
// none: callers give it every process snapshot (Attach) and exit (Forget),
// and have it name runtime frames (Sample.Runtime).
func (s *Sampler) Runtimes() *runtimes.Set { return s.runtimes }

// ThreadContextStats counts the processes whose OpenTelemetry thread
// context is read (zero when thread_context is off).
func (s *Sampler) ThreadContextStats() threadctx.Stats {
	if s.threadCtx == nil {
		return threadctx.Stats{}
	}
	return s.threadCtx.Stats()
}

// sync returns after an RCU grace period: an ARRAY_OF_MAPS update waits for
// every BPF program that might still read what was replaced.
func (s *Sampler) sync() error {
	return s.objs.Barrier.Put(uint32(0), s.objs.BarrierInner)
}

// Start enables the perf events and the readers. It fails on a second call.
func (s *Sampler) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.started {
		return ErrStarted
	}
	if err := s.startOffCPU(); err != nil {
		return err
	}
	s.wg.Add(1)
	go s.readEvents()
	if s.samplesRd != nil {
		s.wg.Add(1)
		go s.readSamples()
	}
	if s.copiesRd != nil {
		q := make(chan *unwind.StackCopy, copyQueue)
		s.wg.Add(2)
		go s.readCopies(q)
		go s.feedCopies(q)
	}
	for _, c := range s.cpus {
		if err := unix.IoctlSetInt(c.fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			return fmt.Errorf("sampler: enabling perf event on CPU %d: %w", c.cpu, err)
		}
	}
	s.started = true
	return nil
}

// Events delivers process notifications (unless Config.OnEvent takes
// them). It is closed by Close. When the caller falls behind, events are
// dropped and counted in Stats.LostEvents.
func (s *Sampler) Events() <-chan Event { return s.events }

// Drain returns everything aggregated since the previous Drain (or Start).
func (s *Sampler) Drain() (Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Batch{}, ErrClosed
	}
	if s.cfg.Mode == ModeRingBuffer {
		s.flushSamples()
		return s.agg.swap(), nil
	}
	b, err := s.drainKernel()
	if err == nil {
		s.walkedCopies(&b)
	}
	return b, err
}

// Stats returns cumulative counters.
func (s *Sampler) Stats() (Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Stats{}, ErrClosed
	}
	if s.unwinder != nil {
		s.unwinder.Poll()
	}
	var per []bpf.ProfileStats
	if err := s.objs.StatsMap.Lookup(uint32(0), &per); err != nil {
		return Stats{}, fmt.Errorf("sampler: reading stats: %w", err)
	}
	var st Stats
	for _, p := range per {
		st.Samples += p.Samples
		st.LostStack += p.LostStack
		st.LostMapFull += p.LostMapFull
		st.LostRingbuf += p.LostRingbuf
		st.LostEvents += p.LostEvents
		st.Truncated += p.Truncated
		st.UnwindFrames += p.UnwindFrames
		st.UnwindTailFail += p.UnwindTailFail
		st.StackCopies += p.StackCopies
		st.StackCopyLost += p.StackCopyLost
		for i := range st.Stops {
			st.Stops[i] += p.Stops[i]
		}
		st.Selection.add(p.Selection)
	}
	for i := range st.Stops {
		st.Stops[i] += s.copyStops[i].Load()
	}
	st.Truncated += s.truncatedUser.Load()
	st.LostEvents += s.lostEventsUser.Load()
	st.LostDrain = s.lostDrain.Load()
	st.DrainErrors = s.drainErrors.Load()
	st.Lost = st.LostStack + st.LostMapFull + st.LostRingbuf + st.LostDrain
	var err error
	st.OffCPU, err = s.offCPUStats()
	return st, err
}

// Close disables sampling and releases every kernel object. It is safe to
// call more than once.
func (s *Sampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.release()
}

// release tears down in reverse order of creation: stop the event sources,
// then unblock and join the readers, then drop programs and maps.
func (s *Sampler) release() error {
	var errs []error
	for _, c := range s.cpus {
		// Best effort: closing the fd stops the event anyway.
		_ = unix.IoctlSetInt(c.fd, unix.PERF_EVENT_IOC_DISABLE, 0)
		if c.link != nil {
			errs = append(errs, c.link.Close())
		}
		errs = append(errs, unix.Close(c.fd))
	}
	s.cpus = nil
	for _, l := range s.tracing {
		errs = append(errs, l.Close())
	}
	s.tracing = nil
	if s.eventsRd != nil {
		errs = append(errs, s.eventsRd.Close())
	}
	if s.copiesRd != nil {
		errs = append(errs, s.copiesRd.Close())
	}
	if s.samplesRd != nil {
		errs = append(errs, s.samplesRd.Close())
	}
	s.wg.Wait()
	s.eventsRd, s.samplesRd, s.copiesRd = nil, nil, nil
	// The readers are joined: nothing attaches or names any more.
	s.runtimes.Close()
	if s.unwinder != nil {
		s.unwinder.Close()
		s.unwinder = nil
	}
	if !s.eventsClosed {
		close(s.events) // readers are joined: no more sends
		s.eventsClosed = true
	}
	s.mapsMu.Lock()
	s.mapsClosed = true
	s.mapsMu.Unlock()
	errs = append(errs, s.releaseOffCPU(), s.objs.close())
	return errors.Join(errs...)
}
