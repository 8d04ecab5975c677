package symboluploadprocessor

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/confmap"

	"github.com/profsym/profsym/internal/host/symupload"
)

// DefaultStorePort is the port of the gateway's symbol store when the
// endpoint is derived from gateway_endpoint.
const DefaultStorePort = "8002"

// Config is the symbol upload processor's configuration; docs/configuration.md
// describes every key.
type Config struct {
	// Enabled turns uploading off with one key; profiles pass through
	// either way.
	Enabled bool `mapstructure:"enabled"`
	// ClientConfig is the HTTP client to the store: endpoint (a URL such as
	// http://gateway:8002), tls, auth (bearertokenauth), headers.
	ClientConfig confighttp.ClientConfig `mapstructure:",squash"`
	// GatewayEndpoint (host:port of the gateway's OTLP receiver) derives the
	// endpoint http://HOST:8002 when endpoint is empty.
	GatewayEndpoint string `mapstructure:"gateway_endpoint"`
	// DebugDirectories are searched for separate debug files by build id,
	// besides each process's own /usr/lib/debug and .gnu_debuglink.
	DebugDirectories []string `mapstructure:"debug_directories"`
	// Exclude are path globs never uploaded ("/opt/secret/**", "*.so.*").
	Exclude []string `mapstructure:"exclude"`
	// MaxBandwidth bounds the upload rate in bytes per second (0: unlimited).
	MaxBandwidth int64 `mapstructure:"max_bandwidth"`
	// MaxConcurrentUploads bounds uploads in flight.
	MaxConcurrentUploads int `mapstructure:"max_concurrent_uploads"`
	// MaxFileSize skips files with symbols larger than this.
	MaxFileSize int64 `mapstructure:"max_file_size"`
	// QueryInterval is how often new build ids are asked about, in one
	// batched query.
	QueryInterval time.Duration `mapstructure:"query_interval"`
	Retry         RetryConfig   `mapstructure:"retry"`
	// Compression of the uploaded DWARF: zstd or zlib.
	Compression string `mapstructure:"compression"`
	// ScratchDirectory holds extracted files while they upload.
	ScratchDirectory string `mapstructure:"scratch_directory"`
}

// RetryConfig is the backoff of failed queries and uploads.
type RetryConfig struct {
	InitialInterval time.Duration `mapstructure:"initial_interval"`
	MaxInterval     time.Duration `mapstructure:"max_interval"`
}

func createDefaultConfig() *Config {
	cc := confighttp.NewDefaultClientConfig()
	cc.Timeout = 0 // uploads are bounded per file by size and rate
	return &Config{
		Enabled:              true,
		GatewayEndpoint:      "localhost:4317",
		ClientConfig:         cc,
		DebugDirectories:     []string{"/usr/lib/debug"},
		MaxBandwidth:         4 << 20,
		MaxConcurrentUploads: symupload.DefaultMaxConcurrent,
		MaxFileSize:          symupload.DefaultMaxFileBytes,
		QueryInterval:        symupload.DefaultQueryInterval,
		Retry: RetryConfig{
			InitialInterval: symupload.DefaultInitialBackoff,
			MaxInterval:     symupload.DefaultMaxBackoff,
		},
		Compression: "zstd",
	}
}

// endpoint returns the store's URL: the configured one, or one derived
// from the gateway endpoint.
func (c *Config) endpoint() (string, error) {
	if c.ClientConfig.Endpoint != "" {
		return c.ClientConfig.Endpoint, nil
	}
	if c.GatewayEndpoint == "" {
		return "", errors.New("endpoint: set endpoint (http://gateway:8002) or gateway_endpoint")
	}
	host, _, err := net.SplitHostPort(c.GatewayEndpoint)
	if err != nil {
		return "", fmt.Errorf("gateway_endpoint %q: %w", c.GatewayEndpoint, err)
	}
	return "http://" + net.JoinHostPort(host, DefaultStorePort), nil
}

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if ep, err := c.endpoint(); err != nil {
		errs = append(errs, err)
	} else if u, err := url.Parse(ep); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("endpoint: %q is not an http(s) URL", ep))
	}
	switch c.Compression {
	case "zstd", "zlib", "none":
	default:
		errs = append(errs, fmt.Errorf("compression: %q is not zstd, zlib or none", c.Compression))
	}
	if c.MaxBandwidth < 0 || c.MaxConcurrentUploads <= 0 || c.MaxFileSize <= 0 || c.QueryInterval <= 0 ||
		c.Retry.InitialInterval <= 0 || c.Retry.MaxInterval < c.Retry.InitialInterval {
		errs = append(errs, errors.New("max_bandwidth must not be negative; max_concurrent_uploads, max_file_size, query_interval and retry intervals must be positive (max_interval >= initial_interval)"))
	}
	for _, g := range c.Exclude {
		if g == "" {
			errs = append(errs, errors.New("exclude: empty pattern"))
		}
	}
	return errors.Join(errs...)
}
