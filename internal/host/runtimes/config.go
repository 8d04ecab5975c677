package runtimes

import "fmt"

// Config selects the runtimes the sampler walks and bounds what naming
// their frames keeps.
type Config struct {
	HotSpot bool // Java: HotSpot JVMs (OpenJDK 8 to 27)
	CPython bool // Python: CPython 3.6-3.15
	Perl    bool // Perl 5.36, 5.40, 5.42 (threaded builds, x86-64)
	PHP     bool // PHP: 8.2 and 8.4 (non-thread-safe builds)
	Ruby    bool // Ruby: CRuby 3.1 and 3.3 (x86-64)
	V8      bool // JavaScript: Node.js's V8 (Node 20)
	// MaxNames bounds the names cached per runtime (methods, code
	// objects); the least recently used go first.
	MaxNames int
	// MaxNameBytes cuts every name and file name read from a process.
	MaxNameBytes int
	// GoLabels puts the pprof labels of a Go program's running goroutine
	// on its samples (docs/runtimes.md, "Go pprof labels").
	GoLabels bool
	// MaxLabels bounds the labels kept per sample; MaxLabelBytes cuts
	// every label key and value.
	MaxLabels     int
	MaxLabelBytes int
	// ThreadContext puts the span a thread publishes through the
	// OpenTelemetry thread context (OTEP 4947, otel_thread_ctx_v1) on its
	// samples as a link (docs/runtimes.md, "Trace links").
	ThreadContext bool
}

// Defaults.
const (
	DefaultMaxNames      = 65536
	DefaultMaxNameBytes  = 1024
	DefaultMaxLabels     = 16
	DefaultMaxLabelBytes = 256
)

// SetDefaults fills zero bounds.
func (c *Config) SetDefaults() {
	if c.MaxNames == 0 {
		c.MaxNames = DefaultMaxNames
	}
	if c.MaxNameBytes == 0 {
		c.MaxNameBytes = DefaultMaxNameBytes
	}
	if c.MaxLabels == 0 {
		c.MaxLabels = DefaultMaxLabels
	}
	if c.MaxLabelBytes == 0 {
		c.MaxLabelBytes = DefaultMaxLabelBytes
	}
}

// Validate checks the bounds.
func (c *Config) Validate() error {
	if c.MaxNames < 1 || c.MaxNames > 1<<24 {
		return fmt.Errorf("runtimes: max names %d outside 1..%d", c.MaxNames, 1<<24)
	}
	if c.MaxNameBytes < 16 || c.MaxNameBytes > 1<<16 {
		return fmt.Errorf("runtimes: max name length %d outside 16..%d", c.MaxNameBytes, 1<<16)
	}
	if c.GoLabels && (c.MaxLabels < 1 || c.MaxLabels > 256) {
		return fmt.Errorf("runtimes: max labels %d outside 1..256", c.MaxLabels)
	}
	if c.GoLabels && (c.MaxLabelBytes < 1 || c.MaxLabelBytes > 1<<12) {
		return fmt.Errorf("runtimes: max label length %d outside 1..%d", c.MaxLabelBytes, 1<<12)
	}
	return nil
}

// Enabled reports whether any runtime is walked, or Go labels or thread
// contexts read.
func (c *Config) Enabled() bool {
	return c.HotSpot || c.CPython || c.Perl || c.PHP || c.Ruby || c.V8 || c.GoLabels || c.ThreadContext
}
