package symbolstoreextension

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configopaque"

	"github.com/profsym/profsym/internal/symstore"
)

// DefaultEndpoint is where the store listens unless configured: the
// debuginfod port, on loopback.
const DefaultEndpoint = "localhost:8002"

// Config is the symbol store's configuration; docs/configuration.md
// describes every key.
type Config struct {
	// ServerConfig is the HTTP server: endpoint, tls, auth (an
	// authenticator extension such as bearertokenauth), timeouts.
	// A named field: embedding would promote ServerConfig's own Unmarshal
	// and leave every other key unread.
	ServerConfig confighttp.ServerConfig `mapstructure:",squash"`
	// Storage is where files are kept.
	Storage StorageConfig `mapstructure:"storage"`
	// MaxUploadSize refuses larger uploads (413).
	MaxUploadSize int64 `mapstructure:"max_upload_size"`
	// LeaseDuration is how long an agent told to upload an id holds it.
	LeaseDuration time.Duration `mapstructure:"lease_duration"`
	// MaxQueryIDs bounds the ids in one missing query.
	MaxQueryIDs int `mapstructure:"max_query_ids"`
	// MaxConcurrentUploads bounds uploads received at once (and so the
	// scratch disk: this many times max_upload_size); more get 503.
	MaxConcurrentUploads int `mapstructure:"max_concurrent_uploads"`
}

// StorageConfig selects the backend: a directory (default) or, when
// s3.bucket is set, an S3-compatible bucket.
type StorageConfig struct {
	Directory string   `mapstructure:"directory"`
	S3        S3Config `mapstructure:"s3"`
	// ScratchDirectory spools uploads while they are verified and keeps
	// local copies of S3 objects for in-process symbolization.
	ScratchDirectory string `mapstructure:"scratch_directory"`
	// CacheMaxBytes bounds those local copies.
	CacheMaxBytes int64 `mapstructure:"cache_max_bytes"`
	// Rescan relists a shared bucket this often.
	Rescan time.Duration `mapstructure:"rescan"`
}

// S3Config configures the S3-compatible backend.
type S3Config struct {
	Endpoint        string              `mapstructure:"endpoint"`
	Bucket          string              `mapstructure:"bucket"`
	Prefix          string              `mapstructure:"prefix"`
	Region          string              `mapstructure:"region"`
	AccessKeyID     string              `mapstructure:"access_key_id"`
	SecretAccessKey configopaque.String `mapstructure:"secret_access_key"`
	// Insecure uses plain http to the object store.
	Insecure     bool `mapstructure:"insecure"`
	CreateBucket bool `mapstructure:"create_bucket"`
}

func createDefaultConfig() *Config {
	sc := confighttp.NewDefaultServerConfig()
	sc.NetAddr.Endpoint = DefaultEndpoint
	sc.MaxRequestBodySize = 0 // follows max_upload_size
	// A throttled 1 GiB upload takes many minutes; the body is bounded by
	// size instead, and headers by read_header_timeout.
	sc.WriteTimeout = time.Hour
	return &Config{
		ServerConfig: sc,
		Storage: StorageConfig{
			Directory:     "./out/symbols",
			CacheMaxBytes: symstore.DefaultCacheBytes,
			Rescan:        symstore.DefaultRescan,
		},
		MaxUploadSize: symstore.DefaultMaxUploadBytes,
		LeaseDuration: symstore.DefaultLease,
		MaxQueryIDs:   symstore.DefaultMaxQueryIDs,

		MaxConcurrentUploads: symstore.DefaultMaxUploads,
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.ServerConfig.NetAddr.Endpoint == "" {
		errs = append(errs, errors.New("endpoint: required (host:port)"))
	}
	if c.Storage.S3.Bucket == "" && c.Storage.Directory == "" {
		errs = append(errs, errors.New("storage: set directory or s3.bucket"))
	}
	if s3 := c.Storage.S3; s3.Bucket != "" && s3.Endpoint == "" {
		errs = append(errs, errors.New("storage.s3.endpoint: required with a bucket"))
	}
	if c.MaxUploadSize <= 0 {
		errs = append(errs, fmt.Errorf("max_upload_size: %d must be positive", c.MaxUploadSize))
	}
	if c.LeaseDuration <= 0 || c.MaxQueryIDs <= 0 || c.MaxConcurrentUploads <= 0 || c.Storage.CacheMaxBytes < 0 || c.Storage.Rescan < 0 {
		errs = append(errs, errors.New("lease_duration and max_query_ids must be positive; cache_max_bytes and rescan not negative"))
	}
	return errors.Join(errs...)
}
