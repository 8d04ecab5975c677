// Package otlpsym symbolizes OTLP profiles and ProfileEvent logs in place:
// raw native frames, known only by the build id of their file and an ELF
// address (docs/frame-format.md), get functions, files, lines and inlined
// frames from the engine in internal/symbolize. The symbolization processor,
// `profsym resolve` and `profsym record --symbolize` are thin adapters over
// it. Frames that cannot be resolved keep their address and get a reason;
// samples are never dropped or changed.
package otlpsym

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/pdict"
	"github.com/profsym/profsym/internal/symbol"
	"github.com/profsym/profsym/internal/symbolize"
)

// Attribute keys of the frame format.
const (
	AttrBuildIDGNU  = "process.executable.build_id.gnu"
	AttrBuildIDGo   = "process.executable.build_id.go"
	AttrBuildIDHTL  = "process.executable.build_id.htlhash"
	AttrFrameType   = "profile.frame.type"
	AttrError       = "profsym.symbolization.error"
	AttrHasFuncs    = "pprof.mapping.has_functions"
	AttrHasFiles    = "pprof.mapping.has_filenames"
	AttrHasLines    = "pprof.mapping.has_line_numbers"
	AttrHasInlines  = "pprof.mapping.has_inline_frames"
	FrameTypeNative = "native"
	FrameTypeKernel = "kernel"
)

// Locator finds files by GNU build id (debuginfod).
type Locator interface {
	Locate(ctx context.Context, buildID string) (binPath, debugPath string, err error)
}

// Options configure a Symbolizer.
type Options struct {
	Sources     []string // order of sources (DefaultSources when empty)
	LocalRoot   string   // prefix for mapping paths of the local source ("" or "/": as is)
	DebugDirs   []string // .build-id trees
	SymbolDirs  []string // folders indexed by identity
	Rescan      time.Duration
	Debuginfod  Locator // nil: no debuginfod
	Demangle    bool
	Inlines     bool
	Lines       bool
	CacheBytes  int64         // parsed objects
	MaxEntries  int           // resolved (object, address) results
	Timeout     time.Duration // bound on finding and opening objects per batch
	NegativeTTL time.Duration
	MaxParallel int
	Logger      *zap.Logger
}

// Stats counts what one call did.
type Stats struct {
	Resolved    int64
	Unresolved  map[string]int64 // by reason
	CacheHits   int64
	CacheMisses int64
	Skipped     int64 // already named, or not native
}

func (s *Stats) unresolved(reason string) {
	if s.Unresolved == nil {
		s.Unresolved = map[string]int64{}
	}
	s.Unresolved[reason]++
}

// Symbolizer is safe for concurrent use.
type Symbolizer struct {
	opt     Options
	engine  *symbolize.Resolver
	results *lru.Cache[resultKey, *result]
	symdirs *dirIndex
	idents  identifier
	log     *zap.Logger
}

type resultKey struct {
	obj  string
	addr uint64
}

// result is a resolved address, independent of any batch's dictionary.
type result struct {
	frames []symbolize.Frame
	err    error
}

// New builds a Symbolizer.
func New(opt Options) *Symbolizer {
	if len(opt.Sources) == 0 {
		opt.Sources = DefaultSources
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 10 * time.Second
	}
	if opt.MaxEntries <= 0 {
		opt.MaxEntries = 1 << 20
	}
	if opt.MaxParallel <= 0 {
		opt.MaxParallel = 4
	}
	if opt.Rescan <= 0 {
		opt.Rescan = 30 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	eo := symbolize.Options{
		Inlines:        opt.Inlines,
		Demangle:       opt.Demangle,
		UseSymbolTable: true,
		DebugDirs:      opt.DebugDirs,
		CacheBytes:     opt.CacheBytes,
		NegativeTTL:    opt.NegativeTTL,
	}
	return &Symbolizer{
		opt:     opt,
		engine:  symbolize.New(eo),
		results: lru.New[resultKey, *result](0, opt.MaxEntries, nil, nil),
		symdirs: newDirIndex(opt.SymbolDirs, opt.Rescan),
		log:     opt.Logger,
	}
}

// Close releases cached objects.
func (s *Symbolizer) Close() error { return s.engine.Close() }

// CacheStats reports the object cache and the result cache.
func (s *Symbolizer) CacheStats() (objects, results lru.Stats) {
	return s.engine.CacheStats(), s.results.Stats()
}

// work is one raw location to resolve.
type work struct {
	loc      int32
	obj      *objRef
	addr     uint64
	relative bool // addr is an offset from the image base (remote frames)
}

// objRef is one object of a batch: the identity of a mapping's file.
type objRef struct {
	id   ids
	file string // path recorded in the mapping
	key  string
	h    *symbolize.Handle
	err  error
}

// Profiles symbolizes every raw native location of pd in place.
func (s *Symbolizer) Profiles(ctx context.Context, pd pprofile.Profiles) Stats {
	var st Stats
	d := pdict.New(pd.Dictionary())
	locs := d.D.LocationTable()
	maps := d.D.MappingTable()

	objs := map[string]*objRef{}
	mapObj := map[int32]*objRef{} // mapping index -> object (nil: not symbolizable)
	var todo []work
	for i := 1; i < locs.Len(); i++ {
		loc := locs.At(i)
		if loc.Lines().Len() > 0 {
			if w, ok := s.remoteFrame(d, int32(i), objs); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		if v, ok := d.FindAttr(loc.AttributeIndices(), AttrFrameType); ok && v.Str() != FrameTypeNative && v.Str() != "" {
			st.Skipped++
			continue
		}
		mi := loc.MappingIndex()
		o, seen := mapObj[mi]
		if !seen {
			o = s.mappingObject(d, mi, objs)
			mapObj[mi] = o
		}
		if o == nil {
			st.Skipped++
			continue
		}
		todo = append(todo, work{loc: int32(i), obj: o, addr: loc.Address()})
	}
	if len(todo) == 0 {
		return st
	}

	// Answers from the result cache first; open objects only for misses.
	answers := make([]*result, len(todo))
	need := map[*objRef]bool{}
	for i, w := range todo {
		if w.relative {
			need[w.obj] = true // the base is only known once the object is open
			st.CacheMisses++
			continue
		}
		if r, ok := s.results.Get(resultKey{w.obj.key, w.addr}); ok {
			answers[i] = r
			st.CacheHits++
			continue
		}
		st.CacheMisses++
		need[w.obj] = true
	}
	s.openAll(ctx, need)
	defer func() {
		for o := range need {
			if o.h != nil {
				o.h.Close()
			}
		}
	}()

	touched := map[int32]*mappingFlags{}
	var buf []symbolize.Frame
	for i, w := range todo {
		r := answers[i]
		if r == nil {
			r = &result{}
			if w.obj.err != nil {
				r.err = w.obj.err
			} else {
				var err error
				addr := w.addr
				if w.relative {
					addr += w.obj.h.ImageBase()
				}
				buf, err = w.obj.h.Lookup(addr, buf[:0])
				if len(buf) > 0 {
					r.frames = append([]symbolize.Frame(nil), buf...)
				} else {
					r.err = err
					if r.err == nil || symbolize.IsUnresolved(r.err) {
						r.err = fmt.Errorf("address %#x: %w", w.addr, symbol.ErrNoDebugInfo)
					}
				}
			}
			// Transient failures (fetch, timeout) are not remembered here:
			// the next batch retries once the object is available.
			if !w.relative && (r.err == nil || !transient(r.err)) {
				s.results.Add(resultKey{w.obj.key, w.addr}, r)
			}
		}
		loc := locs.At(int(w.loc))
		if r.err != nil && w.relative {
			// A remote frame keeps its "<remote>" line: that is its only
			// record of build id and offset.
			st.unresolved(symbol.Reason(r.err))
			if _, has := d.FindAttr(loc.AttributeIndices(), AttrError); !has {
				loc.AttributeIndices().Append(d.AttrStr(AttrError, symbol.Reason(r.err)))
			}
			continue
		}
		if r.err != nil {
			reason := symbol.Reason(r.err)
			st.unresolved(reason)
			if _, has := d.FindAttr(loc.AttributeIndices(), AttrError); !has {
				loc.AttributeIndices().Append(d.AttrStr(AttrError, reason))
			}
			continue
		}
		st.Resolved++
		s.setLines(d, loc, r.frames)
		f := touched[loc.MappingIndex()]
		if f == nil {
			f = &mappingFlags{}
			touched[loc.MappingIndex()] = f
		}
		f.add(r.frames)
	}
	for mi, f := range touched {
		if mi > 0 && int(mi) < maps.Len() {
			f.apply(d, maps.At(int(mi)))
		}
	}
	return st
}

func transient(err error) bool {
	return errors.Is(err, symbol.ErrTimeout) || errors.Is(err, symbol.ErrFetchFailed)
}

// mappingObject returns the object of mapping mi, or nil when the mapping
// carries no identity we can look up.
func (s *Symbolizer) mappingObject(d *pdict.Dict, mi int32, objs map[string]*objRef) *objRef {
	maps := d.D.MappingTable()
	if mi <= 0 || int(mi) >= maps.Len() {
		return nil
	}
	m := maps.At(int(mi))
	var id ids
	if v, ok := d.FindAttr(m.AttributeIndices(), AttrBuildIDGNU); ok {
		id.gnu = strings.ToLower(v.AsString())
	}
	if v, ok := d.FindAttr(m.AttributeIndices(), AttrBuildIDGo); ok {
		id.goid = v.AsString()
	}
	if v, ok := d.FindAttr(m.AttributeIndices(), AttrBuildIDHTL); ok {
		id.htl = strings.ToLower(v.AsString())
	}
	key := id.key()
	if key == "" {
		return nil
	}
	if o, ok := objs[key]; ok {
		return o
	}
	o := &objRef{id: id, file: d.Str(m.FilenameStrindex()), key: key}
	objs[key] = o
	return o
}

// openAll opens the objects of a batch in parallel, bounded in time by
// Options.Timeout so a dead or slow source costs at most that per batch.
func (s *Symbolizer) openAll(ctx context.Context, need map[*objRef]bool) {
	ctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	sem := make(chan struct{}, s.opt.MaxParallel)
	var wg sync.WaitGroup
	for o := range need {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				o.err = fmt.Errorf("%s: %w: %v", o.key, symbol.ErrTimeout, ctx.Err())
				return
			}
			defer func() { <-sem }()
			o.h, o.err = s.open(ctx, o)
		}()
	}
	wg.Wait()
}

// open finds and opens one object, trying the configured sources in order.
// A local binary without debug info is paired with a debug file found by
// build id, so stripped binaries on the host still get lines.
func (s *Symbolizer) open(ctx context.Context, o *objRef) (*symbolize.Handle, error) {
	var local *symbolize.Handle
	var firstErr error
	if s.useLocal() && filepath.IsAbs(o.file) {
		p := filepath.Join(s.opt.LocalRoot, o.file)
		if fid, err := s.idents.identify(p); err == nil && fid.matches(o.id) {
			h, err := s.engine.Open(ctx, symbolize.Target{Path: p, BuildID: o.id.gnu})
			if err == nil && h.HasDebugInfo() {
				return h, nil
			}
			local = h
			if err != nil {
				firstErr = err
			}
		} else if err == nil {
			firstErr = fmt.Errorf("%s: local file is another build: %w", p, symbol.ErrBuildIDMismatch)
		}
	}
	bin, dbg, err := s.locate(ctx, o.id)
	if err != nil || (bin == "" && dbg == "") {
		if local != nil {
			return local, nil // symbol tables only, still better than nothing
		}
		if err == nil || errors.Is(err, symbol.ErrNotFound) && firstErr != nil {
			err = firstErr
		}
		if err == nil {
			err = fmt.Errorf("%s: %w", o.key, symbol.ErrNoDebugInfo)
		}
		if errors.Is(err, symbol.ErrNotFound) {
			err = fmt.Errorf("%s: no file or debug info found: %w (%v)", o.key, symbol.ErrNoDebugInfo, err)
		}
		return nil, err
	}
	t := symbolize.Target{Path: bin, DebugPath: dbg, BuildID: o.id.gnu}
	if local != nil {
		t.Path = filepath.Join(s.opt.LocalRoot, o.file)
		local.Close()
	}
	return s.engine.Open(ctx, t)
}

func (s *Symbolizer) useLocal() bool {
	for _, src := range s.opt.Sources {
		if src == SourceLocal {
			return true
		}
	}
	return false
}

// setLines writes frames (innermost first) as the location's lines.
func (s *Symbolizer) setLines(d *pdict.Dict, loc pprofile.Location, frames []symbolize.Frame) {
	lines := loc.Lines()
	lines.RemoveIf(func(pprofile.Line) bool { return true })
	for _, f := range frames {
		file := f.File
		line, col := int64(f.Line), int64(f.Column)
		if !s.opt.Lines {
			line, col = 0, 0
		}
		fn := d.Function(f.Function, f.Name, file, int64(f.StartLine))
		l := lines.AppendEmpty()
		l.SetFunctionIndex(fn)
		l.SetLine(line)
		l.SetColumn(col)
	}
}

// mappingFlags accumulates what symbolization found for one mapping.
type mappingFlags struct {
	funcs, files, lines, inlines bool
}

func (f *mappingFlags) add(frames []symbolize.Frame) {
	for _, fr := range frames {
		f.funcs = f.funcs || fr.Function != ""
		f.files = f.files || fr.File != ""
		f.lines = f.lines || fr.Line != 0
	}
	f.inlines = f.inlines || len(frames) > 1
}

func (f *mappingFlags) apply(d *pdict.Dict, m pprofile.Mapping) {
	set := func(key string, v bool) {
		if !v {
			return
		}
		if old, ok := d.FindAttr(m.AttributeIndices(), key); ok && old.Bool() {
			return
		}
		m.AttributeIndices().Append(d.AttrBool(key, true))
	}
	set(AttrHasFuncs, f.funcs)
	set(AttrHasFiles, f.files)
	set(AttrHasLines, f.lines)
	set(AttrHasInlines, f.inlines)
}
