package unwind

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
)

// Mode selects how user stacks are walked.
type Mode int

const (
	// ModeAuto walks with unwind tables where a file has them and with
	// frame pointers elsewhere.
	ModeAuto Mode = iota
	// ModeFramePointers walks with frame pointers only (bpf_get_stackid).
	ModeFramePointers
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeFramePointers:
		return "frame_pointers"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode reads "auto" or "frame_pointers".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "auto":
		return ModeAuto, nil
	case "frame_pointers":
		return ModeFramePointers, nil
	}
	return 0, fmt.Errorf("unwinding mode must be auto or frame_pointers, not %q", s)
}

// Defaults of Config.
const (
	DefaultMaxTableBytes = 32 << 20
	DefaultMaxMappings   = 65536
	DefaultMaxTables     = 4096
	DefaultMaxProcesses  = 16384
	// DefaultStackCopyBytes: 8 KiB, as perf record --call-graph dwarf
	// copies; the C chain's whole stack from its leaf is under 1 KiB.
	DefaultStackCopyBytes = 8192
	// MaxStackCopyBytes is what the BPF side can copy (STACK_COPY_MAX).
	MaxStackCopyBytes = int(bpf.ProfileUnwindLimitsSTACK_COPY_MAX)
	// DefaultMaxStackWords keeps the walked-stack maps at 1 KiB a stack:
	// 128 native frames, or about 55 Python or Java frames.
	DefaultMaxStackWords = 128
	// MaxStackWords is what the BPF side can hold (MAX_USER_FRAMES).
	MaxStackWords = int(bpf.ProfileUnwindLimitsMAX_USER_FRAMES)
	minStackWords = 16
)

// Config bounds the kernel memory of the tables. Every map is allocated in
// full when the sampler loads (BPF arrays are preallocated) and charged to
// the agent's memory cgroup, not to RLIMIT_MEMLOCK.
type Config struct {
	Mode Mode
	// MaxTableBytes bounds the rows of all tables (8 bytes each).
	MaxTableBytes int64
	// MaxMappings bounds the executable mappings of all tracked processes
	// (32 bytes each).
	MaxMappings int
	// MaxTables bounds the number of files with a table (24 bytes each).
	MaxTables int
	// MaxProcesses bounds the tracked processes.
	MaxProcesses int
	// StackCopyBytes is how much user stack a sample copies when its
	// process's tables are not loaded yet, to be walked on the host once
	// they are. Zero means DefaultStackCopyBytes; a negative value turns
	// copies off (such samples are walked with frame pointers and marked
	// not_ready). Only those samples pay for it. x86-64 only.
	StackCopyBytes int
	// MaxStackWords bounds a walked user stack, in words: a native frame
	// takes one, a runtime's frame (Python, Java, ...) two. Each entry of
	// the walked-stack maps takes 8 bytes a word. Zero means
	// DefaultMaxStackWords.
	MaxStackWords int
	// ProcRoot is "/proc" unless testing.
	ProcRoot string
	Logger   *zap.Logger
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.MaxTableBytes == 0 {
		c.MaxTableBytes = DefaultMaxTableBytes
	}
	if c.MaxMappings == 0 {
		c.MaxMappings = DefaultMaxMappings
	}
	if c.MaxTables == 0 {
		c.MaxTables = DefaultMaxTables
	}
	if c.MaxProcesses == 0 {
		c.MaxProcesses = DefaultMaxProcesses
	}
	if c.StackCopyBytes == 0 {
		c.StackCopyBytes = DefaultStackCopyBytes
	}
	if c.MaxStackWords == 0 {
		c.MaxStackWords = DefaultMaxStackWords
	}
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// Validate checks the bounds.
func (c *Config) Validate() error {
	var errs []error
	if c.Mode != ModeAuto && c.Mode != ModeFramePointers {
		errs = append(errs, fmt.Errorf("unknown unwinding mode %v", c.Mode))
	}
	if c.MaxTableBytes < 64<<10 || c.MaxTableBytes > 4<<30 {
		errs = append(errs, fmt.Errorf("max_table_bytes must be between 64 KiB and 4 GiB, got %d", c.MaxTableBytes))
	}
	if c.MaxMappings < 1024 || c.MaxMappings > 1<<24 {
		errs = append(errs, fmt.Errorf("max_mappings must be between 1024 and %d, got %d", 1<<24, c.MaxMappings))
	}
	if c.MaxTables < 16 || c.MaxTables > 1<<20 {
		errs = append(errs, fmt.Errorf("max_tables must be between 16 and %d, got %d", 1<<20, c.MaxTables))
	}
	if c.MaxProcesses < 16 || c.MaxProcesses > 1<<22 {
		errs = append(errs, fmt.Errorf("max_processes must be between 16 and %d, got %d", 1<<22, c.MaxProcesses))
	}
	if c.StackCopyBytes > MaxStackCopyBytes || c.StackCopyBytes > 0 && c.StackCopyBytes < 64 {
		errs = append(errs, fmt.Errorf("stack_copy_bytes must be negative (off) or between 64 and %d, got %d", MaxStackCopyBytes, c.StackCopyBytes))
	}
	if c.MaxStackWords < minStackWords || c.MaxStackWords > MaxStackWords {
		errs = append(errs, fmt.Errorf("max_stack_words must be between %d and %d, got %d", minStackWords, MaxStackWords, c.MaxStackWords))
	}
	return errors.Join(errs...)
}

// Sizes of the kernel's entries (bpf/unwind.h), on every architecture.
const (
	// RowBytes is the size of one row in the kernel.
	RowBytes = 8
	// MappingBytes is the size of one mapping entry in the kernel.
	MappingBytes = 32
)

// Rows is how many rows MaxTableBytes holds.
func (c *Config) Rows() uint32 { return uint32(c.MaxTableBytes / RowBytes) }

// Stats are the Manager's gauges and counters.
type Stats struct {
	Processes     int    // processes with mappings in the kernel
	Mappings      int    // mapping entries in use
	Tables        int    // files with a table loaded
	TablesPending int    // files whose table is being built
	TablesLazy    int    // files mapped but never sampled: no table built
	TablesNone    int    // files without a usable table (no CFI, too big, no room)
	Rows          int    // rows loaded
	RowBytes      int64  // kernel memory of the rows
	Builds        uint64 // tables built
	BuildFailures uint64 // files whose table could not be built (frame pointers instead)
	BuildsSkipped uint64 // queued tables not built: every process mapping the file was gone first
	Evictions     uint64 // unused tables dropped to make room
	NoRoom        uint64 // tables that did not fit even after evicting (frame pointers instead)
	ProcsNoRoom   uint64 // processes left to frame pointers: no room for their mappings
	Republished   uint64 // ready tables the BPF side marked pending over, found by Poll
	BuildTime     time.Duration
	// Stacks the BPF walker copied for samples of processes whose tables
	// were not loaded yet (copy.go): received, walked once the tables
	// were, given up on after copyWait (walked as far as possible, marked
	// not_ready), dropped (more than maxCopies waiting), and waiting now.
	// CopiesBeforeExec are copies taken before their process exec'd,
	// given no user frames (stop reason exec).
	CopiesReceived, CopiesWalked, CopiesExpired, CopiesDropped uint64
	CopiesBeforeExec                                           uint64
	CopiesWaiting                                              int
}
