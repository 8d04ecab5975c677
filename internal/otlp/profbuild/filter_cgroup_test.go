package profbuild

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/profsym/profsym/internal/host/sampler"
)

func TestCgroupMatcher(t *testing.T) {
	compile := func(cgroups ...string) *Filter {
		f := &Filter{}
		for _, c := range cgroups {
			tg, err := CompileTarget(nil, "", c)
			if err != nil {
				t.Fatal(err)
			}
			f.Targets = append(f.Targets, tg)
		}
		return f
	}
	if _, _, ok := (*Filter)(nil).CgroupMatcher(); ok {
		t.Error("no filter: bounded by cgroups")
	}
	mixed := compile("/a")
	mixed.Targets = append(mixed.Targets, Target{PIDs: []int{1}})
	if _, _, ok := mixed.CgroupMatcher(); ok {
		t.Error("a target without cgroup: bounded by cgroups")
	}
	// A plain path: sub-trees off it are pruned.
	match, below, ok := compile("/system.slice/x.service").CgroupMatcher()
	if !ok {
		t.Fatal("cgroup targets: not bounded by cgroups")
	}
	for path, want := range map[string][2]bool{ // match, below
		"/":                           {false, true},
		"/system.slice":               {false, true},
		"/system.slice/x.service":     {true, true},
		"/system.slice/x.service/sub": {true, true},
		"/system.slice/y.service":     {false, true}, // "." is a pattern: the prefix known is /system
		"/user.slice":                 {false, false},
	} {
		if m, b := match(path), below(path); m != want[0] || b != want[1] {
			t.Errorf("%s: match %v below %v, want %v", path, m, b, want)
		}
	}
	// A pattern whose start the regexp package cannot tell: nothing is
	// pruned, whatever the other targets.
	match, below, _ = compile("/system.slice/x.service", "/kube.*/pod[0-9a-f]+$").CgroupMatcher()
	for path, want := range map[string][2]bool{
		"/user.slice":                     {false, true},
		"/kubepods/burstable/podab12":     {true, true},
		"/kubepods/burstable/podab12/ctr": {false, true},
	} {
		if m, b := match(path), below(path); m != want[0] || b != want[1] {
			t.Errorf("%s: match %v below %v, want %v", path, m, b, want)
		}
	}
}

// A Kubernetes target selects the cgroups whose path names a selected pod,
// in either of the kubelet's drivers' forms; its pods may change, and a
// Builder's remembered decisions go with a new Filter.Generation.
func TestPodTargets(t *testing.T) {
	const uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
	selected := map[string]bool{uid: true}
	gen := uint64(1)
	f := &Filter{Targets: []Target{{Pods: func(u string) bool { return selected[u] }}}, Generation: func() uint64 { return gen }}
	match, below, ok := f.CgroupMatcher()
	if !ok || f.PIDOnly() {
		t.Fatalf("pod targets: bounded by cgroups %v, pids only %v", ok, f.PIDOnly())
	}
	for path, want := range map[string]bool{
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-ab.scope": true,
		"/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/ab":                                                                    true,
		"/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5c/ab":                                                                    false, // another pod
		"/system.slice/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b":                                                                             false, // not below kubepods
		"/": false,
	} {
		if match(path) != want || !below(path) {
			t.Errorf("%s: match %v below %v, want %v and true", path, match(path), below(path), want)
		}
	}
	if !f.Match(ProcInfo{PID: 7, Cgroup: "/kubepods/pod" + uid + "/c"}) || f.Match(ProcInfo{PID: 8, Cgroup: "/user.slice"}) {
		t.Error("Match does not follow the pods")
	}

	// A process of another pod, under a /proc of the test's: left out,
	// and remembered; taken again when the pods change.
	proc := t.TempDir()
	const other = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
	dir := filepath.Join(proc, "42")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "comm"), []byte("app\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/kubepods/burstable/pod"+other+"/c\n"), 0o644)
	b := New(Options{Filter: f, ProcRoot: proc})
	if b.targeted(42) {
		t.Fatal("a process of a pod no target selects is targeted")
	}
	selected[other] = true
	if b.targeted(42) { // without a new generation the remembered answer stands
		t.Fatal("a remembered decision was taken again without a new generation")
	}
	gen++
	if !b.targeted(42) {
		t.Error("its pod selected and a new generation: still left out")
	}
	if len(b.left) != 0 {
		t.Errorf("decisions of the generation before not dropped once taken again: %v", b.left)
	}
}

// Issue 31: a decision read from /proc before an exec and remembered after
// its event had cleared the one before stood for the new image. Here the
// exec (a new comm, and its event) comes between targeted's read and its
// remembering: the new image is decided again.
func TestTargetedRacesExec(t *testing.T) {
	proc := t.TempDir()
	dir := filepath.Join(proc, "42")
	os.MkdirAll(dir, 0o755)
	comm := filepath.Join(dir, "comm")
	os.WriteFile(comm, []byte("launcher\n"), 0o644)
	b := New(Options{Filter: &Filter{Targets: []Target{{ProcessName: regexp.MustCompile("^app$")}}}, ProcRoot: proc})
	t.Cleanup(func() { afterMatchRead = nil })
	afterMatchRead = func(pid int) {
		afterMatchRead = nil
		os.WriteFile(comm, []byte("app\n"), 0o644)
		b.HandleEvent(sampler.Event{Pid: uint32(pid), Kind: sampler.ProcessExec})
	}
	if b.targeted(42) {
		t.Fatal("the launcher, read before its exec, is targeted")
	}
	if !b.targeted(42) {
		t.Error("after its exec into app: the launcher's decision stands")
	}
}

// A filter reads what its targets look at: a process name needs comm and
// the executable, not the cgroup file (the costliest of the three to read,
// for every new process off-CPU asks about); a cgroup target needs it.
func TestProcInfoReadsWhatTargetsUse(t *testing.T) {
	proc := t.TempDir()
	dir := filepath.Join(proc, "42")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "comm"), []byte("app\n"), 0o644)
	os.Symlink("/usr/bin/app", filepath.Join(dir, "exe"))
	os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/system.slice/app.service\n"), 0o644)
	byName, _ := CompileTarget(nil, "^app$", "")
	byCgroup, _ := CompileTarget(nil, "", "/system.slice/app.service")
	for _, c := range []struct {
		f    *Filter
		want ProcInfo
	}{
		{&Filter{Targets: []Target{byName}}, ProcInfo{PID: 42, Comm: "app", Exe: "/usr/bin/app"}},
		{&Filter{Targets: []Target{byCgroup}}, ProcInfo{PID: 42, Comm: "app", Cgroup: "/system.slice/app.service"}},
		{&Filter{Targets: []Target{byName, byCgroup}}, ProcInfo{PID: 42, Comm: "app", Exe: "/usr/bin/app", Cgroup: "/system.slice/app.service"}},
	} {
		got, ok := c.f.readProcInfo(proc, 42)
		if !ok || got != c.want {
			t.Errorf("read %+v (%v), want %+v", got, ok, c.want)
		}
		if !c.f.MatchPID(proc, 42) {
			t.Errorf("%+v: pid 42 not matched", c.want)
		}
	}
	if _, ok := (&Filter{Targets: []Target{byName}}).readProcInfo(proc, 43); ok {
		t.Error("a process that is not there was read")
	}
}
