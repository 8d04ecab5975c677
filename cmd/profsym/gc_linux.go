package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/elfx"
)

// readSysLimits reads RLIMIT_AS with the address space mapped now
// (/proc/self/status), and the memory cgroup of the process.
func readSysLimits() sysLimits {
	lim := sysLimits{addressSpace: -1, cgroup: cgroupRoom("/proc/self/cgroup", "/sys/fs/cgroup")}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_AS, &rl) == nil && rl.Cur != unix.RLIM_INFINITY && rl.Cur < 1<<62 {
		if used, ok := vmSize("/proc/self/status"); ok {
			lim.addressSpace = max(int64(rl.Cur)-used, 0)
		}
	}
	return lim
}

// vmSize is the VmSize line of a /proc/PID/status file, in bytes.
func vmSize(status string) (int64, bool) { return elfx.VmSize(status) }

// cgroupRoom is the least of limit less usage over the memory cgroups
// holding the process (cgroupFile, as /proc/self/cgroup) and their
// ancestors, under the cgroup file system at root: v2's memory.max and
// memory.current, or v1's memory.limit_in_bytes and memory.usage_in_bytes
// under root/memory. In a container whose cgroup namespace hides the path
// the file names, the mount's own root is the process's cgroup. -1 when no
// limit is set or none can be read.
func cgroupRoom(cgroupFile, root string) int64 {
	f, err := os.Open(cgroupFile)
	if err != nil {
		return -1
	}
	defer f.Close()
	room := int64(-1)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var base, limitFile, usageFile string
		switch {
		case parts[0] == "0" && parts[1] == "":
			base, limitFile, usageFile = root, "memory.max", "memory.current"
		case strings.Contains(","+parts[1]+",", ",memory,"):
			base, limitFile, usageFile = filepath.Join(root, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		dir := filepath.Join(base, filepath.Clean("/"+parts[2]))
		if _, err := os.Stat(dir); err != nil {
			dir = base
		}
		for {
			if r, ok := roomIn(dir, limitFile, usageFile); ok && (room < 0 || r < room) {
				room = r
			}
			if dir == base || len(dir) <= len(base) {
				break
			}
			dir = filepath.Dir(dir)
		}
	}
	return room
}

// roomIn reads one cgroup's limit less its usage; false when it has no
// limit ("max", or v1's page-rounded maximum).
func roomIn(dir, limitFile, usageFile string) (int64, bool) {
	limit, ok := readInt(filepath.Join(dir, limitFile))
	if !ok || limit >= 1<<62 {
		return 0, false
	}
	usage, ok := readInt(filepath.Join(dir, usageFile))
	if !ok {
		usage = 0
	}
	return max(limit-usage, 0), true
}

func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
