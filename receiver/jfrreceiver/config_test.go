package jfrreceiver

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/profsym/profsym/internal/testfixture"
)

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want func(*Config) // the defaults it changes
		errs []string      // or the errors it must fail with
	}{
		{id: "jfr", want: func(c *Config) {}},
		{id: "jfr/custom", want: func(c *Config) {
			c.NetAddr.Endpoint = "0.0.0.0:8126"
			c.MaxRequestBodySize = 1 << 20
			c.MaxRecordingSize = 8 << 20
			c.Pyroscope.Enabled = false
		}},
		{id: "jfr/nothing", errs: []string{"enable at least one of datadog and pyroscope"}},
		{id: "jfr/typo", errs: []string{"invalid keys: max_recording_sise"}},
		{id: "jfr/badpath", errs: []string{`datadog.path must start with /, got "profiling"`}},
		{id: "jfr/samepath", errs: []string{`datadog.path and pyroscope.path are both "/in"`}},
		{id: "jfr/badsizes", errs: []string{
			"max_recording_size must be positive, got 0",
			"max_chunk_size must be positive, got -1",
			"max_request_body_size must not be negative, got -1",
		}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			cfg := createDefaultConfig()
			err := testfixture.LoadConfig(t, cfg, tc.id)
			if tc.errs != nil {
				testfixture.WantErrors(t, err, tc.errs...)
				return
			}
			require.NoError(t, err)
			want := createDefaultConfig()
			tc.want(want)
			require.Equal(t, want, cfg)
		})
	}
}
