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

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize"
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
	results *lru.Clock[resultKey, *result]
	symdirs *dirIndex
	idents  identifier
	log     *zap.Logger

	mu     sync.Mutex
	funcs  map[funcTuple]*funcTuple
	objIDs map[string]uint32
}

// resultKey packs an interned object number (16 bits) and an address (48
// bits) into one word, so the big result map hashes a uint64. Addresses
// that do not fit (kernel addresses) are not cached.
type resultKey uint64

func keyOf(obj uint32, addr uint64) (resultKey, bool) {
	if addr>>48 != 0 || obj >= 1<<16 {
		return 0, false
	}
	return resultKey(uint64(obj)<<48 | addr), true
}

// maxObjects bounds interned object numbers to the 16 bits a key holds.
const maxObjects = 1<<16 - 1

// result is a resolved address, independent of any batch's dictionary:
// lines point at interned functions so that a batch maps them to its
// dictionary with one pointer-keyed lookup, and a cached result is small.
type result struct {
	lines []rline // innermost first
	err   error
}

type rline struct {
	fn        *funcTuple
	line, col uint32
}

// funcTuple is a function as the dictionary records it.
type funcTuple struct {
	name, system, file string
	startLine          int64
}

// maxInterned bounds the interning tables; past it they start over (old
// results keep their pointers, they are just no longer shared).
const maxInterned = 1 << 20

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
		results: lru.NewClock[resultKey, *result](opt.MaxEntries),
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
	loc  int32
	obj  *objRef
	addr uint64
	tr   translation // how addr becomes an ELF address once the object is open
}

// objRef is one object of a batch: the identity of a mapping's file.
type objRef struct {
	id   ids
	file string // path recorded in the mapping
	key  string
	num  uint32 // interned key, for the result cache
	h    *symbolize.Handle
	err  error

	// Translation bases, looked up once per batch rather than per frame
	// (finding _stext scans the symbol table).
	base, stext                uint64
	stextOK, baseSet, stextSet bool
}

// objNum interns an object key.
func (s *Symbolizer) objNum(key string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objIDs == nil || len(s.objIDs) >= maxObjects {
		// Starting over makes old cache entries unreachable; they age out.
		s.objIDs = map[string]uint32{}
	}
	n, ok := s.objIDs[key]
	if !ok {
		n = uint32(len(s.objIDs)) + 1
		s.objIDs[key] = n
	}
	return n
}

func (s *Symbolizer) intern(f funcTuple) *funcTuple {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.funcs[f]; ok {
		return p
	}
	if s.funcs == nil || len(s.funcs) > maxInterned {
		s.funcs = map[funcTuple]*funcTuple{}
	}
	p := &f
	s.funcs[f] = p
	return p
}

// resolve answers one address of an open (or failed) object through the
// result cache. Transient failures (fetch, timeout) are not cached, so the
// next batch retries once the object is available.
func (s *Symbolizer) resolve(o *objRef, addr uint64, tr translation, buf *[]symbolize.Frame, st *Stats) *result {
	if k, ok := keyOf(o.num, addr); ok && tr.kind == asIs {
		if r, ok := s.results.Get(k); ok {
			st.CacheHits++
			return r
		}
	}
	return s.lookup(o, addr, tr, buf, st)
}

// translation turns a location's address into the object's ELF address.
type translation struct {
	kind uint8
	from uint64 // kernelText: the run-time _stext
}

const (
	asIs       uint8 = iota // already an ELF virtual address
	imageBase               // an offset from the lowest PT_LOAD (remote frames)
	kernelText              // a run-time kernel address: minus run-time _stext, plus vmlinux's
)

func (t translation) apply(o *objRef, addr uint64) (uint64, error) {
	switch t.kind {
	case imageBase:
		if !o.baseSet {
			o.base, o.baseSet = o.h.ImageBase(), true
		}
		return addr + o.base, nil
	case kernelText:
		if !o.stextSet {
			o.stext, o.stextOK = o.h.SymbolValue("_stext")
			o.stextSet = true
		}
		if !o.stextOK {
			return 0, fmt.Errorf("vmlinux has no _stext symbol: %w", frame.ErrNoDebugInfo)
		}
		return addr - t.from + o.stext, nil
	}
	return addr, nil
}

// lookup asks the engine (the result cache missed) and caches the answer.
func (s *Symbolizer) lookup(o *objRef, addr uint64, tr translation, buf *[]symbolize.Frame, st *Stats) *result {
	k, cacheable := keyOf(o.num, addr)
	st.CacheMisses++
	r := &result{err: o.err}
	var terr error
	if o.h != nil {
		addr, terr = tr.apply(o, addr)
	}
	if terr != nil {
		r.err = terr
	} else if o.h != nil {
		var err error
		*buf, err = o.h.Lookup(addr, (*buf)[:0])
		if len(*buf) > 0 {
			r.lines = make([]rline, len(*buf))
			for i, f := range *buf {
				line, col := f.Line, f.Column
				if !s.opt.Lines {
					line, col = 0, 0
				}
				r.lines[i] = rline{fn: s.intern(funcTuple{f.Function, f.Name, f.File, int64(f.StartLine)}), line: line, col: col}
			}
		} else {
			r.err = err
			if r.err == nil || symbolize.IsUnresolved(r.err) {
				r.err = fmt.Errorf("address %#x: %w", addr, frame.ErrNoDebugInfo)
			}
		}
	}
	if cacheable && tr.kind == asIs && (r.err == nil || !transient(r.err)) {
		s.results.Add(k, r)
	}
	return r
}

// Profiles symbolizes every raw native location of pd in place.
func (s *Symbolizer) Profiles(ctx context.Context, pd pprofile.Profiles) Stats {
	var st Stats
	d := pdict.New(pd.Dictionary())
	locs := d.D.LocationTable()
	maps := d.D.MappingTable()

	objs := map[string]*objRef{}
	mapObj := make([]*objRef, maps.Len()) // by mapping index; nil: not symbolizable
	mapSeen := make([]bool, maps.Len())
	todo := make([]work, 0, locs.Len())
	frameType := d.StringIndex(frame.AttrFrameType)
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
		if v, ok := d.FindAttrKey(loc.AttributeIndices(), frameType); ok && v.Str() != frame.TypeNative && v.Str() != "" {
			if w, ok := s.kernelFrame(d, v.Str(), int32(i), objs); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		mi := loc.MappingIndex()
		if mi <= 0 || int(mi) >= len(mapObj) {
			st.Skipped++
			continue
		}
		if !mapSeen[mi] {
			mapObj[mi] = s.mappingObject(d, mi, objs)
			mapSeen[mi] = true
		}
		o := mapObj[mi]
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
	need := map[*objRef]bool{}
	answers := make([]*result, len(todo))
	for i, w := range todo {
		if w.obj.num == 0 {
			w.obj.num = s.objNum(w.obj.key)
		}
		if w.tr.kind != asIs {
			need[w.obj] = true // the translation is only known once the object is open
			continue
		}
		if k, ok := keyOf(w.obj.num, w.addr); ok {
			if r, ok := s.results.Get(k); ok {
				answers[i] = r
				st.CacheHits++
				continue
			}
		}
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
	fnIdx := map[*funcTuple]int32{}
	var buf []symbolize.Frame
	for i, w := range todo {
		r := answers[i]
		if r == nil {
			r = s.lookup(w.obj, w.addr, w.tr, &buf, &st)
		}
		loc := locs.At(int(w.loc))
		if r.err != nil {
			reason := frame.Reason(r.err)
			st.unresolved(reason)
			// A remote frame keeps its "<remote>" line: that is its only
			// record of build id and offset.
			if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrError); !has {
				loc.AttributeIndices().Append(d.AttrStr(frame.AttrError, reason))
			}
			continue
		}
		st.Resolved++
		setLines(d, loc, r.lines, fnIdx)
		f := touched[loc.MappingIndex()]
		if f == nil {
			f = &mappingFlags{}
			touched[loc.MappingIndex()] = f
		}
		f.add(r.lines)
	}
	for mi, f := range touched {
		if mi > 0 && int(mi) < maps.Len() {
			f.apply(d, maps.At(int(mi)))
		}
	}
	return st
}

func transient(err error) bool {
	return errors.Is(err, frame.ErrTimeout) || errors.Is(err, frame.ErrFetchFailed)
}

// kernelFrame queues a raw kernel frame when the kernel source is on and
// its mapping says which vmlinux (build id) and where its text ran
// (memory_start is the run-time _stext).
func (s *Symbolizer) kernelFrame(d *pdict.Dict, ftype string, i int32, objs map[string]*objRef) (work, bool) {
	if ftype != frame.TypeKernel || !s.has(SourceKernel) {
		return work{}, false
	}
	loc := d.D.LocationTable().At(int(i))
	mi := loc.MappingIndex()
	if mi <= 0 || int(mi) >= d.D.MappingTable().Len() {
		return work{}, false
	}
	m := d.D.MappingTable().At(int(mi))
	v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGNU)
	if !ok || m.MemoryStart() == 0 || d.Str(m.FilenameStrindex()) != "[kernel.kallsyms]" {
		return work{}, false
	}
	id := strings.ToLower(v.AsString())
	key := "k:" + id
	o, seen := objs[key]
	if !seen {
		o = &objRef{id: ids{gnu: id}, file: "[kernel.kallsyms]", key: key}
		objs[key] = o
	}
	return work{loc: i, obj: o, addr: loc.Address(), tr: translation{kind: kernelText, from: m.MemoryStart()}}, true
}

func (s *Symbolizer) has(source string) bool {
	for _, src := range s.opt.Sources {
		if src == source {
			return true
		}
	}
	return false
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
	if v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGNU); ok {
		id.gnu = strings.ToLower(v.AsString())
	}
	if v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGo); ok {
		id.goid = v.AsString()
	}
	if v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDHTL); ok {
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
				o.err = fmt.Errorf("%s: %w: %v", o.key, frame.ErrTimeout, ctx.Err())
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
	if s.has(SourceLocal) && filepath.IsAbs(o.file) {
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
			firstErr = fmt.Errorf("%s: local file is another build: %w", p, frame.ErrBuildIDMismatch)
		}
	}
	bin, dbg, err := s.locate(ctx, o.id)
	if err != nil || (bin == "" && dbg == "") {
		if local != nil {
			return local, nil // symbol tables only, still better than nothing
		}
		if err == nil || errors.Is(err, frame.ErrNotFound) && firstErr != nil {
			err = firstErr
		}
		if err == nil {
			err = fmt.Errorf("%s: %w", o.key, frame.ErrNoDebugInfo)
		}
		if errors.Is(err, frame.ErrNotFound) {
			err = fmt.Errorf("%s: no file or debug info found: %w (%v)", o.key, frame.ErrNoDebugInfo, err)
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

// setLines writes a result (innermost first) as the location's lines.
func setLines(d *pdict.Dict, loc pprofile.Location, lines []rline, fnIdx map[*funcTuple]int32) {
	ls := loc.Lines()
	if ls.Len() > 0 { // a remote frame's placeholder line
		ls.RemoveIf(func(pprofile.Line) bool { return true })
	}
	if len(lines) > 1 {
		ls.EnsureCapacity(len(lines))
	}
	for _, l := range lines {
		fi, ok := fnIdx[l.fn]
		if !ok {
			fi = d.Function(l.fn.name, l.fn.system, l.fn.file, l.fn.startLine)
			fnIdx[l.fn] = fi
		}
		pl := ls.AppendEmpty()
		pl.SetFunctionIndex(fi)
		pl.SetLine(int64(l.line))
		pl.SetColumn(int64(l.col))
	}
}

// mappingFlags accumulates what symbolization found for one mapping.
type mappingFlags struct {
	funcs, files, lines, inlines bool
}

func (f *mappingFlags) add(lines []rline) {
	for _, l := range lines {
		f.funcs = f.funcs || l.fn.name != ""
		f.files = f.files || l.fn.file != ""
		f.lines = f.lines || l.line != 0
	}
	f.inlines = f.inlines || len(lines) > 1
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
	set(frame.AttrHasFunctions, f.funcs)
	set(frame.AttrHasFilenames, f.files)
	set(frame.AttrHasLineNumbers, f.lines)
	set(frame.AttrHasInlineFrames, f.inlines)
}
