package otlpsym

import (
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/symbolize/demangle"
)

// Options configure a Symbolizer. Zero fields take the defaults below.
type Options struct {
	// Locate configures the chain of sources; listing locate.SourceKernel in
	// its Order also turns on symbolization of raw kernel frames.
	Locate locate.Config

	Demangle bool
	Inlines  bool
	Lines    bool

	CacheBytes     int64 // parsed objects (symbolize.DefaultCacheBytes)
	MaxEntries     int   // resolved (object, address) results
	MaxResultBytes int64 // the results' memory
	MaxObjects     int   // identities remembered (object numbers, located files)
	// DemangleEntries and DemangleBytes bound the demangled-name cache.
	DemangleEntries int
	DemangleBytes   int64

	Timeout time.Duration // bound on finding and opening objects per batch
	// FetchWait bounds how long a batch waits for files still being
	// fetched (debuginfod downloads) or opened (DWARF indexed, sections
	// inflated): until FetchWait after the batch, or the download, began,
	// whichever was first; both go on in the background. Their frames are then left
	// raw with reason pending (or named from a symbol table, marked
	// incomplete: pending), nothing about them is cached, and a later batch
	// names them once the file has arrived. It is cut to nine tenths of
	// Timeout, which is also what 0 means.
	FetchWait   time.Duration
	NegativeTTL time.Duration // how long failures and answers short of DWARF are kept
	MaxParallel int           // objects found and opened at once

	// Indexes, if set, is where symbol indexes are shared (a symbol store):
	// objects with a GNU build id are opened from their index when there
	// is one, and one symbolizer over the store compiles each missing one.
	Indexes locate.IndexStore
	// MaxIndexBytes bounds an index file (symindex.DefaultMaxBytes).
	MaxIndexBytes int64

	Limits Limits
	// FileLimits bound each binary and debug file opened (size,
	// decompressed bytes); Locate.MaxFileBytes defaults to its size bound.
	FileLimits elfx.Limits
	Logger     *zap.Logger
}

// Limits bound what hostile input can make the symbolizer write or read.
type Limits struct {
	// MaxNameBytes truncates function and file names (frame.Truncate).
	MaxNameBytes int
	// MaxAttributeBytes bounds each log attribute the symbolizer writes
	// (stackPath, stackTrace); whole frames are dropped from the root end
	// to fit.
	MaxAttributeBytes int
	// MaxFramesJSON and MaxLogFrames bound a log record's frames attribute:
	// larger attributes are refused, frames beyond the count ignored.
	MaxFramesJSON int
	MaxLogFrames  int
}

// Defaults.
const (
	DefaultTimeout           = 10 * time.Second
	DefaultMaxEntries        = 1 << 20
	DefaultMaxResultBytes    = 256 << 20
	DefaultMaxObjects        = 1 << 16
	DefaultMaxParallel       = 4
	DefaultMaxAttributeBytes = 64 << 10
	DefaultMaxFramesJSON     = 1 << 20
	DefaultMaxLogFrames      = 1024
	// ObjectCost is what remembering one identity costs at most: its object
	// number, its located files and the identity of each file inspected.
	ObjectCost = objNumCost + locate.IdentityCost
	// objNumCost is an interned identity: key string, list element, map entry.
	objNumCost = 224
)

// fetchWait is how long a batch waits for downloads and opening: FetchWait, within
// the batch timeout less a tenth of it, which is left to open what arrived
// (and keeps the reason pending rather than timeout when the wait is as
// long as the batch).
func (o *Options) fetchWait() time.Duration {
	w := o.Timeout - o.Timeout/10
	if o.FetchWait > 0 && o.FetchWait < w {
		w = o.FetchWait
	}
	return w
}

// internBytes bounds the function interning table; past it the table
// starts over, and the result cache with it.
func (o *Options) internBytes() int64 { return max(o.MaxResultBytes/4, 4<<20) }

// MemoryBudget is the memory the symbolizer's caches may hold at most with
// these options (after defaults): parsed objects, results, interned
// functions, demangled names and remembered identities. The process needs
// this much on top of what the batches in flight take.
func (o Options) MemoryBudget() int64 {
	o.defaults()
	dm := o.DemangleBytes
	if dm <= 0 {
		dm = demangle.DefaultBytes
	}
	cb := o.CacheBytes
	if cb <= 0 {
		cb = symbolize.DefaultCacheBytes
	}
	return cb + o.MaxResultBytes + o.internBytes() + dm + int64(o.MaxObjects)*ObjectCost
}

// Stats counts what one call did.
type Stats struct {
	Resolved   int64
	Unresolved map[string]int64 // by reason
	// Incomplete counts resolved frames named from a symbol table because
	// their binary's debug info could not be used, by reason.
	Incomplete  map[string]int64
	CacheHits   int64
	CacheMisses int64
	Skipped     int64 // already named, or not native
}

// add adds o's counts to s.
func (s *Stats) add(o Stats) {
	s.Resolved += o.Resolved
	s.CacheHits += o.CacheHits
	s.CacheMisses += o.CacheMisses
	s.Skipped += o.Skipped
	for reason, n := range o.Unresolved {
		if s.Unresolved == nil {
			s.Unresolved = map[string]int64{}
		}
		s.Unresolved[reason] += n
	}
	for reason, n := range o.Incomplete {
		if s.Incomplete == nil {
			s.Incomplete = map[string]int64{}
		}
		s.Incomplete[reason] += n
	}
}

func (s *Stats) incomplete(reason string) {
	if s.Incomplete == nil {
		s.Incomplete = map[string]int64{}
	}
	s.Incomplete[reason]++
}

func (s *Stats) unresolved(reason string) {
	if s.Unresolved == nil {
		s.Unresolved = map[string]int64{}
	}
	s.Unresolved[reason]++
}

func (opt *Options) defaults() {
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultTimeout
	}
	if opt.MaxEntries <= 0 {
		opt.MaxEntries = DefaultMaxEntries
	}
	if opt.MaxResultBytes <= 0 {
		opt.MaxResultBytes = DefaultMaxResultBytes
	}
	if opt.MaxObjects <= 0 {
		opt.MaxObjects = DefaultMaxObjects
	}
	if opt.MaxParallel <= 0 {
		opt.MaxParallel = DefaultMaxParallel
	}
	if opt.NegativeTTL <= 0 {
		opt.NegativeTTL = locate.DefaultNegativeTTL
	}
	l := &opt.Limits
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = frame.DefaultMaxNameBytes
	}
	if l.MaxAttributeBytes <= 0 {
		l.MaxAttributeBytes = DefaultMaxAttributeBytes
	}
	if l.MaxFramesJSON <= 0 {
		l.MaxFramesJSON = DefaultMaxFramesJSON
	}
	if l.MaxLogFrames <= 0 {
		l.MaxLogFrames = DefaultMaxLogFrames
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
}
