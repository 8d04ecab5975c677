//go:build !linux

package sampler

import (
	"fmt"
	"runtime"
	"time"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/unwind"
)

// ErrNotSupported: the sampler needs Linux (perf events and eBPF).
var ErrNotSupported = fmt.Errorf("sampler: eBPF CPU sampling needs Linux, not %s", runtime.GOOS)

// Sampler is a stand-in where the sampler cannot run; New refuses to make
// one.
type Sampler struct{}

// New fails with ErrNotSupported.
func New(Config) (*Sampler, error) { return nil, ErrNotSupported }

// CheckPrerequisites reports that this system is not Linux.
func CheckPrerequisites() error {
	return &PrerequisiteError{Missing: []string{fmt.Sprintf("Linux (this is %s)", runtime.GOOS)}}
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

// ProgramStats fails with ErrNotSupported.
func (*Sampler) ProgramStats() (time.Duration, uint64, error) { return 0, 0, ErrNotSupported }

// OffCPUProgramStats fails with ErrNotSupported.
func (*Sampler) OffCPUProgramStats() (time.Duration, uint64, error) { return 0, 0, ErrNotSupported }
