package profbuild

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/profsym/profsym/internal/host/normalize"
)

// Target selects processes. Every field that is set must match; a Target
// with no field set matches every process.
type Target struct {
	PIDs []int
	// ProcessName is matched (unanchored) against the process's comm and
	// the base name of its executable.
	ProcessName *regexp.Regexp
	// Cgroup is matched against the start of the process's cgroup (v2)
	// path, so a plain path works as a prefix and a regexp as a pattern.
	Cgroup *regexp.Regexp
	// Pods, when set, says whether the Kubernetes pod with a UID is
	// selected (podsel.Watcher.Has): the process's cgroup must name one
	// that is.
	Pods func(uid string) bool
}

// Filter selects the processes a profile covers: those matching any of its
// targets. A nil or empty Filter selects every process.
type Filter struct {
	Targets []Target
	// Generation, when set, changes whenever a target's answer for a
	// process may have (the pods a target selects changed): decisions
	// remembered from before are taken again.
	Generation func() uint64
}

// CompileTarget builds a Target from its configuration strings.
func CompileTarget(pids []int, processName, cgroup string) (Target, error) {
	t := Target{PIDs: pids}
	var err error
	if processName != "" {
		if t.ProcessName, err = regexp.Compile(processName); err != nil {
			return t, fmt.Errorf("process_name: %w", err)
		}
	}
	if cgroup != "" {
		if t.Cgroup, err = regexp.Compile("^(?:" + cgroup + ")"); err != nil {
			return t, fmt.Errorf("cgroup: %w", err)
		}
	}
	return t, nil
}

// ProcInfo is what a filter looks at.
type ProcInfo struct {
	PID    int
	Comm   string
	Exe    string // path of the executable
	Cgroup string // cgroup v2 path ("/system.slice/x.service")
}

// All reports whether f selects every process, so nothing needs reading.
func (f *Filter) All() bool { return f == nil || len(f.Targets) == 0 }

// Match reports whether f selects the process.
func (f *Filter) Match(p ProcInfo) bool {
	if f.All() {
		return true
	}
	for _, t := range f.Targets {
		if t.match(p) {
			return true
		}
	}
	return false
}

// MatchPID reports whether f selects process pid, reading what it needs
// under procRoot ("" means /proc); a process that is gone is not selected.
func (f *Filter) MatchPID(procRoot string, pid int) bool {
	if f.All() {
		return true
	}
	if f.PIDOnly() {
		return f.Match(ProcInfo{PID: pid})
	}
	if procRoot == "" {
		procRoot = "/proc"
	}
	info, ok := f.readProcInfo(procRoot, pid)
	return ok && f.Match(info)
}

// CgroupMatcher returns whether a process in the cgroup at path (v2, as
// /proc/PID/cgroup writes it) can be selected by f, and whether one in a
// cgroup below path can (so that a walk of the cgroup tree skips the
// rest). ok is false when f selects every process, or when a target
// selects processes in any cgroup: then no set of cgroups bounds what f
// selects.
func (f *Filter) CgroupMatcher() (match, below func(path string) bool, ok bool) {
	if f.All() {
		return nil, nil, false
	}
	prefixes := make([]string, len(f.Targets))
	for i, t := range f.Targets {
		if t.Cgroup == nil && t.Pods == nil {
			return nil, nil, false
		}
		// Every match begins with it ("" when the regexp package cannot
		// tell, or for pods, which prunes nothing).
		if t.Cgroup != nil {
			prefixes[i], _ = t.Cgroup.LiteralPrefix()
		}
	}
	match = func(path string) bool {
		for _, t := range f.Targets {
			if t.matchCgroup(path) {
				return true
			}
		}
		return false
	}
	below = func(path string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(p, path) || strings.HasPrefix(path, p) {
				return true
			}
		}
		return match(path)
	}
	return match, below, true
}

// PIDOnly reports whether every target names pids only, so that a pid
// decides without reading /proc.
func (f *Filter) PIDOnly() bool {
	for _, t := range f.Targets {
		if t.ProcessName != nil || t.Cgroup != nil || t.Pods != nil || len(t.PIDs) == 0 {
			return false
		}
	}
	return true
}

func (t Target) match(p ProcInfo) bool {
	if len(t.PIDs) > 0 && !containsInt(t.PIDs, p.PID) {
		return false
	}
	if t.ProcessName != nil && !t.ProcessName.MatchString(p.Comm) &&
		(p.Exe == "" || !t.ProcessName.MatchString(filepath.Base(p.Exe))) {
		return false
	}
	return t.matchCgroup(p.Cgroup)
}

// matchCgroup applies the target's cgroup and pod conditions to a cgroup
// path.
func (t Target) matchCgroup(path string) bool {
	if t.Cgroup != nil && !t.Cgroup.MatchString(path) {
		return false
	}
	return t.Pods == nil || t.Pods(normalize.PodUIDOfPath(path))
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// readProcInfo reads the few small /proc files f's targets look at, far
// cheaper than a full snapshot of the process's mappings and files: comm
// always (it also says the process is there), the executable for a
// process name, the cgroup for a cgroup or pods. Off-CPU asks twice for
// every new process of the host that waits (offcpuState.answer).
func (f *Filter) readProcInfo(procRoot string, pid int) (ProcInfo, bool) {
	var exe, cgroup bool
	for _, t := range f.Targets {
		exe = exe || t.ProcessName != nil
		cgroup = cgroup || t.Cgroup != nil || t.Pods != nil
	}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "comm"))
	if err != nil {
		return ProcInfo{}, false
	}
	p := ProcInfo{PID: pid, Comm: strings.TrimSpace(string(b))}
	if exe {
		p.Exe, _ = os.Readlink(filepath.Join(dir, "exe"))
		p.Exe = strings.TrimSuffix(p.Exe, " (deleted)")
	}
	if cgroup {
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
			p.Cgroup = cgroupV2Path(string(b))
		}
	}
	return p, true
}

// cgroupV2Path returns the unified hierarchy's path ("0::/path"), or the
// first hierarchy's on a v1-only host.
func cgroupV2Path(s string) string {
	first := ""
	for _, line := range strings.Split(s, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		if first == "" {
			first = parts[2]
		}
	}
	return first
}
