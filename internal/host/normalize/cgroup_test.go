package normalize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Container ids and pod UIDs as runtimes and the API server make them.
const (
	cid1 = "7e3f6b1c2d9a4e8f0b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f70"
	cid2 = "c0ffee00d15ea5e0b0a710ad5eed0fbadc0de0000000000000000000000000a1"
	uid1 = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
	uidU = "3f2a1b4c_5d6e_4f70_8a9b_0c1d2e3f4a5b" // the systemd driver's spelling
)

// Lines as /proc/PID/cgroup shows them on real hosts: Kubernetes with each
// runtime and cgroup driver, plain Docker and Podman, nerdctl, v1, v2 and
// hybrid hierarchies, and an agent reading through its own cgroup namespace.
func TestParseCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, content       string
		id, pod, rt, cgPath string
	}{
		{name: "k8s containerd systemd v2",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "containerd"},
		{name: "k8s containerd systemd guaranteed",
			content: "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "containerd"},
		{name: "k8s containerd cgroupfs v2 (plain id, runtime unsaid)",
			content: "0::/kubepods/besteffort/pod" + uid1 + "/" + cid1 + "\n",
			id:      cid1, pod: uid1},
		{name: "k8s cgroupfs guaranteed v1",
			content: "12:pids:/kubepods/pod" + uid1 + "/" + cid1 + "\n11:cpu,cpuacct:/kubepods/pod" + uid1 + "/" + cid1 + "\n1:name=systemd:/kubepods/pod" + uid1 + "/" + cid1 + "\n",
			id:      cid1, pod: uid1, cgPath: "/kubepods/pod" + uid1 + "/" + cid1},
		{name: "k8s cri-o systemd v2",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "cri-o"},
		{name: "k8s cri-o cgroupfs",
			content: "0::/kubepods/burstable/pod" + uid1 + "/crio-" + cid1 + "\n",
			id:      cid1, pod: uid1, rt: "cri-o"},
		{name: "k8s cri-o container sub-cgroup",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-" + cid1 + ".scope/container\n",
			id:      cid1, pod: uid1, rt: "cri-o"},
		{name: "k8s cri-o conmon is beside the container, not in it",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-conmon-" + cid1 + ".scope\n",
			pod:     uid1},
		{name: "k8s docker (dockershim, cri-dockerd) systemd v1",
			content: "4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/docker-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "docker"},
		{name: "kind: kubelet under its own slice",
			content: "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "containerd"},
		{name: "agent in a pod: paths relative to its cgroup namespace",
			content: "0::/../../kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n",
			id:      cid1, pod: uid1, rt: "containerd"},
		{name: "k8s pod cgroup itself (no container)",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice\n",
			pod:     uid1},
		{name: "static pod: manifest hash, not a UID",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6a0f3c4b8e1c2d3e4f5a6b7c8d9e0f1a.slice/cri-containerd-" + cid1 + ".scope\n",
			id:      cid1, rt: "containerd"},
		{name: "docker systemd v2",
			content: "0::/system.slice/docker-" + cid1 + ".scope\n",
			id:      cid1, rt: "docker"},
		{name: "docker cgroupfs v1, hybrid with a v2 root",
			content: "12:cpu,cpuacct:/docker/" + cid1 + "\n0::/\n",
			id:      cid1, rt: "docker", cgPath: "/"},
		{name: "docker cgroupfs v2",
			content: "0::/docker/" + cid1 + "\n",
			id:      cid1, rt: "docker"},
		{name: "podman rootful systemd",
			content: "0::/machine.slice/libpod-" + cid1 + ".scope/container\n",
			id:      cid1, rt: "podman"},
		{name: "podman rootless",
			content: "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + cid1 + ".scope\n",
			id:      cid1, rt: "podman"},
		{name: "podman cgroupfs",
			content: "0::/libpod_parent/" + cid1 + "\n",
			id:      cid1, rt: "podman"},
		{name: "podman conmon",
			content: "0::/machine.slice/libpod-conmon-" + cid1 + ".scope\n"},
		{name: "nerdctl systemd",
			content: "0::/system.slice/nerdctl-" + cid1 + ".scope\n",
			id:      cid1, rt: "containerd"},
		{name: "containerd namespace cgroupfs",
			content: "0::/default/" + cid1 + "\n",
			id:      cid1},
		{name: "systemd inside a container: innermost container wins",
			content: "0::/system.slice/docker-" + cid1 + ".scope/system.slice/docker-" + cid2 + ".scope/init.scope\n",
			id:      cid2, rt: "docker"},
		{name: "host session",
			content: "0::/user.slice/user-0.slice/session-3.scope\n"},
		{name: "host service",
			content: "0::/system.slice/ssh.service\n"},
		{name: "uppercase hex is no runtime's id",
			content: "0::/docker/" + strings.ToUpper(cid1) + "\n"},
		{name: "63 hex digits",
			content: "0::/docker/" + cid1[1:] + "\n"},
		{name: "unknown prefix",
			content: "0::/system.slice/foo-" + cid1 + ".scope\n"},
		{name: "pod-like segment outside kubepods",
			content: "0::/system.slice/pod" + uid1 + "/" + cid1 + "\n",
			id:      cid1},
		{name: "empty", content: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ParseCgroup(tc.content)
			if c.ContainerID != tc.id || c.PodUID != tc.pod || c.Runtime != tc.rt {
				t.Errorf("got id %q pod %q runtime %q\nwant id %q pod %q runtime %q", c.ContainerID, c.PodUID, c.Runtime, tc.id, tc.pod, tc.rt)
			}
			want := tc.cgPath
			if want == "" && tc.content != "" {
				want = strings.SplitN(strings.TrimSpace(tc.content), ":", 3)[2]
			}
			if c.Path != want {
				t.Errorf("path %q, want %q", c.Path, want)
			}
		})
	}
}

func TestReadNSpid(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   int
	}{
		{"Name:\tsh\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t1\nNSpid:\t4242\n", 0},
		{"Name:\tsh\nPid:\t4242\nNSpid:\t4242\t1\nNSpgid:\t4242\t1\n", 1},
		{"Pid:\t4242\nNSpid:\t4242\t77\t7\n", 7}, // innermost of three
		{"Pid:\t4242\n", 0},                      // before 4.1
		{"NSpid:\t4242\tx\n", 0},
	} {
		if got := ReadNSpid(tc.status); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.status, got, tc.want)
		}
	}
}

// A process's snapshot carries what its cgroup file says.
func TestProcessCgroupAttributes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "4242")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"maps":   "",
		"comm":   "busy\n",
		"cgroup": "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n",
		"status": "Name:\tbusy\nPid:\t4242\nNSpid:\t4242\t12\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := New(Options{ProcRoot: root}).Process(4242)
	if err != nil {
		t.Fatal(err)
	}
	if p.ContainerID != cid1 || p.PodUID != uid1 || p.ContainerRuntime != "containerd" || p.VPID != 12 {
		t.Errorf("got %q %q %q %d", p.ContainerID, p.PodUID, p.ContainerRuntime, p.VPID)
	}
}

// FuzzParseCgroup: any cgroup file parses without panicking, and what it
// returns has the promised shapes.
func FuzzParseCgroup(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + cid1 + ".scope\n")
	f.Add("12:pids:/kubepods/pod" + uid1 + "/" + cid1 + "\n0::/\n")
	f.Add("0::/../../kubepods-besteffort-pod" + uidU + ".slice/crio-conmon-" + cid1 + ".scope/container\n")
	f.Add("0::/libpod_parent/" + cid1 + "\n1:name=systemd:/docker/" + cid2)
	f.Add("::::\n0:\n")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > maxCgroupFile {
			s = s[:maxCgroupFile]
		}
		c := ParseCgroup(s)
		if c.ContainerID != "" && (len(c.ContainerID) != 64 || !isLowerHex(c.ContainerID)) {
			t.Fatalf("container id %q", c.ContainerID)
		}
		if c.PodUID != "" && (len(c.PodUID) != 36 || strings.Count(c.PodUID, "-") != 4) {
			t.Fatalf("pod uid %q", c.PodUID)
		}
		if c.ContainerID == "" && c.Runtime != "" {
			t.Fatalf("runtime %q without a container", c.Runtime)
		}
		if !strings.Contains(s, c.Path) {
			t.Fatalf("path %q not in the input", c.Path)
		}
	})
}

// A process in the proc mount's PID namespace, where the agent is (its
// own status has one NSpid; their ns/pid links are the same), has no other
// pid: status is not read. One in another namespace gets its innermost pid
// from status; so does one whose link cannot be read, and any process when
// the agent is not in the mount's namespace.
func TestVPIDFromNamespace(t *testing.T) {
	for _, tc := range []struct {
		name      string
		root, own string // ns/pid links of the agent and of the process ("": none)
		nspid     string // the agent's status's NSpid
		want      int
	}{
		{"same namespace", "pid:[4026531836]", "pid:[4026531836]", "77", 0},
		{"own namespace", "pid:[4026531836]", "pid:[4026532301]", "77", 12},
		{"no link", "pid:[4026531836]", "", "77", 12},
		{"no agent link", "", "pid:[4026531836]", "77", 12},
		{"agent in a child namespace", "pid:[4026531836]", "pid:[4026531836]", "77\t3", 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for pid, link := range map[string]string{"self": tc.root, "4242": tc.own} {
				if err := os.MkdirAll(filepath.Join(root, pid, "ns"), 0o755); err != nil {
					t.Fatal(err)
				}
				if link != "" {
					if err := os.Symlink(link, filepath.Join(root, pid, "ns", "pid")); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := os.WriteFile(filepath.Join(root, "self", "status"), []byte("Name:\tagent\nNSpid:\t"+tc.nspid+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// The status a process in a child namespace has; a process
			// in the mount's would have one NSpid field, so 12 here
			// says that status was read.
			for name, content := range map[string]string{"maps": "", "comm": "busy\n", "status": "Name:\tbusy\nPid:\t4242\nNSpid:\t4242\t12\n"} {
				if err := os.WriteFile(filepath.Join(root, "4242", name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p, err := New(Options{ProcRoot: root}).Process(4242)
			if err != nil {
				t.Fatal(err)
			}
			if p.VPID != tc.want {
				t.Errorf("VPID %d, want %d", p.VPID, tc.want)
			}
		})
	}
}

// On this host, the test's own process and a child share pid 1's
// namespace: no vpid.
func TestVPIDOfThisHost(t *testing.T) {
	p, err := New(Options{}).Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		want = ReadNSpid(string(st))
	}
	if p.VPID != want {
		t.Errorf("VPID %d, status says %d", p.VPID, want)
	}
}
