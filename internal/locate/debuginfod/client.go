// Package debuginfod fetches separate debug files and executables by GNU
// build id from debuginfod servers (the elfutils protocol:
// GET URL/buildid/HEX/debuginfo and .../executable). Every body is streamed
// to disk, checked to be an ELF file carrying the requested build id, and
// kept in an on-disk cache bounded in bytes, so a file is downloaded once
// per machine rather than once per process. Misses and failures are
// remembered for a while so a dead or empty server costs little. A Client is
// safe for concurrent use.
package debuginfod

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/clock"
	"github.com/profsym/profsym/internal/frame"
)

// Kind is what to fetch for a build id.
type Kind int

const (
	// DebugInfo is the file holding the DWARF (often a separate debug file
	// whose code sections are empty).
	DebugInfo Kind = iota
	// Executable is the loadable object itself (often stripped).
	Executable
)

// String is the protocol's name for the kind, also the cached file's name.
func (k Kind) String() string {
	switch k {
	case DebugInfo:
		return "debuginfo"
	case Executable:
		return "executable"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Defaults for zero Config fields.
const (
	DefaultTimeout       = 10 * time.Second
	DefaultMaxCacheBytes = 2 << 30
	DefaultMaxParallel   = 4
	DefaultNegativeTTL   = 5 * time.Minute
	DefaultMaxFileBytes  = 4 << 30
	// DefaultMaxDownloadTime lets a 2 GiB file arrive at 8 MiB/s.
	DefaultMaxDownloadTime = 5 * time.Minute
)

// EnvURLs is the variable elfutils' client reads its servers from.
const EnvURLs = "DEBUGINFOD_URLS"

// Config configures a Client. Zero fields take the defaults above.
type Config struct {
	// URLs are server prefixes, tried in order; the first success wins.
	URLs []string
	// UseEnv reads DEBUGINFOD_URLS (space-separated) when URLs is empty.
	UseEnv bool
	// Timeout bounds one attempt at one server: the response headers must
	// arrive within it, and then every Timeout window of the body must bring
	// at least minProgress bytes. A large file on a healthy link therefore
	// downloads however long it takes, while a dead, hung or trickling server
	// costs about Timeout.
	Timeout time.Duration
	// CacheDir holds the verified files as CacheDir/ID/KIND. Default:
	// $XDG_CACHE_HOME/profsym/debuginfod (os.UserCacheDir).
	CacheDir string
	// MaxCacheBytes bounds the files in CacheDir; the least recently accessed
	// are evicted. A body larger than this is refused, since keeping it would
	// break the bound.
	MaxCacheBytes int64
	// MaxParallel bounds concurrent downloads from each server. A download
	// holds a slot of the server it is reading from, and gives it back
	// before trying the next server; a caller that finds every slot of a
	// server busy for Timeout goes on to the next server.
	MaxParallel int
	// MaxQueued bounds the downloads in flight at once, running or waiting
	// for a server's slot (default 4 × MaxParallel × servers): callers that
	// do not wait for their download (FetchWait) could otherwise start one
	// per build id a batch names. Past it, a download starts only once
	// another ends.
	MaxQueued int
	// NegativeTTL is how long a miss or a failure is remembered per
	// (build id, kind); calls within it fail at once without network.
	NegativeTTL time.Duration
	// MaxFileBytes refuses larger bodies: at once when Content-Length says
	// so, else as soon as the streamed bytes pass it (frame.ErrLimitExceeded).
	// Like elfutils' DEBUGINFOD_MAXSIZE, it is also sent to the server as
	// X-Debuginfod-Maxsize.
	MaxFileBytes int64
	// MaxDownloadTime bounds one download from one server from request to
	// last byte, however steadily the bytes come (frame.ErrLimitExceeded;
	// the server is then skipped for a while). Like DEBUGINFOD_MAXTIME.
	MaxDownloadTime time.Duration
	// HTTPClient, if set, is used for requests (its own Timeout, if any,
	// applies in addition to ours).
	HTTPClient *http.Client
	// Logger, if set, receives debug logs per fetch and warnings when a
	// server is skipped after failing.
	Logger *zap.Logger
	// Clock times waits, timeouts, backoff and the negative cache (default
	// clock.Real; tests move a clock.Fake). The cache's access times are
	// the file system's.
	Clock clock.Clock
}

// minProgress is how many body bytes each Timeout window must bring. It is
// low enough for any real link and high enough that a server dribbling a
// few bytes per window to hold a connection open is cut off.
const minProgress = 64 << 10

// maxBackoff caps how long a server that failed (refused, timed out, 5xx) is
// skipped. It is shorter than a typical NegativeTTL so a restarted server is
// used again soon for ids not yet remembered as failed.
const maxBackoff = 30 * time.Second

// maxNegative bounds the negative cache; profiles can name unboundedly many
// unknown build ids.
const maxNegative = 1 << 16

const userAgent = "profsym-debuginfod/1"

// Client fetches and caches files. Create it with New; Close it to stop
// downloads still running for callers that gave up.
type Client struct {
	cfg   Config
	clk   clock.Clock
	urls  []string
	http  *http.Client
	log   *zap.Logger
	dir   string
	limit int64                    // largest body accepted: min(MaxFileBytes, MaxCacheBytes)
	slots map[string]chan struct{} // per server URL, MaxParallel each
	queue chan struct{}            // a place per download in flight, MaxQueued

	base context.Context // canceled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	files    map[string]*cacheEntry // by key(id, kind)
	bytes    int64                  // sum of files[*].size
	reserved int64                  // bytes written to downloads in progress
	resv     map[string]int64       // the same per download, by key
	neg      map[string]negEntry
	inflight map[string]*call
	down     map[string]downEntry // by server URL
	st       Stats
	lat      []time.Duration // attempts' latencies not yet taken (TakeLatencies)
}

// maxLatencies bounds the latencies kept between two TakeLatencies calls.
const maxLatencies = 4096

type negEntry struct {
	err   error
	until time.Time
}

type downEntry struct {
	err   error
	until time.Time
}

// call is one download shared by every concurrent caller of a key.
type call struct {
	done  chan struct{}
	start time.Time
	path  string
	err   error
}

// Stats are cumulative counters, for telemetry.
type Stats struct {
	Requests     int64 // Fetch calls
	Hits         int64 // answered from the disk cache
	Misses       int64 // needed a download (one per shared download)
	Shared       int64 // callers that joined a download already running
	NegativeHits int64 // answered from the negative cache
	// Abandoned counts callers that went on without the file of a download
	// in flight (their context or Wait ended first); Deferred, downloads
	// not started because MaxQueued were in flight.
	Abandoned int64
	Deferred  int64
	// InFlight is the downloads running or waiting for a server's slot now,
	// OldestInFlight how long the oldest of them has been at it.
	InFlight       int64
	OldestInFlight time.Duration
	// Errors counts failed downloads by frame.Reason (not_found, timeout,
	// fetch_failed, build_id_mismatch, corrupt_file, limit_exceeded).
	Errors       map[string]int64
	BytesFetched int64         // body bytes received, verified or not
	Fetches      int64         // HTTP attempts, to average FetchLatency
	FetchLatency time.Duration // summed over attempts
	Evictions    int64
	CacheBytes   int64 // bytes now in the cache
	CacheFiles   int64 // files now in the cache
}

// New validates cfg, creates the cache folder and indexes what it holds.
func New(cfg Config) (*Client, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxCacheBytes <= 0 {
		cfg.MaxCacheBytes = DefaultMaxCacheBytes
	}
	if cfg.MaxParallel <= 0 {
		cfg.MaxParallel = DefaultMaxParallel
	}
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = DefaultNegativeTTL
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxDownloadTime <= 0 {
		cfg.MaxDownloadTime = DefaultMaxDownloadTime
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	var urls []string
	for _, u := range cfg.URLs {
		n, err := normalizeURL(u)
		if err != nil {
			return nil, err
		}
		urls = appendUnique(urls, n)
	}
	if len(cfg.URLs) == 0 && cfg.UseEnv {
		env := os.Getenv(EnvURLs)
		urls = ParseURLs(env)
		if len(urls) == 0 && strings.TrimSpace(env) != "" {
			log.Warn("no usable http(s) server in "+EnvURLs, zap.String("value", env))
		}
	}
	dir := cfg.CacheDir
	if dir == "" {
		ucd, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("debuginfod: no cache folder configured and %w", err)
		}
		dir = filepath.Join(ucd, "profsym", "debuginfod")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("debuginfod: cache folder: %w", err)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.MaxParallel
		hc = &http.Client{Transport: tr}
	}
	base, stop := context.WithCancel(context.Background())
	c := &Client{
		cfg:      cfg,
		clk:      clock.Or(cfg.Clock),
		urls:     urls,
		http:     hc,
		log:      log,
		dir:      dir,
		limit:    min(cfg.MaxFileBytes, cfg.MaxCacheBytes),
		slots:    map[string]chan struct{}{},
		base:     base,
		stop:     stop,
		files:    map[string]*cacheEntry{},
		neg:      map[string]negEntry{},
		inflight: map[string]*call{},
		resv:     map[string]int64{},
		down:     map[string]downEntry{},
		st:       Stats{Errors: map[string]int64{}},
	}
	for _, u := range urls {
		c.slots[u] = make(chan struct{}, cfg.MaxParallel)
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 4 * cfg.MaxParallel * max(len(urls), 1)
	}
	c.cfg.MaxQueued = cfg.MaxQueued
	c.queue = make(chan struct{}, cfg.MaxQueued)
	if err := c.scan(); err != nil {
		stop()
		return nil, err
	}
	return c, nil
}

// URLs returns the servers in the order they are tried.
func (c *Client) URLs() []string { return append([]string(nil), c.urls...) }

// CacheDir returns the folder holding the cached files.
func (c *Client) CacheDir() string { return c.dir }

// Close cancels downloads still running and waits for them. Later calls fail.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stop()
	c.wg.Wait()
	return nil
}

// TakeLatencies returns the duration of each HTTP attempt since the last
// call (at most maxLatencies), for a latency histogram of real values.
func (c *Client) TakeLatencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.lat
	c.lat = nil
	return out
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Errors = make(map[string]int64, len(c.st.Errors))
	for k, v := range c.st.Errors {
		s.Errors[k] = v
	}
	s.CacheBytes = c.bytes
	s.CacheFiles = int64(len(c.files))
	s.InFlight = int64(len(c.inflight))
	now := c.clk.Now()
	for _, cl := range c.inflight {
		s.OldestInFlight = max(s.OldestInFlight, now.Sub(cl.start))
	}
	return s
}

// Fetch returns the path of the verified file of kind for buildID (hex, any
// case), from the cache or else downloaded. Errors wrap a symbol sentinel:
// ErrNotFound (every server answered 404, or the id is not hex),
// ErrTimeout, ErrFetchFailed, ErrBuildIDMismatch, ErrCorruptFile or
// ErrLimitExceeded. If ctx ends first, Fetch returns an error wrapping
// ErrPending at once, but the download goes on for later callers (bounded
// by Timeout per server and MaxDownloadTime).
//
// The returned file may be evicted by later fetches; open it promptly (an
// open or mapped file stays readable after eviction).
func (c *Client) Fetch(ctx context.Context, buildID string, kind Kind) (string, error) {
	return c.FetchWait(ctx, buildID, kind, Wait{})
}

// run performs the download for key k and publishes the result.
func (c *Client) run(ctx context.Context, k, id string, kind Kind, cl *call) {
	defer c.wg.Done()
	defer func() { <-c.queue }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.base, cancel)()

	path, err := c.fetch(ctx, k, id, kind)

	c.mu.Lock()
	delete(c.inflight, k)
	if err != nil {
		c.st.Errors[frame.Reason(err)]++
		// A download cut short by Close says nothing about the server,
		// nor one refused for room another download took.
		if c.base.Err() == nil && !errors.Is(err, frame.ErrRetry) {
			c.remember(k, err)
		}
	}
	c.mu.Unlock()
	cl.path, cl.err = path, err
	close(cl.done)
	if err != nil {
		c.log.Debug("debuginfod fetch failed", zap.String("build_id", id), zap.Stringer("kind", kind), zap.Error(err))
	}
}

// remember adds a negative entry; c.mu is held.
func (c *Client) remember(k string, err error) {
	now := c.clk.Now()
	if len(c.neg) >= maxNegative {
		for nk, n := range c.neg {
			if now.After(n.until) {
				delete(c.neg, nk)
			}
		}
		// Still full of live entries: drop arbitrary ones rather than grow.
		for nk := range c.neg {
			if len(c.neg) < maxNegative {
				break
			}
			delete(c.neg, nk)
		}
	}
	c.neg[k] = negEntry{err: err, until: now.Add(c.cfg.NegativeTTL)}
}

// fetch tries the servers in order.
func (c *Client) fetch(ctx context.Context, k, id string, kind Kind) (string, error) {
	final := c.path(id, kind)
	// Another process sharing the folder may have stored it meanwhile.
	if st, err := os.Stat(final); err == nil && st.Mode().IsRegular() {
		c.adopt(k, final, st.Size())
		return final, nil
	}
	c.mu.Lock()
	c.st.Misses++
	c.mu.Unlock()
	if len(c.urls) == 0 {
		return "", fmt.Errorf("debuginfod %s %s: no server configured: %w", id, kind, frame.ErrNotFound)
	}

	var first error // the first failure that is not a 404
	var msgs []string
	for _, u := range c.urls {
		if err := c.skipped(u); err != nil {
			if first == nil {
				first = err
			} else {
				msgs = append(msgs, err.Error())
			}
			continue
		}
		release, err := c.slot(ctx, u)
		if err != nil {
			if ctx.Err() != nil {
				return "", fmt.Errorf("debuginfod %s %s: client closed: %w", id, kind, frame.ErrFetchFailed)
			}
			if first == nil {
				first = err
			} else {
				msgs = append(msgs, err.Error())
			}
			continue
		}
		start := c.clk.Now()
		n, serverFault, err := c.attempt(ctx, u, k, id, kind)
		took := c.clk.Now().Sub(start)
		release()
		c.mu.Lock()
		c.st.Fetches++
		c.st.BytesFetched += n
		c.st.FetchLatency += took
		if len(c.lat) < maxLatencies {
			c.lat = append(c.lat, took)
		}
		c.mu.Unlock()
		if err == nil {
			c.log.Debug("debuginfod fetched", zap.String("build_id", id), zap.Stringer("kind", kind),
				zap.String("server", u), zap.Int64("bytes", n), zap.Duration("took", took))
			return c.path(id, kind), nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("debuginfod %s %s: client closed: %w", id, kind, frame.ErrFetchFailed)
		}
		if serverFault {
			c.markDown(u, err)
		}
		if first == nil && !errors.Is(err, frame.ErrNotFound) {
			first = err
		} else {
			msgs = append(msgs, err.Error())
		}
	}
	// Any failure outranks 404s: the file may well exist on that server.
	if first == nil {
		return "", fmt.Errorf("debuginfod: %w (%s)", frame.ErrNotFound, strings.Join(msgs, "; "))
	}
	if len(msgs) == 0 {
		return "", fmt.Errorf("debuginfod: %w", first)
	}
	return "", fmt.Errorf("debuginfod: %w (other servers: %s)", first, strings.Join(msgs, "; "))
}

// slot takes one of server u's download slots, waiting at most Timeout: a
// server whose slots are all held (by downloads that trickle, say) must not
// keep ids that another server has from being fetched.
func (c *Client) slot(ctx context.Context, u string) (release func(), err error) {
	sem := c.slots[u]
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	default:
	}
	t := c.clk.NewTimer(c.cfg.Timeout)
	defer t.Stop()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-t.C():
		return nil, fmt.Errorf("%s: all %d download slots stayed busy for %v: %w", u, cap(sem), c.cfg.Timeout, frame.ErrTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// skipped returns the recent failure of server u while it is backing off.
func (c *Client) skipped(u string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.down[u]
	if !ok {
		return nil
	}
	if c.clk.Now().After(d.until) {
		delete(c.down, u)
		return nil
	}
	return fmt.Errorf("%s skipped until %s after: %w", u, d.until.Format(time.TimeOnly), d.err)
}

// markDown makes u skipped for a while, so that many build ids queued
// behind a dead server do not each pay Timeout.
func (c *Client) markDown(u string, err error) {
	backoff := min(c.cfg.NegativeTTL, maxBackoff)
	c.mu.Lock()
	c.down[u] = downEntry{err: err, until: c.clk.Now().Add(backoff)}
	c.mu.Unlock()
	c.log.Warn("debuginfod server failed; skipping it for a while", zap.String("server", u),
		zap.Duration("backoff", backoff), zap.Error(err))
}

func key(id string, kind Kind) string { return id + "/" + kind.String() }

func (c *Client) path(id string, kind Kind) string {
	return filepath.Join(c.dir, id, kind.String())
}

// maxIDHex bounds a build id: buildid accepts notes of up to 256 bytes.
const maxIDHex = 512

// normalizeID lowercases a hex build id and rejects anything else, which
// also keeps ids from naming paths outside the cache folder.
func normalizeID(s string) (string, error) {
	id := strings.ToLower(s)
	if len(id) < 2 || len(id) > maxIDHex || len(id)%2 != 0 {
		return "", fmt.Errorf("debuginfod: build id %q is not 1 to %d bytes of hex: %w", s, maxIDHex/2, frame.ErrNotFound)
	}
	for i := 0; i < len(id); i++ {
		if ch := id[i]; (ch < '0' || ch > '9') && (ch < 'a' || ch > 'f') {
			return "", fmt.Errorf("debuginfod: build id %q is not hex: %w", s, frame.ErrNotFound)
		}
	}
	return id, nil
}
