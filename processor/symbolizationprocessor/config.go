package symbolizationprocessor

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"

	"github.com/profsym/profsym/internal/otlp/otlpsym"
)

// Config is the symbolization processor's configuration; every key is
// described in docs/configuration.md.
type Config struct {
	// Sources are tried in this order for each binary.
	Sources []string `mapstructure:"sources"`
	// Local reads the mapping's file on this host, used only when its
	// identity matches.
	Local LocalConfig `mapstructure:"local"`
	// DebugDirectories are .build-id trees (ab/cdef....debug).
	DebugDirectories []string `mapstructure:"debug_directories"`
	// SymbolDirectories are folders of binaries and debug files under any
	// name, indexed by build id at start and when a lookup misses.
	SymbolDirectories []string `mapstructure:"symbol_directories"`
	// Debuginfod fetches debug files by build id.
	Debuginfod DebuginfodConfig `mapstructure:"debuginfod"`
	// SymbolStore names a symbolstore extension of this collector, read in
	// process by the symbol_store source (empty: none).
	SymbolStore component.ID `mapstructure:"symbol_store"`
	// Demangle is "full" (C++ and Rust names demangled) or "none".
	Demangle string `mapstructure:"demangle"`
	// InlineFrames adds a line per inlined call.
	InlineFrames bool `mapstructure:"inline_frames"`
	// LineNumbers keeps line and column numbers (file names are kept).
	LineNumbers bool `mapstructure:"line_numbers"`
	// Timeout bounds the time one batch spends finding and opening binaries
	// (fetches go on in the background and serve later batches).
	Timeout time.Duration `mapstructure:"timeout"`
	Cache   CacheConfig   `mapstructure:"cache"`
}

// LocalConfig configures the local source.
type LocalConfig struct {
	// Root is prefixed to mapping paths: a host mount such as /host, or
	// empty for paths as they are.
	Root string `mapstructure:"root"`
}

// DebuginfodConfig configures the debuginfod source.
type DebuginfodConfig struct {
	// URLs of servers, tried in order; empty means DEBUGINFOD_URLS.
	URLs          []string      `mapstructure:"urls"`
	Timeout       time.Duration `mapstructure:"timeout"`
	CacheDir      string        `mapstructure:"cache_dir"`
	MaxCacheBytes int64         `mapstructure:"max_cache_bytes"`
	MaxParallel   int           `mapstructure:"max_parallel"`
	NegativeTTL   time.Duration `mapstructure:"negative_ttl"`
	// MaxFileBytes refuses larger downloads (Content-Length, the bytes
	// streamed, or the server's 406), like DEBUGINFOD_MAXSIZE.
	MaxFileBytes int64 `mapstructure:"max_file_bytes"`
	// MaxDownloadTime stops one download from one server, however steadily
	// it moves, like DEBUGINFOD_MAXTIME.
	MaxDownloadTime time.Duration `mapstructure:"max_download_time"`
	// HTTP is the collector's HTTP client configuration for every server:
	// tls, headers, proxy_url, auth (an authenticator extension) and
	// the rest of confighttp. Its endpoint is unused (see urls).
	HTTP confighttp.ClientConfig `mapstructure:"http"`
}

// CacheConfig bounds the processor's memory.
type CacheConfig struct {
	// MaxBytes bounds parsed objects (ELF, DWARF, symbol tables).
	MaxBytes int64 `mapstructure:"max_bytes"`
	// MaxEntries bounds resolved (build id, address) results.
	MaxEntries int `mapstructure:"max_entries"`
}

func createDefaultConfig() *Config {
	return &Config{
		Sources:          append([]string(nil), otlpsym.DefaultSources...),
		DebugDirectories: []string{"/usr/lib/debug"},
		Debuginfod: DebuginfodConfig{
			Timeout:       10 * time.Second,
			MaxCacheBytes: 2 << 30,
			MaxParallel:   4,
			NegativeTTL:   5 * time.Minute,
			// The whole cache: a larger file could not be kept anyway.
			MaxFileBytes:    2 << 30,
			MaxDownloadTime: 5 * time.Minute,
			HTTP:            confighttp.NewDefaultClientConfig(),
		},
		Demangle:     "full",
		InlineFrames: true,
		LineNumbers:  true,
		Timeout:      10 * time.Second,
		Cache: CacheConfig{
			MaxBytes:   512 << 20,
			MaxEntries: 1 << 20,
		},
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for _, s := range c.Sources {
		switch s {
		case otlpsym.SourceLocal, otlpsym.SourceDebugDirs, otlpsym.SourceSymbolDirs, otlpsym.SourceSymbolStore, otlpsym.SourceDebuginfod, otlpsym.SourceKernel:
		default:
			errs = append(errs, fmt.Errorf("sources: unknown source %q (local, debug_directories, symbol_directories, symbol_store, debuginfod, kernel)", s))
		}
		if seen[s] {
			errs = append(errs, fmt.Errorf("sources: %q listed twice", s))
		}
		seen[s] = true
	}
	if len(c.Sources) == 0 {
		errs = append(errs, errors.New("sources: at least one source is needed"))
	}
	switch c.Demangle {
	case "full", "none":
	default:
		errs = append(errs, fmt.Errorf("demangle: %q is not full or none", c.Demangle))
	}
	for _, u := range c.Debuginfod.URLs {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("debuginfod.urls: %q is not an http(s) URL", u))
		}
	}
	if c.Debuginfod.Timeout < 0 || c.Timeout < 0 || c.Debuginfod.NegativeTTL < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if c.Debuginfod.MaxParallel < 0 || c.Debuginfod.MaxCacheBytes < 0 {
		errs = append(errs, errors.New("debuginfod.max_parallel and max_cache_bytes must not be negative"))
	}
	if c.Debuginfod.MaxFileBytes < 0 || c.Debuginfod.MaxDownloadTime < 0 {
		errs = append(errs, errors.New("debuginfod.max_file_bytes and max_download_time must not be negative"))
	}
	if c.Debuginfod.HTTP.Endpoint != "" {
		errs = append(errs, errors.New("debuginfod.http.endpoint is unused: list servers in debuginfod.urls"))
	}
	if c.Cache.MaxBytes < 0 || c.Cache.MaxEntries < 0 {
		errs = append(errs, errors.New("cache.max_bytes and cache.max_entries must not be negative"))
	}
	return errors.Join(errs...)
}

// envURLs reads DEBUGINFOD_URLS, the variable every debuginfod client honours.
func envURLs() string { return os.Getenv("DEBUGINFOD_URLS") }
