// Package offcpu holds what the sampler's off-CPU samples need on the host
// and that does not touch the kernel: the configuration and its bounds, the
// probabilities the eBPF side chooses waits with, and the reason a thread
// waited, read from the kernel frames of its stack (docs/off-cpu.md).
//
// How waits are chosen and weighted. A wait is a thread's time off CPU,
// from the sched_switch that takes it off to the one that runs it again.
// When it leaves the CPU the eBPF program decides whether to record the
// wait, before its length d is known, with a probability p_i that depends
// only on that thread's past: 1 after a wait of the thread that outlasted a
// scheduler tick (and for a thread new to the sampler), then, past a
// window as long as the thread's usual run of short waits between long
// ones, 0.7 of that for each shorter wait, never less than
// Config.Probability (Config.Uninterruptible for a wait in uninterruptible
// sleep: disk I/O, page faults); a wait the thread begins runnable
// (preempted) has at most 0.7^r of it after r such waits in a row, never
// less than Config.Preempted. A
// recorded wait counts d / p_i. Since p_i is fixed before d is drawn, the
// sum over recorded waits is an unbiased estimate of the true off-CPU time
// (the Horvitz-Thompson estimator), per stack as in total, and its variance
// is the sum over all waits of d^2 (1 - p_i) / p_i: waits chosen for sure
// add none. The eBPF side also sums (1 - p_i) (d / p_i)^2 over recorded
// waits, an unbiased estimate of that variance (sampler.Sample.OffCPUVar).
package offcpu

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config configures off-CPU sampling.
type Config struct {
	// Enabled turns it on.
	Enabled bool
	// Probability is the least chance a wait has of being recorded: that
	// of a thread whose recent waits were all shorter than a scheduler
	// tick, 1/65536 to 1. Zero means DefaultProbability.
	Probability float64
	// Uninterruptible is the least chance of a wait in uninterruptible
	// sleep (disk I/O, page faults, some kernel locks): disk latencies are
	// too irregular to predict, and a long wait recorded with chance p
	// counts 1/p times its length, which is what makes an estimate's error
	// large (docs/off-cpu.md). Zero means DefaultUninterruptible (1: all
	// of them); never less than Probability.
	Uninterruptible float64
	// Preempted is the least chance of a wait a thread begins still
	// runnable (preempted), once it has been preempted many times in a row
	// without blocking: a busy thread on a loaded CPU, whose preemptions
	// would otherwise all be recorded (its history of blocking says
	// nothing about them). Each such preemption in a row lowers the chance
	// by 0.7, down to this. Zero means DefaultPreempted; 1 keeps the
	// thread's own chance for them, as before issue 32; never less than
	// Probability.
	Preempted float64
	// MinWait leaves out waits shorter than this: they count nowhere.
	MinWait time.Duration
	// MaxWaits bounds the waits being recorded at once (threads off CPU
	// whose wait was chosen), about 120 bytes each in kernel memory.
	MaxWaits int
	// MaxStacks bounds the distinct stacks of the waits that span a drain
	// (user and kernel: 1 KiB and 0.5 KiB each).
	MaxStacks int
	// Select, when set, says which processes to record (it is asked about
	// a process twice, around writing its answer, and again after an
	// exec); nil records every process.
	Select func(pid int) bool
}

// Defaults and bounds.
const (
	DefaultProbability     = 0.001
	DefaultUninterruptible = 1.0
	DefaultPreempted       = 0.05
	DefaultMaxWaits        = 65536
	DefaultMaxStacks       = 4096
	// One is probability 1 in the eBPF side's fixed point: a probability
	// is k / One with k in 1..One, and the weight of a wait is d * One / k.
	One = 65536
	// MaxMinWait bounds MinWait (the eBPF side caps waits at 2^47 ns).
	MaxMinWait = time.Hour
)

// SetDefaults fills the zero fields.
func (c *Config) SetDefaults() {
	if c.Probability == 0 {
		c.Probability = DefaultProbability
	}
	if c.Uninterruptible == 0 {
		c.Uninterruptible = DefaultUninterruptible
	}
	if c.Preempted == 0 {
		c.Preempted = DefaultPreempted
	}
	if c.MaxWaits == 0 {
		c.MaxWaits = DefaultMaxWaits
	}
	if c.MaxStacks == 0 {
		c.MaxStacks = DefaultMaxStacks
	}
}

// Validate checks the bounds.
func (c *Config) Validate() error {
	var errs []error
	if math.IsNaN(c.Probability) || c.Probability < 1.0/One || c.Probability > 1 {
		errs = append(errs, fmt.Errorf("off_cpu: probability %v outside %v..1", c.Probability, 1.0/One))
	}
	if math.IsNaN(c.Uninterruptible) || c.Uninterruptible < 1.0/One || c.Uninterruptible > 1 {
		errs = append(errs, fmt.Errorf("off_cpu: uninterruptible_probability %v outside %v..1", c.Uninterruptible, 1.0/One))
	}
	if math.IsNaN(c.Preempted) || c.Preempted < 1.0/One || c.Preempted > 1 {
		errs = append(errs, fmt.Errorf("off_cpu: preempted_probability %v outside %v..1", c.Preempted, 1.0/One))
	}
	if c.MinWait < 0 || c.MinWait > MaxMinWait {
		errs = append(errs, fmt.Errorf("off_cpu: min_wait %v outside 0..%v", c.MinWait, MaxMinWait))
	}
	if c.MaxWaits < 16 || c.MaxWaits > 1<<22 {
		errs = append(errs, fmt.Errorf("off_cpu: max_waits %d outside 16..%d", c.MaxWaits, 1<<22))
	}
	if c.MaxStacks < 16 || c.MaxStacks > 1<<20 {
		errs = append(errs, fmt.Errorf("off_cpu: max_stacks %d outside 16..%d", c.MaxStacks, 1<<20))
	}
	return errors.Join(errs...)
}

// FloorK is Probability in the eBPF side's fixed point, rounded to the
// nearest representable probability (at least 1/One). The weights use the
// same k, so the rounding never biases the estimate.
func (c *Config) FloorK() uint32 {
	return fixedPoint(c.Probability)
}

// FloorUninterruptibleK is Uninterruptible likewise, at least FloorK.
func (c *Config) FloorUninterruptibleK() uint32 {
	return max(fixedPoint(c.Uninterruptible), c.FloorK())
}

// FloorPreemptedK is Preempted likewise, at least FloorK.
func (c *Config) FloorPreemptedK() uint32 {
	return max(fixedPoint(c.Preempted), c.FloorK())
}

func fixedPoint(p float64) uint32 {
	k := math.Round(p * One)
	return uint32(min(max(k, 1), One))
}
