package normalize

import (
	"io"
	"os"
	"strconv"
	"strings"
)

// Cgroup is what a process's /proc/PID/cgroup says about where it runs:
// only the host sees this, so the receiver puts it on the process's
// resource and k8sattributes joins it with the API's view.
type Cgroup struct {
	// Path is the unified (v2) path, or the first v1 hierarchy's path.
	Path string
	// ContainerID is the 64-hex id of the container the process is in.
	ContainerID string
	// PodUID is the Kubernetes pod's UID, dashed, when the kubelet named
	// the cgroup (kubepods...pod<uid>...).
	PodUID string
	// Runtime is containerd, cri-o, docker or podman when the path names
	// it; a cgroupfs-driver kubelet path (.../pod<uid>/<id>) does not.
	Runtime string
}

// maxCgroupFile bounds what is read of /proc/PID/cgroup: one line per v1
// hierarchy, each a path, is a few KiB even on hosts with every controller.
const maxCgroupFile = 64 << 10

func readCgroupFile(path string) Cgroup {
	f, err := os.Open(path)
	if err != nil {
		return Cgroup{}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile))
	if err != nil {
		return Cgroup{}
	}
	return ParseCgroup(string(b))
}

// ParseCgroup reads /proc/PID/cgroup contents: "0::/path" for cgroup v2,
// "N:controllers:/path" per v1 hierarchy. The container is found in
// whichever line names it (v1 hosts put it in every hierarchy; hybrid hosts
// may name it only in some).
func ParseCgroup(s string) Cgroup {
	var c Cgroup
	for line := range strings.SplitSeq(s, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" || c.Path == "" {
			c.Path = parts[2]
		}
		id, pod, rt := parseCgroupPath(parts[2])
		if id != "" && c.ContainerID == "" {
			c.ContainerID, c.Runtime = id, rt
		}
		if pod != "" && c.PodUID == "" {
			c.PodUID = pod
		}
	}
	return c
}

// Where a runtime names a container's cgroup "<prefix><id>[.scope]": the
// systemd driver's scope units, and CRI-O's cgroupfs directories.
var runtimePrefixes = []struct{ prefix, runtime string }{
	{"cri-containerd-", "containerd"},
	{"nerdctl-", "containerd"},
	{"crio-", "cri-o"},
	{"docker-", "docker"},
	{"libpod-", "podman"},
}

// Parent directories that say who made a plain "<id>" cgroup below them.
var runtimeParents = map[string]string{
	"docker":        "docker",
	"libpod_parent": "podman",
}

// parseCgroupPath finds the container id, pod UID and runtime in one
// cgroup path. The innermost container wins (a container's own sub-cgroups,
// e.g. systemd's "init.scope" or podman's "container", sit below it). The
// path may start with "/.." segments when the reader's cgroup namespace is
// not the host's (an agent in a pod); those are skipped like any other
// segment that names nothing.
func parseCgroupPath(path string) (id, podUID, runtime string) {
	kube := false
	parent := ""
	for seg := range strings.SplitSeq(path, "/") {
		if strings.Contains(seg, "kubepods") {
			kube = true
		}
		if kube {
			if u := podUIDOf(seg); u != "" {
				podUID = u
			}
		}
		if cid, rt, ok := containerOf(seg, parent); ok {
			id, runtime = cid, rt
		}
		parent = seg
	}
	return id, podUID, runtime
}

// PodUIDOfPath returns the UID of the Kubernetes pod whose cgroup path
// (v2, as /proc/PID/cgroup writes it) is or contains path, dashed as the
// API writes it; "" when the kubelet named no pod there (static pods'
// cgroups carry their manifest's hash, which is not a UID either).
func PodUIDOfPath(path string) string {
	_, uid, _ := parseCgroupPath(path)
	return uid
}

// containerOf says whether one path segment is a container's cgroup.
// conmon, the monitor CRI-O and podman run beside each container, has a
// scope named after the container ("crio-conmon-<id>.scope") but is not in
// it, so it gets no id.
func containerOf(seg, parent string) (id, runtime string, ok bool) {
	seg = strings.TrimSuffix(seg, ".scope")
	if len(seg) < 64 || !isLowerHex(seg[len(seg)-64:]) {
		return "", "", false
	}
	id, prefix := seg[len(seg)-64:], seg[:len(seg)-64]
	if prefix == "" {
		return id, runtimeParents[parent], true
	}
	if strings.HasSuffix(prefix, "conmon-") {
		return "", "", false
	}
	for _, p := range runtimePrefixes {
		if prefix == p.prefix {
			return id, p.runtime, true
		}
	}
	return "", "", false
}

// podUIDOf reads the pod UID from a kubelet-named segment: "pod<uid>"
// (cgroupfs driver) or "kubepods-<qos>-pod<uid>.slice" (systemd driver,
// where the UID's dashes became underscores because systemd reads a dash
// in a slice name as nesting). Static pods' cgroups carry the hash of
// their manifest, not a UUID, and not the UID their mirror pod has in the
// API: those are left out, and container.id associates them instead.
func podUIDOf(seg string) string {
	seg = strings.TrimSuffix(seg, ".slice")
	i := strings.LastIndex(seg, "pod")
	if i < 0 || (i > 0 && seg[i-1] != '-') {
		return ""
	}
	u := seg[i+3:]
	if len(u) != 36 {
		return ""
	}
	b := []byte(u)
	for j, ch := range b {
		switch j {
		case 8, 13, 18, 23:
			if ch != '-' && ch != '_' {
				return ""
			}
			b[j] = '-'
		default:
			if !isHexDigit(ch) {
				return ""
			}
		}
	}
	return string(b)
}

func isHexDigit(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return false
		}
	}
	return true
}

// ReadNSpid returns the pid a process has in its innermost PID namespace
// (the last field of NSpid in /proc/PID/status), or 0 when the process is
// in the reader's namespace only or the line is missing (kernels before
// 4.1).
func ReadNSpid(status string) int {
	for line := range strings.SplitSeq(status, "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			return 0
		}
		v, err := strconv.Atoi(f[len(f)-1])
		if err != nil || v <= 0 {
			return 0
		}
		return v
	}
	return 0
}

// readVPID reads NSpid from /proc/PID/status.
func readVPID(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	// NSpid comes well within the first 4 KiB of status.
	b, _ := io.ReadAll(io.LimitReader(f, 4<<10))
	return ReadNSpid(string(b))
}
