//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

const onlineCPUsPath = "/sys/devices/system/cpu/online"

// onlineCPUs parses the kernel's CPU list format, e.g. "0-3,5,7-8".
func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile(onlineCPUsPath)
	if err != nil {
		return nil, err
	}
	return parseCPUList(string(b))
}

func parseCPUList(s string) ([]int, error) {
	var cpus []int
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("empty CPU list")
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil || last < first {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// openPerfEvents opens a disabled CPU-clock event in frequency mode on every
// online CPU and links the sampling program to it. A CPU that goes offline
// between reading the list and opening its event is skipped.
func (s *Sampler) openPerfEvents() error {
	cpus, err := onlineCPUs()
	if err != nil {
		return fmt.Errorf("sampler: listing online CPUs: %w", err)
	}
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample: uint64(s.cfg.SampleRate),
		Bits:   unix.PerfBitFreq | unix.PerfBitDisabled,
	}
	for _, cpu := range cpus {
		fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
			s.log.Warn("skipping CPU that went offline", zap.Int("cpu", cpu))
			continue
		}
		if err != nil {
			return fmt.Errorf("sampler: perf_event_open on CPU %d: %w%s", cpu, err, perfHint(err))
		}
		// Own the fd before anything else can fail.
		s.cpus = append(s.cpus, cpuEvent{cpu: cpu, fd: fd})
		if err := s.attachPerf(&s.cpus[len(s.cpus)-1]); err != nil {
			return err
		}
	}
	if len(s.cpus) == 0 {
		return errors.New("sampler: no online CPU")
	}
	return nil
}

func perfHint(err error) string {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Sprintf(" (needs CAP_PERFMON or CAP_SYS_ADMIN; kernel.perf_event_paranoid=%s)", paranoid())
	case errors.Is(err, unix.EINVAL):
		return " (sample rate above kernel.perf_event_max_sample_rate?)"
	}
	return ""
}

func paranoid() string {
	b, err := os.ReadFile("/proc/sys/kernel/perf_event_paranoid")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// attachPerf attaches the sampling program to c's event with a BPF link
// (Linux 5.15), or where the kernel has no perf_event links, as the first
// attempt finds out, with the PERF_EVENT_IOC_SET_BPF ioctl: closing the
// event's fd then detaches it.
func (s *Sampler) attachPerf(c *cpuEvent) error {
	prog := s.objs.profile()
	if !s.perfIoctl {
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: c.fd, Program: prog, Attach: ebpf.AttachPerfEvent})
		if err == nil {
			c.link = l
			return nil
		}
		if len(s.cpus) > 1 || !noPerfLink(err) {
			return fmt.Errorf("sampler: attaching to perf event on CPU %d: %w", c.cpu, err)
		}
		s.perfIoctl = true
		s.log.Info("no BPF links for perf events (Linux < 5.15): attaching with PERF_EVENT_IOC_SET_BPF", zap.Error(err))
	}
	if err := unix.IoctlSetInt(c.fd, unix.PERF_EVENT_IOC_SET_BPF, prog.FD()); err != nil {
		return fmt.Errorf("sampler: attaching to perf event on CPU %d (ioctl): %w", c.cpu, err)
	}
	return nil
}

// noPerfLink reports whether a failed BPF_LINK_CREATE means the kernel has
// no links for perf events: it rejects the unknown attach type.
func noPerfLink(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENOTSUP)
}
