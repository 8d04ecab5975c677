// Package symbolize is profsym's symbolization engine: it turns ELF virtual
// addresses of one object, given as the files that hold it (the binary, a
// separate debug file, or both), into frames (function, file, line, column,
// inlined callers), choosing per address the best source the files have
// (DWARF, Go's pclntab, the ELF symbol tables), and holds parsed objects in
// a cache bounded in bytes. It does no searching: which files to open is
// decided by internal/locate. It is safe for concurrent use.
package symbolize

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/singleflight"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/filever"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/symbolize/demangle"
	"github.com/profsym/profsym/internal/symbolize/symindex"
	"github.com/profsym/profsym/internal/symbolize/symtab"
)

// DefaultCacheBytes bounds the memory of parsed objects when unset.
const DefaultCacheBytes = 512 << 20

// DefaultNegativeTTL is how long a file that failed to open is remembered.
const DefaultNegativeTTL = time.Minute

// Options configure a Resolver.
type Options struct {
	Inlines        bool          // return inlined frames, innermost first
	Demangle       bool          // fill Frame.Function with demangled names
	UseSymbolTable bool          // name the outermost frame from .symtab/.dynsym, like llvm-symbolizer
	CacheBytes     int64         // bound on parsed objects (0: DefaultCacheBytes)
	NegativeTTL    time.Duration // how long a failed open is remembered (0: DefaultNegativeTTL)
	// DemangleEntries and DemangleBytes bound the demangled-name cache
	// (0: demangle.DefaultEntries, demangle.DefaultBytes).
	DemangleEntries int
	DemangleBytes   int64
	// Limits bound each file opened (size, decompressed bytes). Unless
	// Limits.Pool is set, the Resolver makes one: the decompressed bytes of
	// every file it has open, cached or in use, stay within CacheBytes (or
	// MaxDecompressedBytes, if larger, so that any file within the
	// per-file bound can be opened).
	Limits elfx.Limits
	// Open, if set, opens the files (instead of elfx.OpenContext with
	// Limits): a caller that has just opened them to choose them hands
	// them over (locate.Chain.TakeOpened) and the engine owns them.
	Open func(ctx context.Context, path string, lim elfx.Limits) (*elfx.File, error)
	// LoadTimeout, if set, detaches loads (opening and indexing an
	// object's files) from their callers: a load runs with a context of its
	// own, bounded by LoadTimeout, and goes on when its callers stop
	// waiting (their Open then fails with frame.ErrPending), so that the
	// object is cached for a later caller. 0: a load runs with its first
	// caller's context.
	LoadTimeout time.Duration
	// MaxLoads bounds the loads running at once (0: no bound); more wait
	// for a place, within their load's context.
	MaxLoads int
	// Supplementary finds the dwz common file an object's DWARF points
	// into (.gnu_debugaltlink, .debug_sup): the engine searches for
	// nothing itself, internal/locate does. Nil, or a file not found: that
	// DWARF answers without it (names that live there read as absent, as
	// with llvm-symbolizer) and Handle.Missing says why.
	Supplementary func(ctx context.Context, req SupRequest) (string, error)
	// Split finds the .dwp package or .dwo files holding the functions of
	// an object built with -gsplit-dwarf (internal/locate, by name). Nil,
	// or a file not found: its skeleton units answer lines without
	// functions (as llvm-symbolizer does) and Handle.Missing says why.
	Split func(ctx context.Context, req SplitRequest) (string, error)
	// MaxIndexBytes bounds a symbol index file OpenIndex maps (0:
	// symindex.DefaultMaxBytes).
	MaxIndexBytes int64
}

// DefaultOptions are llvm-symbolizer's defaults.
func DefaultOptions() Options {
	return Options{Inlines: true, Demangle: true, UseSymbolTable: true}
}

// Frame is a resolved frame: the source's data plus the display name.
type Frame struct {
	frame.Frame
	// Function is the name to show: demangled when Options.Demangle is set,
	// otherwise Name. Empty when nothing names the address.
	Function string
}

// Resolver is the engine. Create it with New.
type Resolver struct {
	opt   Options
	dm    *demangle.Cache
	cache *lru.Cache[string, *entry]
	group singleflight.Group
	pool  *elfx.Pool
	sups  *supCache
	loads chan struct{} // a place per load running (MaxLoads)

	closed atomic.Bool
	// parsed counts objects opened from files with DWARF; indexes those
	// opened from a symbol index.
	parsed, indexes atomic.Int64
}

// Parsed is how many objects the resolver opened from files with DWARF
// (each one's debug info indexed, its units parsed as asked).
func (r *Resolver) Parsed() int64 { return r.parsed.Load() }

// IndexesOpened is how many objects it opened from symbol indexes.
func (r *Resolver) IndexesOpened() int64 { return r.indexes.Load() }

type entry struct {
	obj      *object
	err      error
	failedAt time.Time
}

// New makes a Resolver.
func New(opt Options) *Resolver {
	if opt.CacheBytes <= 0 {
		opt.CacheBytes = DefaultCacheBytes
	}
	if opt.NegativeTTL <= 0 {
		opt.NegativeTTL = DefaultNegativeTTL
	}
	r := &Resolver{dm: demangle.NewCache(opt.DemangleEntries, opt.DemangleBytes)}
	if opt.Limits.Pool == nil {
		lim := opt.Limits.WithDefaults()
		opt.Limits.Pool = elfx.NewPool(max(opt.CacheBytes, lim.MaxDecompressedBytes))
		opt.Limits.Pool.SetReclaim(r.reclaim)
	}
	r.opt, r.pool = opt, opt.Limits.Pool
	r.sups = newSupCache(opt.Supplementary)
	if opt.MaxLoads > 0 {
		r.loads = make(chan struct{}, opt.MaxLoads)
	}
	r.cache = lru.New[string, *entry](opt.CacheBytes, 0,
		func(e *entry) int64 {
			if e.obj == nil {
				return 256
			}
			return e.obj.sizeBytes()
		},
		func(_ string, e *entry) {
			if e.obj != nil {
				e.obj.retire()
			}
		})
	return r
}

// reclaim closes cached objects no lookup is using that hold decompressed
// sections, least recently used first, until need bytes of the pool are
// free: a new file's DWARF is worth more than an idle one's.
func (r *Resolver) reclaim(need int64) {
	start, _, _ := r.pool.Stats()
	r.cache.EvictWhere(func(_ string, e *entry) bool {
		return e.obj != nil && e.obj.refs.Load() == 0 && e.obj.heldBytes() > 0
	}, func() bool {
		used, _, _ := r.pool.Stats()
		return used <= start-need
	})
}

// DecompressedStats reports the decompressed bytes open files hold, their
// bound, and how many decompressions that bound refused.
func (r *Resolver) DecompressedStats() (held, limit int64, refused uint64) { return r.pool.Stats() }

// Options returns the resolver's options.
func (r *Resolver) Options() Options { return r.opt }

// CacheStats reports the object cache's counters.
func (r *Resolver) CacheStats() lru.Stats { return r.cache.Stats() }

// DemangleStats reports the demangled-name cache's counters.
func (r *Resolver) DemangleStats() lru.Stats { return r.dm.Stats() }

// Close drops every cached object; a load still running then closes its
// object when it ends.
func (r *Resolver) Close() error {
	r.closed.Store(true)
	r.cache.Purge()
	return nil
}

// Handle pins one object for a batch of lookups. Close it when done. A
// Handle is used by one goroutine at a time; open one per goroutine.
type Handle struct {
	r       *Resolver
	key     string
	obj     *object
	scratch []frame.Frame
	missing error // of the last Lookup
	// recent holds the handle's last demangled names, by where the raw
	// name's bytes are: the frames of one object's addresses repeat a few
	// functions (a unit's names are one string each), so most of them are
	// found here without the shared cache's lock and list.
	recent *[recentNames]demangled
}

type demangled struct{ raw, name string }

const recentNames = 64

// Open returns a handle on the object held by bin (the binary: code,
// symbol tables, pclntab) and debug (a separate debug file: DWARF); either
// may be empty, not both. The files are opened and indexed on first use and
// shared by every later caller naming the same files (by device, inode,
// size and modification time, so a rebuilt file is reopened). The error
// carries a reason (frame.ErrNotFound, frame.ErrCorruptFile, ...).
func (r *Resolver) Open(ctx context.Context, bin, debug string) (*Handle, error) {
	if bin == "" && debug == "" {
		return nil, fmt.Errorf("no file to open: %w", frame.ErrNotFound)
	}
	key, err := filesKey(bin, debug)
	if err != nil {
		return nil, err
	}
	var loaded *entry // what this call's load gave, usable even if degraded
	for {
		if e, ok := r.cache.Get(key); ok {
			switch {
			case e.obj == nil:
				if time.Since(e.failedAt) < r.opt.NegativeTTL {
					return nil, e.err
				}
				r.cache.Remove(key)
			case e != loaded && (frame.Transient(e.obj.why) || frame.Transient(e.obj.supErr)):
				// Opened without its DWARF while memory was busy: the
				// callers of that load use it, later ones try again.
				r.cache.Remove(key)
			default:
				e.obj.acquire()
				if !e.obj.retired.Load() {
					return &Handle{r: r, key: key, obj: e.obj}, nil
				}
				e.obj.release()
				continue
			}
		}
		ch := r.group.DoChan(key, func() (any, error) {
			e := r.load(ctx, bin, debug)
			// A timeout belongs to the caller that waited, not to the files.
			if e.obj != nil || !frame.Transient(e.err) {
				r.cache.Add(key, e)
			}
			if e.obj != nil && r.closed.Load() {
				// Closed meanwhile: nobody would purge it.
				r.cache.Remove(key)
				e = &entry{err: fmt.Errorf("resolver closed: %w", frame.ErrNotFound), failedAt: time.Now()}
			}
			return e, nil
		})
		select {
		case res := <-ch:
			e := res.Val.(*entry)
			if e.obj == nil {
				return nil, e.err
			}
			loaded = e
			// Loop to pin the object through the cache.
		case <-ctx.Done():
			if r.opt.LoadTimeout > 0 {
				return nil, fmt.Errorf("still opening: %w: %v", frame.ErrPending, ctx.Err())
			}
			return nil, fmt.Errorf("%w: %v", frame.ErrTimeout, ctx.Err())
		}
	}
}

// filesKey identifies the files' contents as they are now.
func filesKey(bin, debug string) (string, error) {
	var k string
	for _, p := range []string{bin, debug} {
		if p == "" {
			k += "|"
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, classify(err))
		}
		if !st.Mode().IsRegular() {
			return "", fmt.Errorf("%s: not a regular file: %w", p, frame.ErrInvalidPath)
		}
		k += filever.Of(p, st).String() + "|"
	}
	return k, nil
}

func (r *Resolver) load(ctx context.Context, bin, debug string) *entry {
	if r.opt.LoadTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.opt.LoadTimeout)
		defer cancel()
	}
	if r.loads != nil {
		select {
		case r.loads <- struct{}{}:
			defer func() { <-r.loads }()
		case <-ctx.Done():
			return &entry{err: fmt.Errorf("waiting to open: %w: %v", frame.ErrTimeout, ctx.Err()), failedAt: time.Now()}
		}
	}
	open := r.opt.Open
	if open == nil {
		open = elfx.OpenContext
	}
	o, err := openObject(ctx, bin, debug, r.opt.Limits, open, r.sups, r.opt.Split)
	if err != nil {
		return &entry{err: err, failedAt: time.Now()}
	}
	if o.dwarf != nil {
		r.parsed.Add(1)
	}
	return &entry{obj: o}
}

// BuildID returns the object's GNU build id, if it has one.
func (h *Handle) BuildID() []byte { return h.obj.buildID }

// Lookup appends the frames of one address to dst, innermost first. An
// unresolved address leaves dst as it was and returns the reason.
func (h *Handle) Lookup(addr uint64, dst []Frame) ([]Frame, error) {
	raw, missing, err := h.obj.lookup(addr, &h.r.opt, h.scratch[:0])
	h.scratch, h.missing = raw, missing
	for _, f := range raw {
		name := f.Name
		if h.r.opt.Demangle && demangle.Mangled(name) {
			name = h.demangle(name)
		}
		dst = append(dst, Frame{Frame: f, Function: name})
	}
	return dst, err
}

// demangle is the resolver's demangled-name cache behind the handle's
// recent names.
func (h *Handle) demangle(raw string) string {
	if h.recent == nil {
		h.recent = new([recentNames]demangled)
	}
	p := uintptr(unsafe.Pointer(unsafe.StringData(raw)))
	d := &h.recent[(p>>3^p>>11^uintptr(len(raw)))%recentNames]
	if d.raw == raw && d.raw != "" {
		return d.name
	}
	d.raw, d.name = raw, h.r.dm.Name(raw)
	return d.name
}

// Prefetch starts parsing, in the background on up to workers goroutines
// (0: one per CPU), the DWARF units that hold addrs, so that Lookups of
// those addresses that follow find them parsed, or wait only for the unit
// in progress. It returns at once and the object stays pinned until the
// work is done; answers are the same with or without it.
func (h *Handle) Prefetch(addrs []uint64, workers int) {
	if h.obj.dwarf == nil || len(addrs) == 0 {
		return
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	o := h.obj
	o.acquire()
	o.dwarf.Prefetch(addrs, workers, o.release)
}

// Close releases the handle and lets the cache account for what it parsed.
func (h *Handle) Close() {
	if h.obj == nil {
		return
	}
	h.obj.release()
	h.r.cache.Touch(h.key)
	h.obj = nil
}

// Result is the answer for one address.
type Result struct {
	Frames []Frame // innermost first; empty when unresolved
	Err    error   // why it is unresolved (nil when resolved)
}

// Symbolize resolves a batch of addresses of one object (see Open). An
// object that cannot be opened yields the same error for every address.
func (r *Resolver) Symbolize(ctx context.Context, bin, debug string, addrs []uint64) []Result {
	out := make([]Result, len(addrs))
	h, err := r.Open(ctx, bin, debug)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	defer h.Close()
	for i, a := range addrs {
		if i&1023 == 0 && ctx.Err() != nil {
			for j := i; j < len(addrs); j++ {
				out[j].Err = fmt.Errorf("%w: %v", frame.ErrTimeout, ctx.Err())
			}
			break
		}
		out[i].Frames, out[i].Err = h.Lookup(a, nil)
	}
	return out
}

// Missing says why the frames the last Lookup returned lack what the
// object's debug info holds: they were named from a symbol table because
// its DWARF could not be used (frame.ErrLimitExceeded when decompressing
// it would pass Limits.MaxDecompressedBytes, frame.ErrCorruptFile, a debug
// file of another build, ...), or its DWARF answered without the dwz
// common file it points into (not found, pending, of another build). It
// is nil when the answer is whole, when nothing named the address, and
// when the object simply has no debug info.
func (h *Handle) Missing() error { return h.missing }

// IsUnresolved reports whether err only says that nothing names the address
// (as opposed to a broken or missing file).
func IsUnresolved(err error) bool { return errors.Is(err, frame.ErrNoDebugInfo) }

// HasDebugInfo reports whether the object has DWARF or a Go pclntab, i.e.
// whether answers can carry files and lines rather than symbol names only.
func (h *Handle) HasDebugInfo() bool {
	return h.obj.dwarf != nil || h.obj.gopcln != nil || h.obj.idx != nil
}

// Indexed reports whether the handle answers from a symbol index.
func (h *Handle) Indexed() bool { return h.obj.idx != nil }

// Why explains missing debug info (nil when the object has DWARF).
func (h *Handle) Why() error { return h.obj.why }

// ImageBase is the ELF address of the image base that remote frames'
// offsets count from. A profiler's image base is the start of the file's
// first mapping with file offset 0, which maps the PT_LOAD holding file
// offset 0, so its ELF address is that segment's p_vaddr, page aligned
// (0 for PIE executables and shared libraries, 0x400000 for a classic
// non-PIE x86-64 executable). Without such a segment, the lowest PT_LOAD.
func (h *Handle) ImageBase() uint64 {
	if h.obj.idx != nil {
		return h.obj.idx.Meta().ImageBase
	}
	for _, f := range []*elfx.File{h.obj.bin, h.obj.dbg} {
		if f == nil {
			continue
		}
		base, found := ^uint64(0), false
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD {
				continue
			}
			if p.Off&^0xfff == 0 {
				return p.Vaddr &^ 0xfff
			}
			if p.Vaddr < base {
				base, found = p.Vaddr, true
			}
		}
		if found {
			return base &^ 0xfff
		}
	}
	return 0
}

// SymbolValue returns the address of the named symbol in the object's
// symbol tables (the binary's, then the debug file's).
func (h *Handle) SymbolValue(name string) (uint64, bool) {
	if x := h.obj.idx; x != nil {
		// An index keeps the one symbol the processor asks for.
		m := x.Meta()
		return m.Stext, name == "_stext" && m.Flags&symindex.FlagStext != 0
	}
	for _, t := range []*symtab.Table{h.obj.syms, h.obj.dbgSyms} {
		if t != nil {
			if v, ok := t.Find(name); ok {
				return v, true
			}
		}
	}
	return 0, false
}
