package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/confmap"
)

// Defaults.
const (
	DefaultEndpoint         = "localhost:4040"
	DefaultDatadogPath      = "/profiling/v1/input"
	DefaultPyroscopePath    = "/ingest"
	DefaultMaxBodySize      = 64 << 20  // bytes of one request as sent (compressed)
	DefaultMaxRecordingSize = 512 << 20 // bytes of one recording once decompressed
	DefaultReadTimeout      = time.Minute
)

// Config configures the jfr receiver. See docs/configuration.md.
type Config struct {
	// ServerConfig is the HTTP server: endpoint, TLS, auth,
	// max_request_body_size (bounds what is read from the network, after
	// any Content-Encoding is undone), timeouts.
	confighttp.ServerConfig `mapstructure:",squash"`
	// Datadog is the Datadog profiling intake (dd-trace-java and any
	// client of the Datadog agent's /profiling/v1/input).
	Datadog IntakeConfig `mapstructure:"datadog"`
	// Pyroscope is Pyroscope's ingest endpoint (format=jfr).
	Pyroscope IntakeConfig `mapstructure:"pyroscope"`
	// MaxRecordingSize bounds one recording after decompression (gzip,
	// zstd, lz4 parts); larger ones, and bombs, get 413.
	MaxRecordingSize int64 `mapstructure:"max_recording_size"`
	// MaxChunkSize bounds one JFR chunk held in memory while it is read.
	MaxChunkSize int64 `mapstructure:"max_chunk_size"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// IntakeConfig enables one intake at a path.
type IntakeConfig struct {
	Enabled bool   `mapstructure:"enabled"`
	Path    string `mapstructure:"path"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	sc := confighttp.NewDefaultServerConfig()
	sc.NetAddr.Endpoint = DefaultEndpoint
	sc.MaxRequestBodySize = DefaultMaxBodySize
	// An upload holds one of the few conversion slots while its body
	// arrives: a client that trickles bytes must not hold it forever.
	sc.ReadTimeout = DefaultReadTimeout
	return &Config{
		ServerConfig:     sc,
		Datadog:          IntakeConfig{Enabled: true, Path: DefaultDatadogPath},
		Pyroscope:        IntakeConfig{Enabled: true, Path: DefaultPyroscopePath},
		MaxRecordingSize: DefaultMaxRecordingSize,
		MaxChunkSize:     DefaultMaxRecordingSize,
	}
}

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if !c.Datadog.Enabled && !c.Pyroscope.Enabled {
		errs = append(errs, errors.New("enable at least one of datadog and pyroscope"))
	}
	for name, in := range map[string]IntakeConfig{"datadog": c.Datadog, "pyroscope": c.Pyroscope} {
		if in.Enabled && !strings.HasPrefix(in.Path, "/") {
			errs = append(errs, fmt.Errorf("%s.path must start with /, got %q", name, in.Path))
		}
	}
	if c.Datadog.Enabled && c.Pyroscope.Enabled && c.Datadog.Path == c.Pyroscope.Path {
		errs = append(errs, fmt.Errorf("datadog.path and pyroscope.path are both %q", c.Datadog.Path))
	}
	if c.MaxRecordingSize <= 0 {
		errs = append(errs, fmt.Errorf("max_recording_size must be positive, got %d", c.MaxRecordingSize))
	}
	if c.MaxChunkSize <= 0 {
		errs = append(errs, fmt.Errorf("max_chunk_size must be positive, got %d", c.MaxChunkSize))
	}
	if c.MaxRequestBodySize < 0 {
		errs = append(errs, fmt.Errorf("max_request_body_size must not be negative, got %d", c.MaxRequestBodySize))
	}
	return errors.Join(errs...)
}

// Unmarshal decodes the HTTP server's settings with confighttp's own
// Unmarshal (which the embedded struct would otherwise apply to the whole
// configuration) and the receiver's with confmap.
func (c *Config) Unmarshal(conf *confmap.Conf) error {
	// Both halves ignore keys they do not know, so unknown keys (typos)
	// are caught here, as the collector catches them everywhere else.
	known := map[string]bool{}
	mapstructureKeys(reflect.TypeOf(*c), known)
	for k := range conf.ToStringMap() {
		if !known[k] {
			return fmt.Errorf("'' has invalid keys: %s", k)
		}
	}
	if err := c.ServerConfig.Unmarshal(conf); err != nil {
		return err
	}
	own := struct {
		Datadog          IntakeConfig `mapstructure:"datadog"`
		Pyroscope        IntakeConfig `mapstructure:"pyroscope"`
		MaxRecordingSize int64        `mapstructure:"max_recording_size"`
		MaxChunkSize     int64        `mapstructure:"max_chunk_size"`
	}{c.Datadog, c.Pyroscope, c.MaxRecordingSize, c.MaxChunkSize}
	if err := conf.Unmarshal(&own, confmap.WithIgnoreUnused()); err != nil {
		return err
	}
	c.Datadog, c.Pyroscope, c.MaxRecordingSize, c.MaxChunkSize = own.Datadog, own.Pyroscope, own.MaxRecordingSize, own.MaxChunkSize
	return nil
}

// mapstructureKeys collects the top-level keys a struct decodes, following
// squashed fields.
func mapstructureKeys(t reflect.Type, into map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
		switch {
		case strings.Contains(opts, "squash") && f.Type.Kind() == reflect.Struct:
			mapstructureKeys(f.Type, into)
		case name != "" && name != "-":
			into[name] = true
		}
	}
}
