// Package profbuild turns the eBPF sampler's batches into OTLP profiles and
// ProfileEvent logs as docs/frame-format.md describes: it normalizes every
// user frame to (file identity, ELF virtual address), names kernel frames
// from kallsyms and JIT frames from perf maps, and aggregates samples per
// process, thread, CPU and stack. The profiling receiver and `profsym
// record` both build through it.
package profbuild

import (
	"crypto/rand"
	"maps"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/symbolize/kernel"
	"github.com/profsym/profsym/internal/symbolize/perfmap"
)

// ScopeName is the instrumentation scope of everything built here.
const ScopeName = "github.com/profsym/profsym/receiver/profilingreceiver"

// KernelSymbols names kernel addresses; *kernel.Loader implements it.
type KernelSymbols interface {
	Lookup(addr uint64) (name, module string, start uint64, ok bool)
	Info() (kernel.Info, error)
}

// Options configure a Builder.
type Options struct {
	SampleRate    int  // Hz, for the profile's period; 0 means 99
	KernelSymbols bool // name kernel frames from kallsyms
	PerfMaps      bool // name JIT frames from /tmp/perf-PID.map
	Logs          bool // also build ProfileEvent logs
	Filter        *Filter
	ScopeVersion  string
	HostName      string // "" reads $HOST_NAME, else os.Hostname
	KernelRelease string // "" reads uname -r
	ProcRoot      string // "" means /proc
	// Kernel defaults to a kallsyms Loader; it also tells module frames
	// from core kernel frames and gives build ids, so it is used even when
	// KernelSymbols is off.
	Kernel     KernelSymbols
	Normalizer *normalize.Normalizer
	Logger     *zap.Logger
	// Unwinder, when the sampler walks user stacks with unwind tables
	// (sampler.Unwinder), is given every process snapshot the Builder takes
	// and told when a process exits.
	Unwinder Unwinder
	// Runtimes, when the walker follows language runtimes
	// (sampler.Runtimes), is given every process snapshot and exit too,
	// and names the runtime frames of samples.
	Runtimes Runtimes
	// Wall adds, for every process with off-CPU samples, a wall-clock
	// profile: its CPU and off-CPU time in one, per thread (docs/off-cpu.md).
	Wall bool
	// ExecTimes, when set, says when a sampled process last exec'd
	// (*sampler.Sampler). Without it an exec is known from its event only,
	// and the samples taken before an exec whose event was lost, or is
	// handled after the drain that holds them, are named in the new image.
	ExecTimes ExecTimes
}

// ExecTimes is the part of the sampler that records execs as they happen.
type ExecTimes interface {
	ExecTime(pid int) (unixNs int64, ok bool)
}

// Runtimes is the part of runtimes.Set the Builder drives.
type Runtimes interface {
	Attach(p *normalize.Process)
	Forget(pid int)
	Name(pid int, f runtimes.Frame) (runtimes.Symbol, error)
}

// Unwinder is the part of unwind.Manager the Builder drives.
type Unwinder interface {
	Track(p *normalize.Process) error
	Forget(pid int)
}

// Drainer is the part of the sampler Collect needs.
type Drainer interface {
	Drain() (sampler.Batch, error)
}

// Report is one interval's output.
type Report struct {
	Profiles pprofile.Profiles
	Logs     plog.Logs // empty unless Options.Logs
	Samples  uint64    // sample count reported
	Filtered uint64    // samples of processes the filter left out
	Rows     int       // aggregated samples (one per process, thread, CPU, stack)
	// Failures counts frames that could not be normalized or named, by
	// reason (see the Reason constants).
	Failures map[string]int64
	// UnwindStops counts samples whose user stack the sampler walked with
	// unwind tables, by how the walk ended (sampler.StopReason names; "ok"
	// for whole stacks).
	UnwindStops map[string]int64
	// OffCPUWaits counts the waits off CPU reported (Samples counts CPU
	// samples only), OffCPUNs the time they stand for.
	OffCPUWaits, OffCPUNs uint64
}

// Reasons a frame stays raw or incomplete.
const (
	ReasonProcessGone    = "process_gone"    // no snapshot: the process exited before it was read
	ReasonNoMapping      = "no_mapping"      // the address is in no executable mapping
	ReasonUnreadableFile = "unreadable_file" // the mapped file could not be opened or parsed
	ReasonNoLoadSegment  = "no_load_segment" // no PT_LOAD segment holds the file offset
	ReasonKernelUnnamed  = "kernel_unnamed"  // kallsyms has no symbol for a kernel address
	ReasonJITUnnamed     = "jit_unnamed"     // anonymous executable memory without a perf map entry
	ReasonRuntimeUnnamed = "runtime_unnamed" // a runtime frame (Java, Python) that could not be named
)

// sweepAfter is how many reports a snapshot may go unused before the
// Builder checks whether its process still exists: a lost exit event must
// not pin a snapshot forever.
const sweepAfter = 30

// kallsymsRefresh bounds how often a kernel address kallsyms cannot name
// makes the loader reparse it (~70 ms of CPU for a distribution kernel): at
// the loader's default, 10 s, a steady trickle of such addresses (BPF
// trampolines, bad frames) cost more than all the rest of the receiver. A
// module loaded meanwhile gets its names within this time.
const kallsymsRefresh = 5 * time.Minute

// Builder keeps per-process state between intervals. HandleEvent may run
// concurrently with Collect.
type Builder struct {
	opt  Options
	norm *normalize.Normalizer
	kern KernelSymbols
	jit  *perfmap.Reader // nil unless PerfMaps
	log  *zap.Logger
	vdso vdsoImages

	mu       sync.Mutex
	exited   map[int]struct{}
	match    map[int]bool // filter decisions by pid
	matchGen uint64       // the Filter.Generation they were taken at
	// matchEpoch counts execs and generations: a decision read from /proc
	// before one of them is not remembered after it (it may be the old
	// image's, or the old pods').
	matchEpoch uint64
	left       map[int]bool // decisions of the generation before, not taken again yet
	lastSeen   map[int]int  // report number a pid last appeared in
	reports    int
	// execs are the images processes replaced lately: their samples
	// drained after the exec belong to them, not to the new image.
	execs map[int]preImage
	// lastExec is the latest exec noted per pid (Unix ns), from its event
	// or from Options.ExecTimes, whichever came first.
	lastExec map[int]int64

	staged *run // the interval Stage has begun (the Collect goroutine's)
}

// New makes a Builder.
func New(opt Options) *Builder {
	if opt.SampleRate <= 0 {
		opt.SampleRate = 99
	}
	if opt.ProcRoot == "" {
		opt.ProcRoot = "/proc"
	}
	if opt.HostName == "" {
		// In a pod, os.Hostname is the pod's name: the chart passes the
		// node's name in HOST_NAME.
		if opt.HostName = os.Getenv("HOST_NAME"); opt.HostName == "" {
			opt.HostName, _ = os.Hostname()
		}
	}
	if opt.KernelRelease == "" {
		opt.KernelRelease, _ = kernel.Release()
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	b := &Builder{
		opt: opt, norm: opt.Normalizer, kern: opt.Kernel, log: opt.Logger,
		exited: map[int]struct{}{}, match: map[int]bool{}, lastSeen: map[int]int{},
	}
	if b.norm == nil {
		b.norm = normalize.New(normalize.Options{ProcRoot: opt.ProcRoot})
	}
	if b.kern == nil {
		b.kern = kernel.NewLoader("", "", kallsymsRefresh)
	}
	if opt.PerfMaps {
		b.jit = perfmap.NewReader(opt.ProcRoot)
	}
	return b
}

// Tracked is the number of processes with a snapshot.
func (b *Builder) Tracked() int { return b.norm.Tracked() }

// Warm reads kallsyms now rather than in the first report that meets a
// kernel frame (tens of ms of CPU for a distribution kernel): call it, in a
// goroutine of its own, at start when kernel stacks are sampled.
func (b *Builder) Warm() {
	_, _ = b.kern.Info()
}

// HandleEvent reacts to the sampler's process events: a snapshot is taken
// when a process is first seen, so its frames can be normalized even after
// it exits; exec replaces it; exit schedules it to be forgotten after the
// next report.
func (b *Builder) HandleEvent(ev sampler.Event) {
	pid := int(ev.Pid)
	switch ev.Kind {
	case sampler.ProcessNew, sampler.ProcessExec, sampler.ProcessMapsChanged:
		b.mu.Lock()
		delete(b.exited, pid)
		if ev.Kind == sampler.ProcessExec {
			b.execLocked(pid, ev.TimeNs)
		}
		b.lastSeen[pid] = b.reports
		b.mu.Unlock()
		if !b.targeted(pid) {
			// Its samples are dropped: stop them copying their stacks
			// for a walk that will never come (internal/host/unwind).
			if ig, ok := b.opt.Unwinder.(interface{ Ignore(int) }); ok {
				ig.Ignore(pid)
			}
			return
		}
		b.load(pid)
	case sampler.ProcessExit:
		// Last chance for a process whose New event was lost or late.
		if ev.MMAlive && b.norm.Cached(pid) == nil && b.targeted(pid) {
			_, _ = b.norm.Process(pid)
		}
		// The kernel side already dropped its mappings; free them now so
		// a reused pid starts clean.
		if b.opt.Unwinder != nil {
			b.opt.Unwinder.Forget(pid)
		}
		b.mu.Lock()
		b.exited[pid] = struct{}{}
		b.mu.Unlock()
	}
}

// load takes a snapshot of a targeted process and hands it to the unwinder
// and the runtimes.
func (b *Builder) load(pid int) {
	if b.norm.Cached(pid) != nil {
		b.syncExec(pid) // the image it replaces may hold samples not placed yet
	}
	p, err := b.norm.Refresh(pid)
	if err != nil {
		b.log.Debug("process snapshot failed", zap.Int("pid", pid), zap.Error(err))
		return
	}
	if b.opt.Unwinder != nil {
		if err := b.opt.Unwinder.Track(p); err != nil {
			b.log.Warn("loading unwind mappings failed", zap.Int("pid", pid), zap.Error(err))
		}
	}
	if b.opt.Runtimes != nil {
		b.opt.Runtimes.Attach(p)
	}
}

// preImage is what a process ran before an exec.
type preImage struct {
	at     int64              // the exec, Unix ns
	report int                // the report it was seen in
	p      *normalize.Process // a snapshot read before the exec, else nil
	// targeted: the filter's decision on it (taken before the exec, or on
	// p, or, with neither, the new image's).
	targeted, decided bool
}

// execKeep is how many reports an exec is remembered for: long enough for
// the drains that hold the samples taken before it, whichever of the two
// (the event and the drain) comes first.
const execKeep = 2

// sameExec is how far apart an exec's event and its record in
// Options.ExecTimes may be: both are stamped by the exec's BPF program,
// a few hundred ns apart, and turned into Unix time at different moments.
// Two execs of one process are further apart than that.
const sameExec = int64(time.Millisecond)

// syncExec notes the latest exec of pid the sampler recorded, if no event
// has told it yet: its event was lost (the events ring was full) or is
// still queued behind the drain that holds the samples taken before it.
// Called before pid's snapshot is read again and before its samples are
// placed, so that the image it ran before is kept for them. It says
// whether it noted one.
func (b *Builder) syncExec(pid int) bool {
	if b.opt.ExecTimes == nil {
		return false
	}
	at, ok := b.opt.ExecTimes.ExecTime(pid)
	if !ok {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.execLocked(pid, at)
}

// execLocked notes an exec of pid at (Unix ns) once, whether the event or
// the sampler's record tells it first. Called with b.mu held.
func (b *Builder) execLocked(pid int, at int64) bool {
	if last, ok := b.lastExec[pid]; ok && at < last+sameExec {
		return false // this one, or an older exec whose event came late
	}
	if b.lastExec == nil {
		b.lastExec = map[int]int64{}
	}
	b.lastExec[pid] = at
	b.noteExec(pid, at)
	b.matchEpoch++
	delete(b.match, pid) // comm and exe changed
	delete(b.left, pid)
	return true
}

// noteExec remembers pid's image before an exec at (Unix ns). Called with
// b.mu held, before the decisions on the old image are dropped.
func (b *Builder) noteExec(pid int, at int64) {
	pre := preImage{at: at, report: b.reports}
	if p := b.norm.Cached(pid); p != nil && p.ReadAt.UnixNano() < at {
		pre.p = p
	}
	pre.targeted, pre.decided = b.match[pid]
	if b.execs == nil {
		b.execs = map[int]preImage{}
	}
	b.execs[pid] = pre
}

// beforeExec says whether a sample of pid last taken at lastNs belongs to
// an image pid replaced by exec since, and gives that image.
func (b *Builder) beforeExec(pid int, lastNs int64) (preImage, bool) {
	b.mu.Lock()
	pre, ok := b.execs[pid]
	b.mu.Unlock()
	if !ok || lastNs >= pre.at {
		return preImage{}, false
	}
	if !pre.decided {
		f := b.opt.Filter
		switch {
		case f.All() || f.PIDOnly():
			pre.targeted = f.Match(ProcInfo{PID: pid})
		case pre.p != nil:
			pre.targeted = f.Match(ProcInfo{PID: pid, Comm: pre.p.Comm, Exe: pre.p.ExePath, Cgroup: pre.p.CgroupPath})
		default:
			pre.targeted = b.targeted(pid)
		}
	}
	return pre, true
}

// afterMatchRead, set by tests, runs between targeted's /proc read and its
// decision being remembered.
var afterMatchRead func(pid int)

// targeted applies the filter, remembering decisions per pid.
func (b *Builder) targeted(pid int) bool {
	f := b.opt.Filter
	if f.All() {
		return true
	}
	if f.PIDOnly() {
		return f.Match(ProcInfo{PID: pid})
	}
	b.mu.Lock()
	if f.Generation != nil {
		if g := f.Generation(); g != b.matchGen {
			// A target's pods changed: decide again, and load the
			// processes that were left out and are in now.
			if b.left == nil {
				b.left = map[int]bool{}
			}
			maps.Copy(b.left, b.match)
			b.match = map[int]bool{}
			b.matchGen = g
			b.matchEpoch++
		}
	}
	m, ok := b.match[pid]
	was, decided := b.left[pid]
	delete(b.left, pid)
	epoch := b.matchEpoch
	b.mu.Unlock()
	if ok {
		return m
	}
	info, ok := f.readProcInfo(b.opt.ProcRoot, pid)
	if afterMatchRead != nil {
		afterMatchRead(pid)
	}
	if !ok {
		p := b.norm.Cached(pid)
		if p == nil {
			return false // gone and never seen: nothing to match on
		}
		info = ProcInfo{PID: pid, Comm: p.Comm, Exe: p.ExePath, Cgroup: p.CgroupPath}
	}
	m = f.Match(info)
	b.mu.Lock()
	if b.matchEpoch == epoch {
		b.match[pid] = m
	}
	b.mu.Unlock()
	if m && decided && !was {
		b.load(pid)
	}
	return m
}

// Collect drains the sampler and builds the interval [start, now). Processes
// that had exited before the drain are forgotten after it: the drain holds
// all their remaining samples.
func (b *Builder) Collect(d Drainer, start time.Time) (Report, error) {
	b.mu.Lock()
	exited := b.exited
	b.exited = map[int]struct{}{}
	b.mu.Unlock()
	batch, err := d.Drain()
	if err != nil {
		b.mu.Lock()
		for pid := range exited {
			b.exited[pid] = struct{}{}
		}
		b.mu.Unlock()
		return Report{}, err
	}
	r := b.Build(batch, start, time.Now())
	for pid := range exited {
		b.forget(pid)
	}
	b.sweep()
	return r, nil
}

func (b *Builder) forget(pid int) {
	b.norm.Forget(pid)
	if b.opt.Runtimes != nil {
		// After the drain that held its last samples: their frames are
		// named by now.
		b.opt.Runtimes.Forget(pid)
	}
	if b.jit != nil {
		b.jit.Forget(pid)
	}
	b.mu.Lock()
	delete(b.match, pid)
	delete(b.left, pid)
	delete(b.lastSeen, pid)
	delete(b.lastExec, pid)
	b.mu.Unlock()
}

// sweep forgets processes that have not been sampled for a while and no
// longer exist (their exit event was lost).
func (b *Builder) sweep() {
	b.mu.Lock()
	b.reports++
	for pid, pre := range b.execs {
		if b.reports-pre.report > execKeep {
			delete(b.execs, pid)
		}
	}
	var stale []int
	for pid, n := range b.lastSeen {
		if b.reports-n > sweepAfter {
			stale = append(stale, pid)
		}
	}
	b.mu.Unlock()
	for _, pid := range stale {
		if b.norm.Alive(pid) {
			b.mu.Lock()
			b.lastSeen[pid] = b.reports
			b.mu.Unlock()
			continue
		}
		b.forget(pid)
		if b.opt.Unwinder != nil {
			// Its exit event was lost (the exit path already released it,
			// and a reused pid must keep its new mappings).
			b.opt.Unwinder.Forget(pid)
		}
	}
}

// Stage drains d ahead of the report: its samples join the interval that
// starts at start and the next Collect (or Build) ends, and their frames
// are named now. A runtime frame points at objects of the process that
// may be gone by the report: V8 collects a function once nothing refers to
// it (a module's own functions once the module has run) and the optimized
// code a loop was replaced with once the loop is left, and moves both
// when it compacts. Stage, Collect and Build are called from one goroutine.
func (b *Builder) Stage(d Drainer, start time.Time) error {
	batch, err := d.Drain()
	if err != nil {
		return err
	}
	r := b.staged
	if r == nil {
		r = newRun(b, start, start)
		b.staged = r
	}
	r.addBatch(batch)
	return nil
}

// Build turns one batch, and what Stage added before it, into profiles
// (and logs) for [start, end).
func (b *Builder) Build(batch sampler.Batch, start, end time.Time) Report {
	r := b.staged
	b.staged = nil
	if r == nil {
		r = newRun(b, start, end)
	}
	r.end = end
	r.addBatch(batch)
	return r.finish()
}

func newProfileID() pprofile.ProfileID {
	var id pprofile.ProfileID
	_, _ = rand.Read(id[:])
	return id
}
