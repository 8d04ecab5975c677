package symbolstoreextension

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/confmap"

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
	// MaxStoredBytes and MaxObjects bound what uploads may fill (the disk or
	// bucket, and the index of ids kept in memory): past them uploads get
	// 507 and agents retry later. Nothing is evicted.
	MaxStoredBytes int64 `mapstructure:"max_stored_bytes"`
	MaxObjects     int64 `mapstructure:"max_objects"`
	// MaxIndexBytes bounds one symbol index, the compiled debug info a
	// gateway stores for the others: a larger one is neither stored nor
	// fetched into the scratch cache.
	MaxIndexBytes int64 `mapstructure:"max_index_bytes"`
	// AllowUnauthenticatedUploads lets a store listening beyond loopback
	// without auth take uploads (and upload leases) from anyone who reaches
	// it. Off: such a store serves reads and refuses writes with 401, as
	// accepted symbols name every gateway's frames.
	AllowUnauthenticatedUploads bool `mapstructure:"allow_unauthenticated_uploads"`
}

// StorageConfig selects the backend: a directory (default); an
// S3-compatible bucket when s3.bucket is set; or, when remote.endpoint is
// set, another profsym symbol store read over HTTP.
type StorageConfig struct {
	Directory string   `mapstructure:"directory"`
	S3        S3Config `mapstructure:"s3"`
	// Remote reads the store another collector serves (one process owning
	// the files, such as the Helm chart's symbols StatefulSet): the
	// symbolization processor of this collector reads it in process, and
	// this extension then serves no HTTP itself (agents upload to the
	// owner). Symbol indexes are shared through the owner as in every
	// mode: leased from it, stored in it and read back from it, with this
	// client's auth (the owner takes them as it takes uploads). Its
	// generation is polled every rescan.
	Remote RemoteConfig `mapstructure:"remote"`
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

// RemoteConfig is the HTTP client to the owner store: endpoint (a URL such
// as http://profsym-symbols:8002), tls, auth (bearertokenauth), headers.
type RemoteConfig struct {
	ClientConfig confighttp.ClientConfig `mapstructure:",squash"`
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
			Remote:        RemoteConfig{ClientConfig: remoteClientDefaults()},
			CacheMaxBytes: symstore.DefaultCacheBytes,
			Rescan:        symstore.DefaultRescan,
		},
		MaxUploadSize: symstore.DefaultMaxUploadBytes,
		LeaseDuration: symstore.DefaultLease,
		MaxQueryIDs:   symstore.DefaultMaxQueryIDs,

		MaxConcurrentUploads: symstore.DefaultMaxUploads,
		MaxStoredBytes:       symstore.DefaultMaxStoredBytes,
		MaxObjects:           symstore.DefaultMaxObjects,
		MaxIndexBytes:        symstore.DefaultMaxIndexBytes,
	}
}

// remoteClientDefaults: no overall timeout (whole files are bounded by
// the store's fetch timeout, requests for metadata by their own).
func remoteClientDefaults() confighttp.ClientConfig {
	cc := confighttp.NewDefaultClientConfig()
	cc.Timeout = 0
	return cc
}

// remote reports whether the store reads another over HTTP.
func (c *Config) remote() bool { return c.Storage.Remote.ClientConfig.Endpoint != "" }

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.ServerConfig.NetAddr.Endpoint == "" && !c.remote() {
		errs = append(errs, errors.New("endpoint: required (host:port)"))
	}
	if ep := c.Storage.Remote.ClientConfig.Endpoint; ep != "" {
		if u, err := url.Parse(ep); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("storage.remote.endpoint: %q is not an http(s) URL", ep))
		}
		if c.Storage.S3.Bucket != "" {
			errs = append(errs, errors.New("storage: set remote.endpoint or s3.bucket, not both"))
		}
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
	if c.MaxIndexBytes <= 0 {
		errs = append(errs, fmt.Errorf("max_index_bytes: %d must be positive", c.MaxIndexBytes))
	}
	if c.MaxStoredBytes <= 0 || c.MaxObjects <= 0 {
		errs = append(errs, errors.New("max_stored_bytes and max_objects must be positive"))
	}
	if c.LeaseDuration <= 0 || c.MaxQueryIDs <= 0 || c.MaxConcurrentUploads <= 0 || c.Storage.CacheMaxBytes < 0 || c.Storage.Rescan < 0 {
		errs = append(errs, errors.New("lease_duration and max_query_ids must be positive; cache_max_bytes and rescan not negative"))
	}
	return errors.Join(errs...)
}
