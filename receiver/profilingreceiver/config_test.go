package profilingreceiver

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	custom := createDefaultConfig()
	custom.SampleRate, custom.MaxStackDepth, custom.ReportInterval = 49, 64, 30*time.Second
	custom.KernelStacks, custom.KernelSymbols, custom.PerfMaps = false, false, false
	custom.Targets = []TargetConfig{
		{PIDs: []int{1, 42}},
		{ProcessName: "^(java|node)$"},
		{Cgroup: "/system.slice/", ProcessName: "nginx"},
	}
	custom.Selection = SelectionConfig{MaxCgroups: 64, RescanInterval: 5 * time.Second}
	custom.Unwinding = UnwindingConfig{Mode: "frame_pointers", MaxTableBytes: 16 << 20, MaxMappings: 8192, MaxProcesses: 2048, StackCopyBytes: 4096, MaxStackWords: 256}
	custom.OffCPU = OffCPUConfig{
		Enabled: true, Probability: 0.01, UninterruptibleProbability: 0.25, PreemptedProbability: 0.5, MinWait: time.Millisecond, MaxWaits: 4096, MaxStacks: 1024,
		Targets: []TargetConfig{{ProcessName: "^java$"}}, Wall: true,
	}
	for _, tt := range []struct {
		id   component.ID
		want *Config
	}{
		{component.NewID(metadata.Type), createDefaultConfig()},
		{component.NewIDWithName(metadata.Type, "custom"), custom},
	} {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg := NewFactory().CreateDefaultConfig()
			sub, err := cm.Sub(tt.id.String())
			if err != nil {
				t.Fatal(err)
			}
			if err := sub.Unmarshal(cfg); err != nil {
				t.Fatal(err)
			}
			got := cfg.(*Config)
			if got.OffCPU.Enabled {
				got.Unwinding.Mode = "auto" // off_cpu needs it; Validate says so below
				if err := got.Validate(); err != nil {
					t.Fatal(err)
				}
				got.Unwinding.Mode = "frame_pointers"
				if err := got.Validate(); err == nil || !strings.Contains(err.Error(), "off_cpu needs unwinding.mode auto") {
					t.Fatalf("off_cpu with frame pointers: %v", err)
				}
			} else if err := got.Validate(); err != nil {
				t.Fatal(err)
			}
			if got.SampleRate != tt.want.SampleRate || got.MaxStackDepth != tt.want.MaxStackDepth ||
				got.ReportInterval != tt.want.ReportInterval || got.KernelStacks != tt.want.KernelStacks ||
				got.KernelSymbols != tt.want.KernelSymbols || got.PerfMaps != tt.want.PerfMaps ||
				len(got.Targets) != len(tt.want.Targets) || got.Unwinding != tt.want.Unwinding || got.Selection != tt.want.Selection ||
				got.OffCPU.Enabled != tt.want.OffCPU.Enabled || got.OffCPU.Probability != tt.want.OffCPU.Probability ||
				got.OffCPU.UninterruptibleProbability != tt.want.OffCPU.UninterruptibleProbability ||
				got.OffCPU.PreemptedProbability != tt.want.OffCPU.PreemptedProbability ||
				got.OffCPU.MinWait != tt.want.OffCPU.MinWait || got.OffCPU.MaxWaits != tt.want.OffCPU.MaxWaits ||
				got.OffCPU.MaxStacks != tt.want.OffCPU.MaxStacks || len(got.OffCPU.Targets) != len(tt.want.OffCPU.Targets) ||
				got.OffCPU.Wall != tt.want.OffCPU.Wall {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"rate", func(c *Config) { c.SampleRate = 0 }, "sample_rate"},
		{"rate high", func(c *Config) { c.SampleRate = 5000 }, "sample_rate"},
		{"depth", func(c *Config) { c.MaxStackDepth = 128 }, "max_stack_depth"},
		{"interval", func(c *Config) { c.ReportInterval = time.Millisecond }, "report_interval"},
		{"empty target", func(c *Config) { c.Targets = []TargetConfig{{}} }, "targets[0]"},
		{"bad pid", func(c *Config) { c.Targets = []TargetConfig{{PIDs: []int{-1}}} }, "targets[0].pids"},
		{"bad regexp", func(c *Config) { c.Targets = []TargetConfig{{ProcessName: "("}} }, "targets[0].process_name"},
		{"bad cgroup", func(c *Config) { c.Targets = []TargetConfig{{Cgroup: "["}} }, "targets[0].cgroup"},
		{"bad pod_labels", func(c *Config) {
			c.Targets = []TargetConfig{{Kubernetes: &KubernetesTargetConfig{PodLabels: "app in (a"}}}
		}, "targets[0].kubernetes.pod_labels"},
		{"long pod_labels", func(c *Config) {
			c.Targets = []TargetConfig{{Kubernetes: &KubernetesTargetConfig{PodLabels: "app=" + strings.Repeat("a", 5000)}}}
		}, "targets[0].kubernetes.pod_labels"},
		{"bad namespace_labels", func(c *Config) {
			c.Targets = []TargetConfig{{Kubernetes: &KubernetesTargetConfig{NamespaceLabels: "team notin"}}}
		}, "targets[0].kubernetes.namespace_labels"},
		{"long namespace_labels", func(c *Config) {
			c.Targets = []TargetConfig{{Kubernetes: &KubernetesTargetConfig{NamespaceLabels: "team=" + strings.Repeat("a", 5000)}}}
		}, "targets[0].kubernetes.namespace_labels"},
		{"empty namespace", func(c *Config) {
			c.OffCPU.Enabled = true
			c.OffCPU.Targets = []TargetConfig{{Kubernetes: &KubernetesTargetConfig{Namespaces: []string{""}}}}
		}, "off_cpu.targets[0].kubernetes.namespaces"},
		{"auth_type", func(c *Config) { c.Kubernetes.AuthType = "token" }, "kubernetes.auth_type"},
		{"sync_timeout", func(c *Config) { c.Kubernetes.SyncTimeout = 0 }, "kubernetes.sync_timeout"},
		{"max_cgroups", func(c *Config) { c.Selection.MaxCgroups = 0 }, "selection.max_cgroups"},
		{"max_cgroups high", func(c *Config) { c.Selection.MaxCgroups = 1 << 20 }, "selection.max_cgroups"},
		{"rescan_interval", func(c *Config) { c.Selection.RescanInterval = time.Millisecond }, "selection.rescan_interval"},
		{"name_interval", func(c *Config) { c.Interpreters.NameInterval = time.Millisecond }, "interpreters.name_interval"},
		{"unwinding mode", func(c *Config) { c.Unwinding.Mode = "dwarf" }, "unwinding mode"},
		{"table bytes", func(c *Config) { c.Unwinding.MaxTableBytes = 1000 }, "max_table_bytes"},
		{"stack words", func(c *Config) { c.Unwinding.MaxStackWords = 257 }, "max_stack_words"},
		{"few stack words", func(c *Config) { c.Unwinding.MaxStackWords = 8 }, "max_stack_words"},
		{"mappings", func(c *Config) { c.Unwinding.MaxMappings = 10 }, "max_mappings"},
		{"off_cpu probability", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.Probability = true, 0 }, "probability"},
		{"off_cpu probability high", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.Probability = true, 1.5 }, "probability"},
		{"off_cpu uninterruptible", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.UninterruptibleProbability = true, 0 }, "uninterruptible_probability"},
		{"off_cpu preempted", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.PreemptedProbability = true, 1.5 }, "preempted_probability"},
		{"off_cpu min_wait", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.MinWait = true, -time.Second }, "min_wait"},
		{"off_cpu max_waits", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.MaxWaits = true, 1 }, "max_waits"},
		{"off_cpu max_stacks", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.MaxStacks = true, 0 }, "max_stacks"},
		{"off_cpu targets", func(c *Config) { c.OffCPU.Enabled, c.OffCPU.Targets = true, []TargetConfig{{}} }, "off_cpu.targets[0]"},
		{"off_cpu frame pointers", func(c *Config) { c.OffCPU.Enabled, c.Unwinding.Mode = true, "frame_pointers" }, "off_cpu needs"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := createDefaultConfig()
			tt.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error about %s", err, tt.want)
			}
		})
	}
	if err := createDefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
}
