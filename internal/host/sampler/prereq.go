//go:build linux && (amd64 || arm64)

package sampler

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Capability bits (include/uapi/linux/capability.h).
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

const btfPath = "/sys/kernel/btf/vmlinux"

// host is what the checks read, separated so they can be tested.
type host struct {
	capEff   uint64
	capErr   error
	release  string
	btfErr   error
	paranoid int // -100 when unknown
	// features the kernel lacks (probed only with the capabilities to).
	features []string
}

func readHost() host {
	h := host{paranoid: -100}
	h.capEff, h.capErr = effectiveCaps()
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		h.release = unix.ByteSliceToString(u.Release[:])
	}
	f, err := os.Open(btfPath)
	if err == nil {
		f.Close()
	}
	h.btfErr = err
	if p, err := strconv.Atoi(paranoid()); err == nil {
		h.paranoid = p
	}
	if h.btfErr == nil && h.capErr == nil && (h.capEff&(1<<capSysAdmin) != 0 || h.capEff&(1<<capBPF) != 0) {
		h.features = missingFeatures()
	}
	return h
}

// effectiveCaps reads CapEff of the calling process.
func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}

// CheckPrerequisites reports, in one error, every missing capability,
// kernel feature or setting the sampler needs; nil when all are present.
func CheckPrerequisites() error {
	return readHost().check()
}

func (h host) check() error {
	var missing []string
	has := func(c uint) bool { return h.capErr == nil && h.capEff&(1<<c) != 0 }
	admin := has(capSysAdmin)
	switch {
	case h.capErr != nil:
		missing = append(missing, fmt.Sprintf("capabilities unreadable (%v)", h.capErr))
	case admin:
	case !has(capBPF) && !has(capPerfmon):
		missing = append(missing, "capabilities CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)")
	case !has(capBPF):
		missing = append(missing, "capability CAP_BPF (or CAP_SYS_ADMIN)")
	case !has(capPerfmon):
		missing = append(missing, "capability CAP_PERFMON (or CAP_SYS_ADMIN)")
	}
	// Features, not the version, decide (distributions backport); the
	// version only says what would have them all.
	if len(h.features) > 0 {
		missing = append(missing, fmt.Sprintf("kernel features %s (Linux %d.%d or newer has them all; running %s)",
			strings.Join(h.features, ", "), MinKernel[0], MinKernel[1], h.release))
	}
	if h.btfErr != nil {
		missing = append(missing, fmt.Sprintf("kernel BTF %s (%v; needs CONFIG_DEBUG_INFO_BTF=y)", btfPath, unwrapPathErr(h.btfErr)))
	}
	// Some distributions patch in level 3, which refuses perf_event_open to
	// everyone without CAP_SYS_ADMIN, CAP_PERFMON notwithstanding.
	if h.paranoid > 2 && !admin {
		missing = append(missing, fmt.Sprintf("kernel.perf_event_paranoid=%d needs CAP_SYS_ADMIN (or set it to 2 or less)", h.paranoid))
	}
	if len(missing) == 0 {
		return nil
	}
	return &PrerequisiteError{Missing: missing}
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
