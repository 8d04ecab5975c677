package symbolizationprocessor

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/confmap"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/symbolize/demangle"
	"github.com/profsym/profsym/internal/symbolize/symindex"
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
	// name, indexed by identity at start and again by a lookup once the
	// index is older than SymbolDirectoriesRescan.
	SymbolDirectories       []string      `mapstructure:"symbol_directories"`
	SymbolDirectoriesRescan time.Duration `mapstructure:"symbol_directories_rescan"`
	// Debuginfod fetches debug files by build id.
	Debuginfod DebuginfodConfig `mapstructure:"debuginfod"`
	// SymbolStore names a symbolstore extension of this collector, read in
	// process by the symbol_store source (empty: none).
	SymbolStore component.ID `mapstructure:"symbol_store"`
	// SymbolIndex shares parsed debug info through the symbol store: see
	// SymbolIndexConfig.
	SymbolIndex SymbolIndexConfig `mapstructure:"symbol_index"`
	// Demangle is "full" (C++ and Rust names demangled) or "none".
	Demangle string `mapstructure:"demangle"`
	// InlineFrames adds a line per inlined call.
	InlineFrames bool `mapstructure:"inline_frames"`
	// LineNumbers keeps line and column numbers (file names are kept).
	LineNumbers bool `mapstructure:"line_numbers"`
	// Timeout bounds the time one batch spends finding and opening binaries
	// (fetches go on in the background and serve later batches).
	Timeout time.Duration `mapstructure:"timeout"`
	// FetchWait bounds how long a batch waits for files still being
	// downloaded: their frames flow on pending and a later batch names
	// them. 0: wait up to Timeout.
	FetchWait time.Duration `mapstructure:"fetch_wait"`
	// NegativeTTL is how long a binary that was not found, or found without
	// DWARF, is remembered before the sources are asked again; answers
	// already given for its addresses expire with it.
	NegativeTTL time.Duration `mapstructure:"negative_ttl"`
	Cache       CacheConfig   `mapstructure:"cache"`
	Limits      LimitsConfig  `mapstructure:"limits"`
}

// SymbolIndexConfig configures the symbol indexes kept in the symbol store
// (symbol_store): a binary's debug info compiled once into an index of
// address ranges that every processor over the same store reads instead of
// parsing the debug info again (docs/symbol-index.md).
type SymbolIndexConfig struct {
	// Enabled uses and writes indexes when symbol_store is set.
	Enabled bool `mapstructure:"enabled"`
	// MaxBytes refuses larger index files (hostile input like any file).
	MaxBytes int64 `mapstructure:"max_bytes"`
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

// CacheConfig bounds the processor's memory; every cache counts its bytes,
// entries and evictions in the processor's telemetry.
type CacheConfig struct {
	// MaxBytes bounds parsed objects (ELF, DWARF, symbol tables).
	MaxBytes int64 `mapstructure:"max_bytes"`
	// MaxEntries and MaxResultBytes bound resolved (object, address) results.
	MaxEntries     int   `mapstructure:"max_entries"`
	MaxResultBytes int64 `mapstructure:"max_result_bytes"`
	// MaxObjects bounds the binaries remembered by identity (where their
	// files are, or that none was found).
	MaxObjects int `mapstructure:"max_objects"`
	// MaxDemangled and MaxDemangledBytes bound the demangled-name cache.
	MaxDemangled      int   `mapstructure:"max_demangled"`
	MaxDemangledBytes int64 `mapstructure:"max_demangled_bytes"`
}

// LimitsConfig bounds what one frame, record or file can cost: input is
// untrusted. A frame that hits a limit stays raw with reason
// limit_exceeded (or has its names truncated); the batch flows on.
type LimitsConfig struct {
	// MaxNameBytes truncates function and file names written into profiles
	// and logs.
	MaxNameBytes int `mapstructure:"max_name_bytes"`
	// MaxAttributeBytes bounds each log attribute the processor writes.
	MaxAttributeBytes int `mapstructure:"max_attribute_bytes"`
	// MaxFramesJSONBytes refuses larger `frames` attributes of log records;
	// MaxLogFrames ignores frames beyond it.
	MaxFramesJSONBytes int `mapstructure:"max_frames_json_bytes"`
	MaxLogFrames       int `mapstructure:"max_log_frames"`
	// MaxFileBytes refuses larger binaries and debug files.
	MaxFileBytes int64 `mapstructure:"max_file_bytes"`
	// MaxDecompressedBytes bounds what decompressing one file's sections
	// (compressed DWARF, MiniDebugInfo) may produce.
	MaxDecompressedBytes int64 `mapstructure:"max_decompressed_bytes"`
	// MaxIndexedFiles bounds the files indexed in symbol directories.
	MaxIndexedFiles int `mapstructure:"max_indexed_files"`
}

// DefaultFetchWait is how long a batch waits for a download in flight. A
// debug file that a healthy server has at hand (tens of MB over a cluster
// network) arrives well within it, so a new build id is usually named in the
// batch that first names it; a slow or trickling server adds at most this
// to that batch, and nothing to later ones.
const DefaultFetchWait = 500 * time.Millisecond

func createDefaultConfig() *Config {
	return &Config{
		Sources:                 append([]string(nil), locate.DefaultOrder...),
		DebugDirectories:        []string{debugdirs.DefaultDebugDir},
		SymbolDirectoriesRescan: locate.DefaultRescan,
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
		SymbolIndex:  SymbolIndexConfig{Enabled: true, MaxBytes: symindex.DefaultMaxBytes},
		Demangle:     "full",
		InlineFrames: true,
		LineNumbers:  true,
		Timeout:      otlpsym.DefaultTimeout,
		FetchWait:    DefaultFetchWait,
		NegativeTTL:  locate.DefaultNegativeTTL,
		Cache: CacheConfig{
			MaxBytes:          symbolize.DefaultCacheBytes,
			MaxEntries:        otlpsym.DefaultMaxEntries,
			MaxResultBytes:    otlpsym.DefaultMaxResultBytes,
			MaxObjects:        otlpsym.DefaultMaxObjects,
			MaxDemangled:      demangle.DefaultEntries,
			MaxDemangledBytes: demangle.DefaultBytes,
		},
		Limits: LimitsConfig{
			MaxNameBytes:         frame.DefaultMaxNameBytes,
			MaxAttributeBytes:    otlpsym.DefaultMaxAttributeBytes,
			MaxFramesJSONBytes:   otlpsym.DefaultMaxFramesJSON,
			MaxLogFrames:         otlpsym.DefaultMaxLogFrames,
			MaxFileBytes:         elfx.DefaultMaxFileBytes,
			MaxDecompressedBytes: elfx.DefaultMaxDecompressedBytes,
			MaxIndexedFiles:      locate.DefaultMaxIndexedFiles,
		},
	}
}

var _ confmap.Validator = (*Config)(nil)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for _, s := range c.Sources {
		if !locate.Known(s) {
			errs = append(errs, fmt.Errorf("sources: unknown source %q (one of %v)", s, locate.DefaultOrder))
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
	if c.Debuginfod.Timeout < 0 || c.Timeout < 0 || c.FetchWait < 0 || c.Debuginfod.NegativeTTL < 0 || c.NegativeTTL < 0 || c.SymbolDirectoriesRescan < 0 {
		errs = append(errs, errors.New("timeouts, fetch_wait, negative_ttl and symbol_directories_rescan must not be negative"))
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
	cc, l := c.Cache, c.Limits
	if cc.MaxBytes < 0 || cc.MaxEntries < 0 || cc.MaxResultBytes < 0 || cc.MaxObjects < 0 || cc.MaxDemangled < 0 || cc.MaxDemangledBytes < 0 {
		errs = append(errs, errors.New("cache bounds must not be negative"))
	}
	if l.MaxNameBytes < 0 || l.MaxAttributeBytes < 0 || l.MaxFramesJSONBytes < 0 || l.MaxLogFrames < 0 || l.MaxFileBytes < 0 ||
		l.MaxDecompressedBytes < 0 || l.MaxIndexedFiles < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	if l.MaxNameBytes > 0 && l.MaxNameBytes < 16 {
		errs = append(errs, errors.New("limits.max_name_bytes must be at least 16"))
	}
	return errors.Join(errs...)
}

// envURLs reads DEBUGINFOD_URLS, the variable every debuginfod client honours.
func envURLs() string { return os.Getenv("DEBUGINFOD_URLS") }
