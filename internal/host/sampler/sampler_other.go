//go:build !linux || !(amd64 || arm64)

package sampler

import (
	"fmt"
	"runtime"
	"time"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/threadctx"
	"github.com/profsym/profsym/internal/host/unwind"
)

// ErrNotSupported: the sampler needs Linux (perf events and eBPF) on a CPU
// its BPF programs know (their registers and stack layouts: bpf/arch.h).
var ErrNotSupported = fmt.Errorf("sampler: eBPF CPU sampling needs Linux on x86-64 (amd64) or arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)

// Sampler is a stand-in where the sampler cannot run; New refuses to make
// one.
type Sampler struct{}

// New fails with ErrNotSupported.
func New(Config) (*Sampler, error) { return nil, ErrNotSupported }

// CheckPrerequisites reports that this system is not Linux on a supported
// CPU.
func CheckPrerequisites() error {
	return &PrerequisiteError{Missing: []string{fmt.Sprintf("Linux on amd64 or arm64 (this is %s/%s)", runtime.GOOS, runtime.GOARCH)}}
}

func (*Sampler) Start() error          { return ErrNotSupported }
func (*Sampler) Events() <-chan Event  { return nil }
func (*Sampler) Drain() (Batch, error) { return Batch{}, ErrNotSupported }
func (*Sampler) Stats() (Stats, error) { return Stats{}, ErrNotSupported }
func (*Sampler) Close() error          { return nil }

// Unwinder is nil: there is no unwinder without the sampler.
func (*Sampler) Unwinder() *unwind.Manager { return nil }

// Runtimes is nil: no walker, no runtimes.
func (*Sampler) Runtimes() *runtimes.Set { return nil }

// ExecTime knows no exec: nothing records them.
func (*Sampler) ExecTime(int) (int64, bool) { return 0, false }

// ThreadContextStats is zero: no walker reads a thread context.
func (*Sampler) ThreadContextStats() threadctx.Stats { return threadctx.Stats{} }

// ProgramStats fails with ErrNotSupported.
func (*Sampler) ProgramStats() (time.Duration, uint64, error) { return 0, 0, ErrNotSupported }

// OffCPUProgramStats fails with ErrNotSupported.
func (*Sampler) OffCPUProgramStats() (time.Duration, uint64, error) { return 0, 0, ErrNotSupported }

// SetCgroups fails with ErrNotSupported.
func (*Sampler) SetCgroups(map[uint64]struct{}) error { return ErrNotSupported }

// RetakeOffCPUAnswers does nothing: there is no filter to retake.
func (*Sampler) RetakeOffCPUAnswers() int { return 0 }
