package symboluploadprocessor

import (
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"

	"github.com/profsym/profsym/internal/testfixture"
	"github.com/profsym/profsym/processor/symboluploadprocessor/internal/metadata"
)

// loadConfig reads testdata/config.yaml's configuration of that name over
// the defaults, and validates it.
func loadConfig(t *testing.T, name string) (*Config, error) {
	cfg := createDefaultConfig()
	err := testfixture.LoadConfig(t, cfg, component.NewIDWithName(metadata.Type, name).String())
	return cfg, err
}

func TestLoadConfig(t *testing.T) {
	load := func(name string) (*Config, error) { return loadConfig(t, name) }
	def, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if ep, _ := def.endpoint(); !def.Enabled || ep != "http://localhost:8002" || def.MaxBandwidth != 4<<20 {
		t.Errorf("defaults: %+v (endpoint %s)", def, ep)
	}
	c, err := load("custom")
	if err != nil {
		t.Fatal(err)
	}
	if ep, _ := c.endpoint(); ep != "https://gateway.example:8443" || !c.ClientConfig.Auth.HasValue() ||
		len(c.Exclude) != 2 || c.MaxBandwidth != 1<<20 || c.MaxConcurrentUploads != 1 || c.QueryInterval != 10*time.Second ||
		c.Retry.MaxInterval != time.Minute || c.Compression != "zlib" || len(c.DebugDirectories) != 2 {
		t.Errorf("custom: %+v", c)
	}
	d, err := load("derived")
	if err != nil {
		t.Fatal(err)
	}
	if ep, _ := d.endpoint(); ep != "http://gateway.profsym.svc:8002" {
		t.Errorf("derived endpoint %s", ep)
	}
	if off, err := load("off"); err != nil || off.Enabled {
		t.Errorf("off: %v %v", off, err)
	}
}

// Each bad configuration fails with the errors it should, and only those.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"bad", []string{`endpoint: "ftp://x" is not an http(s) URL`, `compression: "lz4" is not zstd, zlib or none`}},
		{"badbandwidth", []string{"max_bandwidth must not be negative"}},
		{"badretry", []string{"(max_interval >= initial_interval)"}},
		{"badexclude", []string{"exclude: empty pattern"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(t, tc.name)
			testfixture.WantErrors(t, err, tc.want...)
		})
	}
}
