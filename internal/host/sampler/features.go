//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// What the sampler needs from the kernel, probed (cilium/ebpf's features
// package loads a tiny program or map per question), never inferred from
// the version: distributions backport. Each names the release that brought
// it, for the message.
var required = []struct {
	name  string
	probe func() error
}{
	{"perf_event BPF programs (Linux 4.9)", func() error { return features.HaveProgramType(ebpf.PerfEvent) }},
	{"BTF-enabled tracepoints, tp_btf (Linux 5.5)", func() error { return features.HaveProgramType(ebpf.Tracing) }},
	{"BPF ring buffers (Linux 5.8)", func() error { return features.HaveMapType(ebpf.RingBuf) }},
	{"mmapable BPF arrays (Linux 5.5)", func() error { return features.HaveMapFlag(features.BPF_F_MMAPABLE) }},
	{"helper bpf_probe_read_user (Linux 5.5)", helper(asm.FnProbeReadUser)},
	{"helper bpf_ktime_get_boot_ns (Linux 5.8)", helper(asm.FnKtimeGetBootNs)},
}

func helper(fn asm.BuiltinFunc) func() error {
	return func() error { return features.HaveProgramHelper(ebpf.PerfEvent, fn) }
}

// missingFeatures names what the running kernel lacks; nil when it has
// everything. A probe that cannot tell (no privilege) is not reported.
func missingFeatures() []string {
	var out []string
	for _, r := range required {
		if err := r.probe(); errors.Is(err, ebpf.ErrNotSupported) {
			out = append(out, r.name)
		}
	}
	return out
}

// kernelPaths are the code paths chosen for this kernel (bpf/compat.h).
type kernelPaths struct {
	// taskPtRegs: bpf_task_pt_regs (5.15) and bpf_get_current_task_btf
	// (5.11); without them the walker finds the registers saved on kernel
	// entry at the top of the task's kernel stack.
	taskPtRegs bool
	threadSize uint64 // THREAD_SIZE, for that computation
}

func probePaths() kernelPaths {
	p := kernelPaths{threadSize: threadSize()}
	p.taskPtRegs = features.HaveProgramHelper(ebpf.PerfEvent, asm.FnTaskPtRegs) == nil &&
		features.HaveProgramHelper(ebpf.PerfEvent, asm.FnGetCurrentTaskBtf) == nil
	return p
}

// threadSize is the kernel stack size: 16 KiB on x86-64, and on arm64
// 16 KiB or the page size if larger (64 KiB pages). KASAN kernels double
// it; the walker checks what it finds there is a user context.
func threadSize() uint64 {
	return uint64(max(16384, os.Getpagesize()))
}

// raiseMemlock makes room for need bytes of BPF memory where the kernel
// still charges it to RLIMIT_MEMLOCK (before 5.11; memory cgroups since):
// it lifts the limit when allowed (CAP_SYS_RESOURCE), else raises the soft
// limit to the hard one when that is enough, else says what is needed.
func raiseMemlock(need uint64) error {
	charged, err := memlockCharged()
	if err != nil || !charged {
		return err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return fmt.Errorf("sampler: reading RLIMIT_MEMLOCK: %w", err)
	}
	if lim.Cur == unix.RLIM_INFINITY || lim.Cur >= need {
		return nil
	}
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	err = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf)
	if err == nil {
		return nil
	}
	if lim.Max == unix.RLIM_INFINITY || lim.Max >= need {
		lim.Cur = lim.Max
		if unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
			return nil
		}
	}
	return &MemlockError{Need: need, Limit: lim.Max, Err: err}
}

// memlockCharged probes whether map memory counts against RLIMIT_MEMLOCK:
// with the soft limit at zero for a moment, a one-entry array can be made
// only where the memory cgroup is charged instead (5.11+). Lowering the
// soft limit needs no privilege. No map is made meanwhile: New runs this
// before it loads anything.
func memlockCharged() (bool, error) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		return false, fmt.Errorf("sampler: reading RLIMIT_MEMLOCK: %w", err)
	}
	if old.Cur == unix.RLIM_INFINITY {
		return false, nil
	}
	zero := unix.Rlimit{Cur: 0, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &zero); err != nil {
		return false, fmt.Errorf("sampler: probing RLIMIT_MEMLOCK accounting: %w", err)
	}
	m, mapErr := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		return false, fmt.Errorf("sampler: restoring RLIMIT_MEMLOCK: %w", err)
	}
	if mapErr == nil {
		m.Close()
		return false, nil
	}
	return errors.Is(mapErr, unix.EPERM), nil
}

// MemlockError says the kernel charges BPF memory to RLIMIT_MEMLOCK (Linux
// before 5.11) and the limit cannot be raised far enough.
type MemlockError struct {
	Need, Limit uint64 // bytes
	Err         error
}

func (e *MemlockError) Error() string {
	return fmt.Sprintf("sampler: this kernel charges BPF maps to RLIMIT_MEMLOCK (no memory cgroup accounting before Linux 5.11): "+
		"they need about %d MiB, the hard limit is %s and cannot be raised (%v); run with CAP_SYS_RESOURCE, "+
		"or raise the limit to at least %d MiB (systemd LimitMEMLOCK=, ulimit -l, the container runtime's memlock ulimit), "+
		"or shrink the maps (unwinding.max_table_bytes, the stack and count map sizes)",
		mib(e.Need), memlockString(e.Limit), e.Err, mib(e.Need))
}

func (e *MemlockError) Unwrap() error { return e.Err }

func mib(b uint64) uint64 { return (b + 1<<20 - 1) >> 20 }

func memlockString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return fmt.Sprintf("%d MiB", mib(v))
}

// memlockNeed estimates what the kernel charges for the maps of spec (as
// 5.10's map_alloc functions count: entries times element sizes plus their
// headers, per CPU where per-CPU) and the programs, with a margin.
func memlockNeed(spec *ebpf.CollectionSpec, cpus int, skip []string) uint64 {
	var n uint64
	round8 := func(v uint32) uint64 { return (uint64(v) + 7) &^ 7 }
	for name, m := range spec.Maps {
		if slices.Contains(skip, name) {
			continue
		}
		e := uint64(m.MaxEntries)
		switch m.Type {
		case ebpf.Array, ebpf.ProgramArray, ebpf.ArrayOfMaps:
			n += e * round8(m.ValueSize)
		case ebpf.PerCPUArray:
			n += e * round8(m.ValueSize) * uint64(cpus)
		case ebpf.Hash, ebpf.LRUHash:
			n += e * (round8(m.KeySize) + round8(m.ValueSize) + 64)
		case ebpf.StackTrace:
			n += e*(round8(m.ValueSize)+16) + 8*e
		case ebpf.RingBuf:
			n += e + 4<<12
		default:
			n += e * (round8(m.KeySize) + round8(m.ValueSize))
		}
		n += 4 << 10 // the map itself
	}
	for _, p := range spec.Programs {
		n += uint64(len(p.Instructions))*8 + 8<<10
	}
	return n + n/10
}

// unknownHelper finds "invalid func unknown#158" in a verifier log.
var unknownHelper = regexp.MustCompile(`invalid func (?:unknown)?#(\d+)`)

// loadError turns a failed load into an error that says what to do: the
// end of the verifier log (enough lines to see the failing instruction and
// the registers), the helper the kernel lacks, and every missing feature.
func loadError(err error) error {
	var ve *ebpf.VerifierError
	var hints []string
	if errors.As(err, &ve) {
		for _, l := range ve.Log {
			if m := unknownHelper.FindStringSubmatch(l); m != nil {
				if id, perr := strconv.Atoi(m[1]); perr == nil {
					hints = append(hints, fmt.Sprintf("the kernel lacks helper %s (#%d)", asm.BuiltinFunc(id), id))
				}
			}
		}
	}
	if miss := missingFeatures(); len(miss) > 0 {
		hints = append(hints, "missing: "+strings.Join(miss, ", "))
	}
	hint := ""
	if len(hints) > 0 {
		hint = " (" + strings.Join(hints, "; ") + ")"
	}
	if errors.Is(err, unix.EPERM) {
		hint += " (missing CAP_BPF/CAP_PERFMON, or RLIMIT_MEMLOCK too low before Linux 5.11?)"
	}
	if ve == nil {
		return fmt.Errorf("sampler: loading BPF objects%s: %w", hint, err)
	}
	tail := ve.Log[max(0, len(ve.Log)-verifierTail):]
	return fmt.Errorf("sampler: loading BPF objects%s: %w\nverifier log, last %d of %d lines:\n\t%s",
		hint, err, len(tail), len(ve.Log), strings.Join(tail, "\n\t"))
}

// verifierTail lines of the verifier log end a load error: the failing
// instruction, the register states before it and the message.
const verifierTail = 24
