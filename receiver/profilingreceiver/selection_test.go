package profilingreceiver

import (
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadata"
)

func TestCgroupPath(t *testing.T) {
	for in, want := range map[string]string{
		"/sys/fs/cgroup/system.slice/x.service":         "/system.slice/x.service",
		"/sys/fs/cgroup/unified/system.slice/x.service": "/system.slice/x.service",
		"/sys/fs/cgroup":             "/",
		"/sys/fs/cgroupx/a":          "/sys/fs/cgroupx/a",
		"/kubepods.slice/":           "/kubepods.slice/",
		"/kubepods/.*/pod[0-9a-f-]+": "/kubepods/.*/pod[0-9a-f-]+",
	} {
		if got := cgroupPath(in); got != want {
			t.Errorf("cgroupPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// Which targets are selected in the kernel, and what the log says when
// they cannot be.
func TestCgroupSelectionDecision(t *testing.T) {
	v2 := filepath.Join(t.TempDir(), "v2")
	os.WriteFile(v2, []byte("41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"), 0o644)
	v1 := filepath.Join(t.TempDir(), "v1")
	os.WriteFile(v1, []byte("35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"), 0o644)
	defer func(m string) { mountinfo = m }(mountinfo)
	for _, tt := range []struct {
		name      string
		targets   []TargetConfig
		mountinfo string
		kernel    bool
		log       string
	}{
		{"no targets", nil, v2, false, ""},
		{"cgroups", []TargetConfig{{Cgroup: "/a"}, {Cgroup: "/b", ProcessName: "x"}}, v2, true, ""},
		{"a target without cgroup", []TargetConfig{{Cgroup: "/a"}, {PIDs: []int{1}}}, v2, false, "a target names no cgroup"},
		{"cgroup v1", []TargetConfig{{Cgroup: "/a"}}, v1, false, "no cgroup v2 hierarchy (a cgroup v1 host)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mountinfo = tt.mountinfo
			cfg := createDefaultConfig()
			cfg.Targets = tt.targets
			core, logs := observer.New(zap.InfoLevel)
			set := receivertest.NewNopSettings(metadata.Type)
			set.Logger = zap.New(core)
			r, err := newReceiver(cfg, set)
			if err != nil {
				t.Fatal(err)
			}
			sel := r.cgroupSelection()
			if (sel != nil) != tt.kernel {
				t.Fatalf("selection in the kernel: %v, want %v", sel != nil, tt.kernel)
			}
			if sel != nil {
				m := sel.m
				if !m.Match("/a/x") || !m.Match("/b") || m.Match("/c") {
					t.Errorf("match: /a/x %v, /b %v, /c %v", m.Match("/a/x"), m.Match("/b"), m.Match("/c"))
				}
			}
			if tt.log == "" {
				if logs.Len() != 0 {
					t.Errorf("logged %v", logs.All())
				}
				return
			}
			if logs.FilterMessageSnippet(tt.log).Len() != 1 {
				t.Errorf("no log line %q in %v", tt.log, logs.All())
			}
		})
	}
}
