package profbuild

import "testing"

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
