package symbolizationprocessor

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	custom := createDefaultConfig()
	custom.Sources = []string{"proc", "local", "debug_directories", "symbol_directories", "symbol_store", "debuginfod", "kernel"}
	custom.Local = LocalConfig{Root: "/host"}
	custom.DebugDirectories = []string{"/usr/lib/debug", "/opt/debug"}
	custom.SymbolDirectories = []string{"/srv/symbols"}
	custom.SymbolDirectoriesRescan = 5 * time.Second
	d := &custom.Debuginfod
	d.URLs = []string{"https://debuginfod.example.org", "http://127.0.0.1:8002"}
	d.Timeout, d.CacheDir, d.MaxCacheBytes, d.MaxParallel, d.NegativeTTL = 3*time.Second, "/var/cache/profsym", 1<<30, 2, time.Minute
	d.MaxFileBytes, d.MaxDownloadTime = 512<<20, 2*time.Minute
	custom.Demangle, custom.InlineFrames, custom.LineNumbers = "none", false, false
	custom.Timeout, custom.FetchWait, custom.NegativeTTL = 2*time.Second, 250*time.Millisecond, 30*time.Second
	custom.Cache = CacheConfig{MaxBytes: 256 << 20, MaxEntries: 100000, MaxResultBytes: 64 << 20, MaxObjects: 4096,
		MaxDemangled: 1000, MaxDemangledBytes: 1 << 20}
	custom.Limits = LimitsConfig{MaxNameBytes: 1024, MaxAttributeBytes: 16384, MaxFramesJSONBytes: 65536, MaxLogFrames: 256,
		MaxFileBytes: 2 << 30, MaxDecompressedBytes: 256 << 20, MaxIndexedFiles: 10000}
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
			if err := cfg.(*Config).Validate(); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg, tt.want) {
				t.Errorf("got  %+v\nwant %+v", cfg, tt.want)
			}
		})
	}
}

// Every default is safe: bounded caches and limits, sources in order.
func TestDefaultsAreBounded(t *testing.T) {
	c := createDefaultConfig()
	if c.Cache.MaxBytes <= 0 || c.Cache.MaxEntries <= 0 || c.Cache.MaxResultBytes <= 0 || c.Cache.MaxObjects <= 0 ||
		c.Cache.MaxDemangled <= 0 || c.Cache.MaxDemangledBytes <= 0 {
		t.Errorf("unbounded cache default: %+v", c.Cache)
	}
	l := c.Limits
	if l.MaxNameBytes <= 0 || l.MaxAttributeBytes <= 0 || l.MaxFramesJSONBytes <= 0 || l.MaxLogFrames <= 0 ||
		l.MaxFileBytes <= 0 || l.MaxDecompressedBytes <= 0 || l.MaxIndexedFiles <= 0 || c.Timeout <= 0 || c.FetchWait <= 0 || c.FetchWait >= c.Timeout || c.NegativeTTL <= 0 || c.SymbolDirectoriesRescan <= 0 {
		t.Errorf("unbounded limit default: %+v", c)
	}
	if c.Sources[0] != "proc" || c.Sources[len(c.Sources)-1] != "kernel" {
		t.Errorf("default order %v", c.Sources)
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown source", func(c *Config) { c.Sources = []string{"local", "ftp"} }, `unknown source "ftp"`},
		{"duplicate source", func(c *Config) { c.Sources = []string{"local", "local"} }, "listed twice"},
		{"no source", func(c *Config) { c.Sources = nil }, "at least one source"},
		{"demangle", func(c *Config) { c.Demangle = "some" }, "demangle"},
		{"url", func(c *Config) { c.Debuginfod.URLs = []string{"ftp://x"} }, "not an http(s) URL"},
		{"negative ttl", func(c *Config) { c.NegativeTTL = -time.Second }, "must not be negative"},
		{"negative rescan", func(c *Config) { c.SymbolDirectoriesRescan = -1 }, "must not be negative"},
		{"negative fetch wait", func(c *Config) { c.FetchWait = -time.Millisecond }, "fetch_wait"},
		{"negative cache", func(c *Config) { c.Cache.MaxResultBytes = -1 }, "cache bounds"},
		{"negative limit", func(c *Config) { c.Limits.MaxFileBytes = -1 }, "limits must not be negative"},
		{"tiny names", func(c *Config) { c.Limits.MaxNameBytes = 3 }, "max_name_bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := createDefaultConfig()
			tt.edit(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
	if err := createDefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}
