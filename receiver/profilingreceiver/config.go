package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/collector/confmap"

	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/otlp/profbuild"
)

// Limits on the configuration.
const (
	// MaxSampleRate stays well below the kernel's default
	// perf_event_max_sample_rate so the kernel never throttles the event.
	MaxSampleRate     = 1000
	MinReportInterval = 100 * time.Millisecond
)

// Config configures the profiling receiver. See docs/configuration.md.
type Config struct {
	// SampleRate is the sampling frequency per CPU, in Hz.
	SampleRate int `mapstructure:"sample_rate"`
	// MaxStackDepth caps kernel stacks and frame-pointer user stacks (at
	// most 127); unwinding.max_stack_words caps walked ones.
	MaxStackDepth int `mapstructure:"max_stack_depth"`
	// ReportInterval is how often aggregated samples are emitted.
	ReportInterval time.Duration `mapstructure:"report_interval"`
	// KernelStacks records the kernel part of each stack.
	KernelStacks bool `mapstructure:"kernel_stacks"`
	// KernelSymbols names kernel frames from /proc/kallsyms on the host.
	KernelSymbols bool `mapstructure:"kernel_symbols"`
	// PerfMaps names JIT frames from /tmp/perf-PID.map.
	PerfMaps bool `mapstructure:"perf_maps"`
	// Targets selects processes; empty means the whole host.
	Targets []TargetConfig `mapstructure:"targets"`
	// Selection bounds the selection of targets in the kernel, by cgroup,
	// used when every target names a cgroup.
	Selection SelectionConfig `mapstructure:"selection"`
	// Unwinding selects how user stacks are walked.
	Unwinding UnwindingConfig `mapstructure:"unwinding"`
	// Interpreters selects the language runtimes whose frames the walker
	// follows and names on this host (docs/runtimes.md).
	Interpreters InterpretersConfig `mapstructure:"interpreters"`
	// GoLabels puts the pprof labels of Go programs' goroutines on their
	// samples (docs/runtimes.md, "Go pprof labels").
	GoLabels GoLabelsConfig `mapstructure:"go_labels"`
	// ThreadContext links samples to the span their thread published
	// through the OpenTelemetry thread context (OTEP 4947; experimental,
	// off by default; docs/runtimes.md, "Trace links").
	ThreadContext ThreadContextConfig `mapstructure:"thread_context"`
	// OffCPU records where threads wait off CPU, and for how long
	// (docs/off-cpu.md).
	OffCPU OffCPUConfig `mapstructure:"off_cpu"`
	// Kubernetes says how the API server is reached when a target selects
	// pods (targets[].kubernetes).
	Kubernetes KubernetesConfig `mapstructure:"kubernetes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SelectionConfig bounds the cgroup set the BPF programs check before any
// walk when every target names a cgroup (docs/configuration.md).
type SelectionConfig struct {
	// MaxCgroups bounds the cgroups selected at once (kernel memory: about
	// 80 bytes each); past it, every cgroup is sampled and the targets
	// filter after sampling, until they fit again.
	MaxCgroups int `mapstructure:"max_cgroups"`
	// RescanInterval is how often the cgroup tree is rescanned: a cgroup
	// made later whose path matches is selected within it.
	RescanInterval time.Duration `mapstructure:"rescan_interval"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// interpreters.name_interval's default and bound.
const (
	DefaultNameInterval = time.Second
	MinNameInterval     = 100 * time.Millisecond
)

// Selection defaults and bounds.
const (
	DefaultMaxCgroups     = 1024
	DefaultRescanInterval = time.Second
	MinRescanInterval     = 100 * time.Millisecond
)

// OffCPUConfig turns on off-CPU profiles and bounds their cost
// (docs/off-cpu.md).
type OffCPUConfig struct {
	// Enabled adds an off_cpu profile (nanoseconds waited, by stack,
	// thread and reason) next to each process's CPU profile.
	Enabled bool `mapstructure:"enabled"`
	// Probability is the least chance a wait has of being recorded; each
	// recorded wait counts its length divided by the chance it had, so
	// totals stay unbiased.
	Probability float64 `mapstructure:"probability"`
	// UninterruptibleProbability is the least chance of a wait in
	// uninterruptible sleep (disk I/O, page faults).
	UninterruptibleProbability float64 `mapstructure:"uninterruptible_probability"`
	// PreemptedProbability is the least chance of a preemption of a
	// thread preempted many times in a row without blocking (a busy thread
	// on a loaded CPU); 1 records them as the thread's other waits.
	PreemptedProbability float64 `mapstructure:"preempted_probability"`
	// MinWait leaves out shorter waits.
	MinWait time.Duration `mapstructure:"min_wait"`
	// MaxWaits bounds the waits being recorded at once, MaxStacks the
	// distinct stacks of those that span a report (kernel memory: about
	// 120 bytes and 1.5 KiB each).
	MaxWaits  int `mapstructure:"max_waits"`
	MaxStacks int `mapstructure:"max_stacks"`
	// Targets selects the processes whose waits are recorded, among those
	// the receiver profiles; empty means all of them.
	Targets []TargetConfig `mapstructure:"targets"`
	// Wall adds a wall-clock profile per process: CPU and off-CPU time in
	// one, per thread.
	Wall bool `mapstructure:"wall"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// sampler turns the configuration into the sampler's (Select is set by the
// receiver).
func (c OffCPUConfig) sampler() (offcpu.Config, error) {
	oc := offcpu.Config{
		Enabled: c.Enabled, Probability: c.Probability, Uninterruptible: c.UninterruptibleProbability,
		Preempted: c.PreemptedProbability, MinWait: c.MinWait, MaxWaits: c.MaxWaits, MaxStacks: c.MaxStacks,
	}
	return oc, oc.Validate() // no defaults here: the default config has them, a 0 was written
}

// UnwindingConfig selects how user stacks are walked and bounds the kernel
// memory of the unwind tables (docs/unwinding.md).
type UnwindingConfig struct {
	// Mode is "auto" (unwind tables from .eh_frame, .debug_frame and Go's
	// pcsp where a file has them, frame pointers elsewhere) or
	// "frame_pointers".
	Mode string `mapstructure:"mode"`
	// MaxTableBytes bounds the rows of all tables in kernel memory.
	MaxTableBytes int64 `mapstructure:"max_table_bytes"`
	// MaxMappings bounds the executable mappings of all tracked processes.
	MaxMappings int `mapstructure:"max_mappings"`
	// MaxProcesses bounds the processes with unwind mappings.
	MaxProcesses int `mapstructure:"max_processes"`
	// StackCopyBytes is how much user stack a sample copies while its
	// process's tables are not loaded yet, walked on the host once they
	// are; 0 turns copies off (x86-64 only).
	StackCopyBytes int `mapstructure:"stack_copy_bytes"`
	// MaxStackWords bounds a walked user stack: a native frame takes one
	// word, a runtime's frame (Python, Java, ...) two. max_stack_depth
	// bounds kernel stacks and frame-pointer ones.
	MaxStackWords int `mapstructure:"max_stack_words"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// InterpretersConfig selects the language runtimes whose frames the
// walker follows (unwinding.mode auto only) and bounds what naming them
// keeps (docs/runtimes.md).
type InterpretersConfig struct {
	// HotSpot walks Java stacks of HotSpot JVMs (OpenJDK 8 to 27).
	HotSpot bool `mapstructure:"hotspot"`
	// CPython walks Python stacks of CPython 3.9 and later.
	CPython bool `mapstructure:"cpython"`
	// Perl walks Perl stacks of Perl 5.36, 5.40 and 5.42 (threaded).
	Perl bool `mapstructure:"perl"`
	// PHP walks PHP stacks of PHP 8.2 and 8.4 (non-thread-safe builds:
	// CLI, FPM, CGI).
	PHP bool `mapstructure:"php"`
	// Ruby walks Ruby stacks of CRuby 3.1 and 3.3 (x86-64).
	Ruby bool `mapstructure:"ruby"`
	// V8 walks JavaScript stacks of Node.js (V8 with its v8dbg_* tables).
	V8 bool `mapstructure:"v8"`
	// MaxCachedNames bounds the names cached per runtime (methods, code
	// objects).
	MaxCachedNames int `mapstructure:"max_cached_names"`
	// MaxNameLength cuts every name and file name read from a process.
	MaxNameLength int `mapstructure:"max_name_length"`
	// NameInterval is how often, while a process of these runtimes is
	// walked, the samples are drained ahead of the report and their frames
	// named: a runtime frees or moves what a frame points at (V8 collects a
	// function nothing refers to any more, and the optimized code of a loop
	// once it is left). 0 names at the report only.
	NameInterval time.Duration `mapstructure:"name_interval"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// GoLabelsConfig configures reading Go pprof labels (unwinding.mode auto
// only).
type GoLabelsConfig struct {
	// Enabled reads the labels of the goroutine each sample of a Go
	// program ran and puts them on the sample as pprof.label.<key>.
	Enabled bool `mapstructure:"enabled"`
	// MaxLabels bounds the labels kept per sample (1-256).
	MaxLabels int `mapstructure:"max_labels"`
	// MaxLabelBytes cuts every label key and value (1-4096).
	MaxLabelBytes int `mapstructure:"max_label_bytes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// ThreadContextConfig configures reading the OpenTelemetry thread context
// (unwinding.mode auto only).
type ThreadContextConfig struct {
	// Enabled copies the trace and span ids a thread's otel_thread_ctx_v1
	// record holds into each of its samples, which links to that span.
	Enabled bool `mapstructure:"enabled"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// sampler turns the interpreters', Go labels' and thread context's
// configuration into the sampler's.
func (c *Config) runtimes() (runtimes.Config, error) {
	rc, err := c.Interpreters.sampler()
	if err != nil {
		return rc, err
	}
	rc.GoLabels, rc.MaxLabels, rc.MaxLabelBytes = c.GoLabels.Enabled, c.GoLabels.MaxLabels, c.GoLabels.MaxLabelBytes
	rc.ThreadContext = c.ThreadContext.Enabled
	return rc, rc.Validate()
}

// sampler turns the configuration into the sampler's.
func (c InterpretersConfig) sampler() (runtimes.Config, error) {
	rc := runtimes.Config{HotSpot: c.HotSpot, CPython: c.CPython, Perl: c.Perl, PHP: c.PHP, Ruby: c.Ruby, V8: c.V8, MaxNames: c.MaxCachedNames, MaxNameBytes: c.MaxNameLength}
	return rc, rc.Validate()
}

// sampler turns the configuration into the sampler's.
func (u UnwindingConfig) sampler() (unwind.Config, error) {
	mode, err := unwind.ParseMode(u.Mode)
	if err != nil {
		return unwind.Config{}, err
	}
	c := unwind.Config{
		Mode: mode, MaxTableBytes: u.MaxTableBytes, MaxMappings: u.MaxMappings, MaxProcesses: u.MaxProcesses,
		StackCopyBytes: u.StackCopyBytes, MaxStackWords: u.MaxStackWords,
	}
	if u.StackCopyBytes == 0 {
		c.StackCopyBytes = -1 // off (the Manager's zero is its default)
	}
	c.SetDefaults()
	return c, c.Validate()
}

// TargetConfig selects processes; every field set must match, and a process
// is profiled when any target matches it.
type TargetConfig struct {
	// PIDs lists process ids.
	PIDs []int `mapstructure:"pids"`
	// ProcessName is a regular expression matched against the process's
	// comm and its executable's base name.
	ProcessName string `mapstructure:"process_name"`
	// Cgroup is matched at the start of the process's cgroup v2 path: a
	// path prefix, or a regular expression.
	Cgroup string `mapstructure:"cgroup"`
	// Kubernetes selects the processes of the pods on this node that the
	// API server lists in one of some namespaces, with some labels.
	Kubernetes *KubernetesTargetConfig `mapstructure:"kubernetes"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		SampleRate:     99,
		MaxStackDepth:  sampler.MaxStackDepth,
		ReportInterval: 10 * time.Second,
		KernelStacks:   true,
		KernelSymbols:  true,
		PerfMaps:       true,
		Selection: SelectionConfig{
			MaxCgroups:     DefaultMaxCgroups,
			RescanInterval: DefaultRescanInterval,
		},
		Kubernetes: KubernetesConfig{
			AuthType:    authServiceAccount,
			SyncTimeout: defaultK8sSyncTimeout,
		},
		Unwinding: UnwindingConfig{
			Mode:           unwind.ModeAuto.String(),
			MaxTableBytes:  unwind.DefaultMaxTableBytes,
			MaxMappings:    unwind.DefaultMaxMappings,
			MaxProcesses:   unwind.DefaultMaxProcesses,
			StackCopyBytes: unwind.DefaultStackCopyBytes,
			MaxStackWords:  unwind.DefaultMaxStackWords,
		},
		Interpreters: InterpretersConfig{
			HotSpot:        true,
			CPython:        true,
			Perl:           true,
			PHP:            true,
			Ruby:           true,
			V8:             true,
			MaxCachedNames: runtimes.DefaultMaxNames,
			MaxNameLength:  runtimes.DefaultMaxNameBytes,
			NameInterval:   DefaultNameInterval,
		},
		GoLabels: GoLabelsConfig{
			Enabled:       true,
			MaxLabels:     runtimes.DefaultMaxLabels,
			MaxLabelBytes: runtimes.DefaultMaxLabelBytes,
		},
		OffCPU: OffCPUConfig{
			Probability:                offcpu.DefaultProbability,
			UninterruptibleProbability: offcpu.DefaultUninterruptible,
			PreemptedProbability:       offcpu.DefaultPreempted,
			MaxWaits:                   offcpu.DefaultMaxWaits,
			MaxStacks:                  offcpu.DefaultMaxStacks,
		},
	}
}

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.SampleRate < 1 || c.SampleRate > MaxSampleRate {
		errs = append(errs, fmt.Errorf("sample_rate must be between 1 and %d Hz, got %d", MaxSampleRate, c.SampleRate))
	}
	if c.MaxStackDepth < 1 || c.MaxStackDepth > sampler.MaxStackDepth {
		errs = append(errs, fmt.Errorf("max_stack_depth must be between 1 and %d, got %d", sampler.MaxStackDepth, c.MaxStackDepth))
	}
	if c.ReportInterval < MinReportInterval {
		errs = append(errs, fmt.Errorf("report_interval must be at least %v, got %v", MinReportInterval, c.ReportInterval))
	}
	if _, _, _, err := c.filters(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Kubernetes.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Selection.MaxCgroups < 1 || c.Selection.MaxCgroups > sampler.MaxSelectCgroups {
		errs = append(errs, fmt.Errorf("selection.max_cgroups must be between 1 and %d, got %d", sampler.MaxSelectCgroups, c.Selection.MaxCgroups))
	}
	if c.Interpreters.NameInterval != 0 && c.Interpreters.NameInterval < MinNameInterval {
		errs = append(errs, fmt.Errorf("interpreters.name_interval must be 0 or at least %v, got %v", MinNameInterval, c.Interpreters.NameInterval))
	}
	if c.Selection.RescanInterval < MinRescanInterval {
		errs = append(errs, fmt.Errorf("selection.rescan_interval must be at least %v, got %v", MinRescanInterval, c.Selection.RescanInterval))
	}
	if _, err := c.Unwinding.sampler(); err != nil {
		errs = append(errs, fmt.Errorf("unwinding: %w", err))
	}
	if _, err := c.Interpreters.sampler(); err != nil {
		errs = append(errs, fmt.Errorf("interpreters: %w", err))
	} else if _, err := c.runtimes(); err != nil {
		errs = append(errs, fmt.Errorf("go_labels: %w", err))
	}
	if c.OffCPU.Enabled {
		if _, err := c.OffCPU.sampler(); err != nil {
			errs = append(errs, err)
		}
		if c.Unwinding.Mode != unwind.ModeAuto.String() {
			errs = append(errs, fmt.Errorf("off_cpu needs unwinding.mode %s, not %q", unwind.ModeAuto, c.Unwinding.Mode))
		}
	}
	return errors.Join(errs...)
}

// filters compiles the targets (nil: the whole host) and the processes
// whose waits are recorded (off_cpu's targets, else the receiver's; nil:
// every process), and the pod selections their Kubernetes targets make,
// in one podTargets both filters read.
func (c *Config) filters() (main, offCPU *profbuild.Filter, pt *podTargets, err error) {
	pt = &podTargets{}
	if main, err = compileTargets("targets", c.Targets, pt); err != nil {
		return nil, nil, nil, err
	}
	offCPU = main
	if c.OffCPU.Enabled && len(c.OffCPU.Targets) > 0 {
		if offCPU, err = compileTargets("off_cpu.targets", c.OffCPU.Targets, pt); err != nil {
			return nil, nil, nil, err
		}
	}
	return main, offCPU, pt, nil
}

// compileTargets compiles targets (named key in errors); nil when empty.
// Their pod selections are added to pt.
func compileTargets(key string, targets []TargetConfig, pt *podTargets) (*profbuild.Filter, error) {
	if len(targets) == 0 {
		return nil, nil
	}
	f := &profbuild.Filter{}
	for i, t := range targets {
		if len(t.PIDs) == 0 && t.ProcessName == "" && t.Cgroup == "" && t.Kubernetes == nil {
			return nil, fmt.Errorf("%s[%d]: set pids, process_name, cgroup or kubernetes (leave %s empty to profile the whole host)", key, i, key)
		}
		for _, pid := range t.PIDs {
			if pid <= 0 {
				return nil, fmt.Errorf("%s[%d].pids: %d is not a process id", key, i, pid)
			}
		}
		ct, err := profbuild.CompileTarget(t.PIDs, t.ProcessName, cgroupPath(t.Cgroup))
		if err != nil {
			return nil, fmt.Errorf("%s[%d].%w", key, i, err)
		}
		if t.Kubernetes != nil {
			if ct.Pods, err = pt.add(t.Kubernetes); err != nil {
				return nil, fmt.Errorf("%s[%d].kubernetes.%w", key, i, err)
			}
			f.Generation = pt.generation
		}
		f.Targets = append(f.Targets, ct)
	}
	return f, nil
}

// The usual mount points of the cgroup v2 hierarchy, longest first.
var cgroupMounts = []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}

// cgroupPath lets a target name a cgroup by its directory
// ("/sys/fs/cgroup/system.slice/x.service") as well as by the path
// /proc/PID/cgroup writes ("/system.slice/x.service").
func cgroupPath(p string) string {
	for _, m := range cgroupMounts {
		if rest, ok := strings.CutPrefix(p, m); ok && (rest == "" || rest[0] == '/') {
			if rest == "" {
				return "/"
			}
			return rest
		}
	}
	return p
}
