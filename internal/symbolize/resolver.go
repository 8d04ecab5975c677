// Package symbolize is profsym's symbolization engine: it turns ELF virtual
// addresses of a binary, named by path or by build id, into frames (function,
// file, line, column, inlined callers), choosing per binary the best source
// available (DWARF from the binary or its separate debug file, Go's pclntab,
// the ELF symbol tables) and holding parsed objects in a cache bounded in
// bytes. It is safe for concurrent use.
package symbolize

import (
	"context"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/symbolize/demangle"
	"github.com/profsym/profsym/internal/symbolize/symtab"
)

// DefaultCacheBytes bounds the memory of parsed objects when unset.
const DefaultCacheBytes = 512 << 20

// DefaultDebugDir is where distributions install separate debug files.
const DefaultDebugDir = "/usr/lib/debug"

// Options configure a Resolver.
type Options struct {
	Inlines        bool // return inlined frames, innermost first
	Demangle       bool // fill Frame.Function with demangled names
	UseSymbolTable bool // name the outermost frame from .symtab/.dynsym, like llvm-symbolizer
	DebugDirs      []string
	CacheBytes     int64         // bound on parsed objects (0: DefaultCacheBytes)
	NegativeTTL    time.Duration // how long a failed open is remembered (0: 1 minute)
	// Locator finds files by build id; nil searches DebugDirs only.
	Locator Locator
}

// DefaultOptions are llvm-symbolizer's defaults.
func DefaultOptions() Options {
	return Options{Inlines: true, Demangle: true, UseSymbolTable: true, DebugDirs: []string{DefaultDebugDir}}
}

// Locator finds the files of an object known only by its build id. Either
// path may be empty; both empty means not found.
type Locator interface {
	Locate(ctx context.Context, buildID string) (binPath, debugPath string, err error)
}

// Target names an object: by path, by GNU build id (hex), or both.
type Target struct {
	Path    string
	BuildID string
	// DebugPath, when set, is used as the debug file instead of searching.
	DebugPath string
}

func (t Target) String() string {
	if t.Path != "" {
		return t.Path
	}
	return "BUILDID:" + t.BuildID
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
	dm    demangle.Cache
	cache *lru.Cache[string, *entry]

	mu       sync.Mutex
	inflight map[string]*load
}

type entry struct {
	obj      *object
	err      error
	failedAt time.Time
}

type load struct {
	done chan struct{}
	e    *entry
}

// New makes a Resolver.
func New(opt Options) *Resolver {
	if opt.CacheBytes <= 0 {
		opt.CacheBytes = DefaultCacheBytes
	}
	if opt.NegativeTTL <= 0 {
		opt.NegativeTTL = time.Minute
	}
	r := &Resolver{opt: opt, inflight: map[string]*load{}}
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

// Options returns the resolver's options.
func (r *Resolver) Options() Options { return r.opt }

// CacheStats reports the object cache's counters.
func (r *Resolver) CacheStats() lru.Stats { return r.cache.Stats() }

// Close drops every cached object.
func (r *Resolver) Close() error {
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
}

// Open returns a handle on t's object, opening and indexing it on first use.
// The error carries a reason (frame.ErrNotFound, ErrCorruptFile, ...).
func (r *Resolver) Open(ctx context.Context, t Target) (*Handle, error) {
	key, err := r.key(t)
	if err != nil {
		return nil, err
	}
	for {
		if e, ok := r.cache.Get(key); ok {
			if e.obj == nil {
				if time.Since(e.failedAt) < r.opt.NegativeTTL {
					return nil, e.err
				}
				r.cache.Remove(key)
			} else {
				e.obj.acquire()
				if !e.obj.retired.Load() {
					return &Handle{r: r, key: key, obj: e.obj}, nil
				}
				e.obj.release()
				continue
			}
		}
		r.mu.Lock()
		if l, ok := r.inflight[key]; ok {
			r.mu.Unlock()
			select {
			case <-l.done:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %v", frame.ErrTimeout, ctx.Err())
			}
		}
		l := &load{done: make(chan struct{})}
		r.inflight[key] = l
		r.mu.Unlock()

		e := r.load(ctx, t)
		r.cache.Add(key, e)
		r.mu.Lock()
		delete(r.inflight, key)
		r.mu.Unlock()
		close(l.done)
		if e.obj == nil {
			return nil, e.err
		}
	}
}

func (r *Resolver) key(t Target) (string, error) {
	switch {
	case t.Path != "":
		st, err := os.Stat(t.Path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", t.Path, classify(err))
		}
		// Identity includes size and mtime so a rebuilt file is reopened.
		return fmt.Sprintf("p:%s:%d:%d:%s:%s", t.Path, st.Size(), st.ModTime().UnixNano(), t.BuildID, t.DebugPath), nil
	case t.DebugPath != "":
		// Only a debug file is known (fetched or found by build id).
		st, err := os.Stat(t.DebugPath)
		if err != nil {
			return "", fmt.Errorf("%s: %w", t.DebugPath, classify(err))
		}
		return fmt.Sprintf("d:%s:%d:%d", t.DebugPath, st.Size(), st.ModTime().UnixNano()), nil
	case t.BuildID != "":
		id := strings.ToLower(t.BuildID)
		if _, err := hex.DecodeString(id); err != nil || len(id) < 2 {
			return "", fmt.Errorf("build id %q is not hex: %w", t.BuildID, frame.ErrNotFound)
		}
		return "b:" + id, nil
	}
	return "", fmt.Errorf("no path or build id: %w", frame.ErrNotFound)
}

func (r *Resolver) load(ctx context.Context, t Target) *entry {
	bin, dbg := t.Path, t.DebugPath
	if bin == "" && dbg == "" {
		var err error
		bin, dbg, err = r.locate(ctx, strings.ToLower(t.BuildID))
		if err != nil {
			return &entry{err: err, failedAt: time.Now()}
		}
	}
	o, err := openObject(bin, dbg, r.opt.DebugDirs)
	if err != nil {
		return &entry{err: err, failedAt: time.Now()}
	}
	if t.Path != "" && t.BuildID != "" && len(o.buildID) > 0 && hex.EncodeToString(o.buildID) != strings.ToLower(t.BuildID) {
		o.closeFiles()
		return &entry{err: fmt.Errorf("%s has build id %x, want %s: %w", t.Path, o.buildID, t.BuildID, frame.ErrBuildIDMismatch), failedAt: time.Now()}
	}
	return &entry{obj: o}
}

func (r *Resolver) locate(ctx context.Context, id string) (string, string, error) {
	if r.opt.Locator != nil {
		b, d, err := r.opt.Locator.Locate(ctx, id)
		if err != nil || b != "" || d != "" {
			return b, d, err
		}
	}
	b, d := LocateInDirs(id, r.opt.DebugDirs)
	if b == "" && d == "" {
		return "", "", fmt.Errorf("build id %s: no file in %v: %w", id, r.opt.DebugDirs, frame.ErrNotFound)
	}
	return b, d, nil
}

// LocateInDirs looks a build id up in .build-id trees: ab/cdef.debug is the
// debug file, ab/cdef (no suffix) the binary where distributions link it.
func LocateInDirs(id string, dirs []string) (binPath, debugPath string) {
	if len(id) < 3 {
		return "", ""
	}
	for _, d := range dirs {
		p := filepath.Join(d, ".build-id", id[:2], id[2:])
		if debugPath == "" {
			if st, err := os.Stat(p + ".debug"); err == nil && st.Mode().IsRegular() {
				debugPath = p + ".debug"
			}
		}
		if binPath == "" {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				binPath = p
			}
		}
	}
	return binPath, debugPath
}

// BuildID returns the object's GNU build id, if it has one.
func (h *Handle) BuildID() []byte { return h.obj.buildID }

// Lookup appends the frames of one address to dst, innermost first. An
// unresolved address leaves dst as it was and returns the reason.
func (h *Handle) Lookup(addr uint64, dst []Frame) ([]Frame, error) {
	raw, err := h.obj.lookup(addr, &h.r.opt, h.scratch[:0])
	h.scratch = raw
	for _, f := range raw {
		name := f.Name
		if h.r.opt.Demangle {
			name = h.r.dm.Name(name)
		}
		dst = append(dst, Frame{Frame: f, Function: name})
	}
	return dst, err
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

// Symbolize resolves a batch of addresses of one object. An object that
// cannot be opened yields the same error for every address.
func (r *Resolver) Symbolize(ctx context.Context, t Target, addrs []uint64) []Result {
	out := make([]Result, len(addrs))
	h, err := r.Open(ctx, t)
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

// IsUnresolved reports whether err only says that nothing names the address
// (as opposed to a broken or missing file).
func IsUnresolved(err error) bool { return errors.Is(err, frame.ErrNoDebugInfo) }

// HasDebugInfo reports whether the object has DWARF or a Go pclntab, i.e.
// whether answers can carry files and lines rather than symbol names only.
func (h *Handle) HasDebugInfo() bool { return h.obj.dwarf != nil || h.obj.gopcln != nil }

// Why explains missing debug info (nil when the object has DWARF).
func (h *Handle) Why() error { return h.obj.why }

// ImageBase is the ELF address of the image base that remote frames'
// offsets count from. A profiler's image base is the start of the file's
// first mapping with file offset 0, which maps the PT_LOAD holding file
// offset 0, so its ELF address is that segment's p_vaddr, page aligned
// (0 for PIE executables and shared libraries, 0x400000 for a classic
// non-PIE x86-64 executable). Without such a segment, the lowest PT_LOAD.
func (h *Handle) ImageBase() uint64 {
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
	for _, t := range []*symtab.Table{h.obj.syms, h.obj.dbgSyms} {
		if t != nil {
			if v, ok := t.Find(name); ok {
				return v, true
			}
		}
	}
	return 0, false
}
