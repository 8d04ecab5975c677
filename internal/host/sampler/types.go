package sampler

// The sampler's data types, on every platform: the sampler itself runs on
// Linux only, but what it produces is read by code that builds anywhere
// (profile building, format conversion, the CLI).

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/unwind"
)

// MaxStackDepth is the deepest stack the kernel walks by default
// (sysctl kernel.perf_event_max_stack).
const MaxStackDepth = 127

// Mode selects where samples are aggregated.
type Mode int

const (
	// ModeKernelAggregation counts samples in a BPF hash map keyed by
	// pid/tid/cpu/stack ids and keeps stacks in STACK_TRACE maps; two
	// buffers are swapped on every Drain. The default: it is the cheaper of
	// the two as measured (see README.md).
	ModeKernelAggregation Mode = iota
	// ModeRingBuffer sends every sample through a ring buffer and aggregates
	// in Go. Kept so that the choice can be re-measured.
	ModeRingBuffer
)

func (m Mode) String() string {
	switch m {
	case ModeKernelAggregation:
		return "kernel-aggregation"
	case ModeRingBuffer:
		return "ring-buffer"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config configures a Sampler.
type Config struct {
	// SampleRate is the sampling frequency per CPU in Hz (perf frequency
	// mode). Zero means 99.
	SampleRate int
	// MaxStackDepth caps user and kernel stacks, 1..127. Zero means 127.
	MaxStackDepth int
	// KernelStacks also records the kernel stack of each sample.
	KernelStacks bool
	// Logger is optional.
	Logger *zap.Logger
	// Mode is ModeKernelAggregation unless set.
	Mode Mode
	// StackMapEntries sizes each of the two STACK_TRACE maps (kernel
	// aggregation); zero means 16384. Bucket collisions are counted as lost.
	StackMapEntries int
	// CountMapEntries sizes each of the two count hash maps; zero means 16384.
	CountMapEntries int
	// Unwinding selects how user stacks are walked and bounds the unwind
	// tables. ModeAuto (the default) walks with unwind tables in kernel
	// aggregation mode; ModeRingBuffer always uses frame pointers.
	Unwinding unwind.Config
	// Runtimes selects the language runtimes whose frames the walker
	// follows (HotSpot, CPython; unwind tables mode only) and bounds
	// their names.
	Runtimes runtimes.Config
	// OffCPU turns on off-CPU samples: the stacks threads wait at, and for
	// how long (docs/off-cpu.md). It needs kernel aggregation and unwinding
	// mode auto.
	OffCPU offcpu.Config
	// SelectCgroups, when above zero, samples only the tasks whose cgroup
	// (v2) SetCgroups selected, checked in the kernel before any walk, on
	// CPU and off CPU; it bounds the cgroups selected at once (kernel
	// memory: about 80 bytes each). Zero samples every task, at no cost.
	SelectCgroups int
	// OnEvent, when set, is given the process events in the sampler's
	// reader goroutine, one at a time and in order, instead of Events: a
	// hand-off to another goroutine costs a wake-up per event. It must not
	// block for long (the events ring buffer holds what arrives meanwhile)
	// nor call Close.
	OnEvent func(Event)
}

// StopReason says why a walked user stack ended, or what first made it
// less than exact: enum stop_reason of bpf/types.h, generated into package bpf.
type StopReason uint8

// Stop reasons.
const (
	StopOK             = StopReason(bpf.ProfileStopReasonSTOP_OK)              // an outermost frame was reached
	StopNotReady       = StopReason(bpf.ProfileStopReasonSTOP_NOT_READY)       // process or table not loaded yet: frame pointers
	StopUnknownMapping = StopReason(bpf.ProfileStopReasonSTOP_UNKNOWN_MAPPING) // a PC in no known mapping of the process
	StopNoTable        = StopReason(bpf.ProfileStopReasonSTOP_NO_TABLE)        // a file without usable unwind table: frame pointers
	StopReadFault      = StopReason(bpf.ProfileStopReasonSTOP_READ_FAULT)      // reading the stack failed
	StopDepth          = StopReason(bpf.ProfileStopReasonSTOP_DEPTH)           // MaxStackDepth reached
	StopBadFrame       = StopReason(bpf.ProfileStopReasonSTOP_BAD_FRAME)       // the stack pointer went backwards
	StopFramePointers  = StopReason(bpf.ProfileStopReasonSTOP_FP_ONLY)         // walked by bpf_get_stackid (frame pointers mode)
	StopJIT            = StopReason(bpf.ProfileStopReasonSTOP_JIT)             // ended in code without unwind info (JIT, anonymous memory)
	StopRuntime        = StopReason(bpf.ProfileStopReasonSTOP_RUNTIME)         // a runtime's walker gave up: its native frames only
	// StopStackCopyTruncated: a not-ready sample's copied stack (unwinding
	// stack_copy_bytes) ended before the walk did.
	StopStackCopyTruncated = StopReason(bpf.ProfileStopReasonSTOP_STACK_COPY_TRUNCATED)
	// StopExec: a not-ready sample's copied stack was taken in the image
	// its process then replaced by exec; its user frames, of a program no
	// longer mapped, are not given.
	StopExec       = StopReason(bpf.ProfileStopReasonSTOP_EXEC)
	NumStopReasons = StopReason(bpf.ProfileStopReasonSTOP_REASONS)
)

var stopNames = [NumStopReasons]string{"ok", "not_ready", "unknown_mapping", "no_table", "read_fault", "depth_limit", "bad_frame", "frame_pointers", "jit", "runtime", "stack_copy_truncated", "exec"}

func (r StopReason) String() string {
	if r < NumStopReasons {
		return stopNames[r]
	}
	return fmt.Sprintf("StopReason(%d)", uint8(r))
}

// RuntimeMark marks an entry of Sample.UserPCs that is no PC: the rest of
// the entry indexes Sample.Runtime.
const RuntimeMark = 1 << bpf.ProfileStackWordBitsRT_FRAME_BIT

// Origin says what a Sample records: enum sample_origin of bpf/types.h.
type Origin uint8

// Origins.
const (
	OriginCPU    = Origin(bpf.ProfileSampleOriginORIGIN_CPU)     // CPU-clock samples
	OriginOffCPU = Origin(bpf.ProfileSampleOriginORIGIN_OFF_CPU) // waits off CPU
)

// Sample is one aggregated row: every sample of one thread on one CPU with
// the same stacks since the previous Drain.
type Sample struct {
	// Origin is OriginCPU unless the row holds waits off CPU: then Count
	// is how many were recorded, OffCPUNs the estimate of their total
	// time, OffCPUVar (ns^2) the estimate of its variance, Runnable says
	// the thread was preempted rather than blocked, and CPU is the one it
	// ran on again (docs/off-cpu.md).
	Origin    Origin
	OffCPUNs  uint64
	OffCPUVar float64
	Runnable  bool

	Pid, Tid uint32
	// GoLabels is the labels pointer of the Go goroutine the samples ran
	// (runtime.g.labels), 0 when none: Runtimes().Labels reads the set.
	GoLabels uint64
	// TraceID and SpanID are the span the thread published through the
	// OpenTelemetry thread context (OTEP 4947) when the samples were
	// taken, zero when none.
	TraceID [16]byte
	SpanID  [8]byte
	Comm    string // thread name at the first sample
	CPU     uint32
	// UserPCs is the user stack, leaf first; PCs after the first are
	// return addresses, but see UserExact. An entry with RuntimeMark set
	// is a runtime frame, Runtime[entry&^RuntimeMark], in its place in
	// the call order.
	UserPCs []uint64
	Runtime []runtimes.Frame
	// UserExact lists the indexes (> 0) of UserPCs that are not return
	// addresses: the interrupted PC after a signal frame, which must not be
	// stepped back into a call. Nil for almost every stack.
	UserExact []uint8
	KernelPCs []uint64 // leaf first; empty unless Config.KernelStacks
	Count     uint64
	FirstNs   int64 // Unix time of the first and last sample, ns
	LastNs    int64
	Truncated bool // a stack reached MaxStackDepth and may be cut short
	// Stop says how the user stack ended when it was walked with unwind
	// tables (StopOK for a whole stack); StopFramePointers otherwise.
	Stop StopReason
}

// Batch is what Drain returns.
type Batch struct {
	Samples []Sample
}

// Stats are cumulative counters since New.
type Stats struct {
	Samples uint64 // perf events on a non-idle task
	// Lost is the sum of the Lost* counters: samples not in any Batch.
	Lost        uint64
	LostStack   uint64 // stack id error: STACK_TRACE bucket collision or map full
	LostMapFull uint64 // count map full
	LostRingbuf uint64 // sample ring buffer full
	// LostDrain counts samples whose stack Drain could not read back
	// from the kernel; DrainErrors the map operations that failed.
	LostDrain   uint64
	DrainErrors uint64
	Truncated   uint64 // samples with a stack at MaxStackDepth
	// LostEvents counts process events dropped in the kernel (ring buffer
	// full) or in Go (Events channel full).
	LostEvents uint64
	// UnwindFrames counts user frames walked by the table-driven unwinder,
	// Stops its stacks by how they ended, UnwindTailFail failed tail calls.
	UnwindFrames   uint64
	Stops          [NumStopReasons]uint64
	UnwindTailFail uint64
	// StackCopies counts samples of processes whose tables were not
	// loaded yet whose user stack was copied, to be walked on the host
	// (their stop reasons are in Stops once walked); StackCopyLost those
	// whose copy could not be sent (walked with frame pointers, not_ready).
	StackCopies, StackCopyLost uint64
	// OffCPU counts waits off CPU (zero unless Config.OffCPU.Enabled).
	OffCPU OffCPUStats
	// Selection counts the CPU samples the cgroup selection let through
	// (then walked) and those it dropped before any walk (zero unless
	// Config.SelectCgroups).
	Selection SelectionStats
}

// SelectionStats are the cgroup selection's verdicts (Config.SelectCgroups).
type SelectionStats struct {
	Selected, NotSelected uint64
}

// add sums one CPU's counters, indexed by enum select_verdict.
func (s *SelectionStats) add(v [bpf.ProfileSelectVerdictSELECT_VERDICTS]uint64) {
	s.Selected += v[bpf.ProfileSelectVerdictSELECT_SELECTED]
	s.NotSelected += v[bpf.ProfileSelectVerdictSELECT_NOT_SELECTED]
}

// MaxSelectCgroups bounds Config.SelectCgroups: a hash map's memory.
const MaxSelectCgroups = 1 << 16

// OffCPUStats count waits off CPU, from the threads' switches to the drain.
// Seen = Chosen + the waits left out by chance; Chosen = Kept + Short +
// the Lost ones + those still going on.
type OffCPUStats struct {
	Seen      uint64 // waits of threads of targeted processes
	Chosen    uint64 // of those, chosen to be recorded: their stacks were taken
	Kept      uint64 // recorded, weighted, in a Batch
	Short     uint64 // chosen, but shorter than MinWait
	Undecided uint64 // waits of a process Select had not answered for yet
	// Lost, by reason: the waits being recorded were MaxWaits
	// (WaitsFull), their stacks MaxStacks (StacksFull), the count map was
	// full (MapFull), a stack could not be copied out (Stack) or read back
	// by the drain (Drain), the tid had been reused or the stacks
	// collected (Stale), or the thread was gone when the drain looked
	// (NeverReturned: it never ran again).
	WaitsFull, StacksFull, MapFull, Stack, Drain, Stale, NeverReturned uint64
	// Selection counts the switches away from user threads by the cgroup
	// selection's verdict: a thread not selected is never looked at
	// further (Config.SelectCgroups).
	Selection SelectionStats
}

// EventKind says what happened to a process.
type EventKind uint32

// Event kinds: enum proc_event_kind of bpf/profile.c.
const (
	ProcessNew  = EventKind(bpf.ProfileProcEventKindPROC_NEW)  // first sample of this pid since it was last seen
	ProcessExec = EventKind(bpf.ProfileProcEventKindPROC_EXEC) // a sampled process called execve: its maps changed
	ProcessExit = EventKind(bpf.ProfileProcEventKindPROC_EXIT) // a sampled process's last thread is exiting
	// ProcessMapsChanged: a PC fell in no known mapping (dlopen, mmap after
	// the last snapshot); at most one per process and second.
	ProcessMapsChanged = EventKind(bpf.ProfileProcEventKindPROC_REMAP)

	// tableWanted is handled inside the sampler: a sample needed a table
	// that was not built yet.
	tableWanted = EventKind(bpf.ProfileProcEventKindPROC_TABLE)
	// offCPUAsk is handled inside the sampler too: off-CPU samples need
	// Config.OffCPU.Select's answer for the process.
	offCPUAsk = EventKind(bpf.ProfileProcEventKindPROC_OFFCPU)
)

func (k EventKind) String() string {
	switch k {
	case ProcessNew:
		return "new"
	case ProcessExec:
		return "exec"
	case ProcessExit:
		return "exit"
	case ProcessMapsChanged:
		return "maps-changed"
	}
	return fmt.Sprintf("EventKind(%d)", uint32(k))
}

// Event tells the caller when to read /proc/PID/maps: on ProcessNew and
// ProcessExec right away, and on ProcessExit as a last chance (the address
// space may already be gone; MMAlive says whether it still was when the
// kernel sent it). Samples of exited processes stay in the next Batch.
type Event struct {
	Pid     uint32
	Kind    EventKind
	TimeNs  int64 // Unix time, ns
	MMAlive bool
}

// ErrClosed is returned by methods called after Close.
var ErrClosed = errors.New("sampler: closed")

// ErrStarted is returned by a second Start.
var ErrStarted = errors.New("sampler: already started")

// MinKernel is the oldest kernel release tested (test/kernels): 5.10 has
// every feature the sampler needs (ring buffers 5.8, tp_btf 5.5); what
// later kernels add (bpf_task_pt_regs 5.15, perf_event links 5.15, memory
// cgroup accounting of BPF 5.11) is probed and has a fallback.
var MinKernel = [2]int{5, 10}

// PrerequisiteError lists everything missing, so one start-up line says it
// all.
type PrerequisiteError struct {
	Missing []string
}

func (e *PrerequisiteError) Error() string {
	return "sampler: cannot run: " + strings.Join(e.Missing, "; ")
}
