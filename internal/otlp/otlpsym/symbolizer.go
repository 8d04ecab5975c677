// Package otlpsym symbolizes OTLP profiles and ProfileEvent logs in place:
// raw native frames, known only by the identity of their file (build id,
// htlhash) and an ELF address (docs/frame-format.md), get functions, files,
// lines and inlined frames. Files come from one locate chain
// (internal/locate), answers from the engine (internal/symbolize). It is the
// one symbolizer of profsym: the symbolization processor, `profsym resolve`
// and `profsym record --symbolize` are thin adapters over it. Frames that
// cannot be resolved keep their address and get a reason; samples are never
// dropped or changed. Input is treated as hostile: identities are validated,
// names are truncated, every cache is bounded.
package otlpsym

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/otlp/pdict"
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

// Symbolizer is safe for concurrent use.
type Symbolizer struct {
	opt    Options
	chain  *locate.Chain
	engine *symbolize.Resolver
	// results holds answers that cannot get better (from files with
	// DWARF); partial holds failures and answers from files short of DWARF,
	// each with its expiry. Lookups try results first: its entries are one
	// word of key and one pointer, so the hot path stays small.
	results *lru.Clock[uint64, *result]
	partial *lru.Clock[uint64, partialResult]
	log     *zap.Logger
	kernel  bool

	// Object numbers: an identity is interned to a number, which with an
	// address forms a result's key (number in the top 16 bits, address in
	// the low 48). Numbers are never reused within a generation; when they
	// run out, the generation ends and the numbers and both result caches
	// are cleared together, so a result cached for one object never answers
	// for another however many objects come and go. An identity evicted
	// from objNums gets a new number when it returns; its old results age
	// out unseen.
	objNums *lru.Cache[string, objNum]
	numMu   sync.Mutex // serializes the numbering below
	nextNum uint64
	genMu   sync.RWMutex // held for reading while keys of a generation are in use
	gen     uint64

	mu          sync.Mutex
	funcs       map[funcTuple]*funcTuple
	internBytes int64
}

// objNum is an identity's number and the generation it belongs to.
type objNum struct {
	num, gen uint64
}

// maxObjNum is the largest object number: a key keeps 16 bits for it.
const maxObjNum = 1<<16 - 1

// keyOf packs an object number and an address into one word, so the big
// result maps take their fast path. Addresses above 48 bits (kernel ones)
// are not cached.
func keyOf(num, addr uint64) (uint64, bool) {
	if addr>>48 != 0 {
		return 0, false
	}
	return num<<48 | addr, true
}

// result is a resolved address, independent of any batch's dictionary:
// lines point at interned functions so that a batch maps them to its
// dictionary with one pointer-keyed lookup, and a cached result is small.
type result struct {
	lines []rline // innermost first
	err   error
	// missing is why lines are missing from a named answer (a reason, see
	// symbolize.Handle.Missing), or "".
	missing string
}

// partialResult is a failure, or an answer from files short of DWARF,
// until expires (unix nanoseconds): better files found later then reach
// addresses already seen.
type partialResult struct {
	r       *result
	expires int64
	gen     uint64 // the chain's Generation() when found
}

// stamp is when a batch runs: the time, and the generation of the chain's
// growing sources (a symbol store), which ends partial answers when it
// moves.
type stamp struct {
	now int64
	gen uint64
}

func (s *Symbolizer) stamp() stamp {
	return stamp{now: time.Now().UnixNano(), gen: s.chain.Generation()}
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

func (f *funcTuple) bytes() int64 { return int64(len(f.name)+len(f.system)+len(f.file)) + 80 }

// resultCost is what a cached result holds: the slot and index entry, the
// result and its lines. The functions its lines point at are counted once,
// in the interning table.
func resultCost(r *result) int64 { return 160 + 16*int64(len(r.lines)) }

// New builds a Symbolizer.
func New(opt Options) (*Symbolizer, error) {
	opt.defaults()
	lc := opt.Locate
	if lc.NegativeTTL <= 0 {
		lc.NegativeTTL = opt.NegativeTTL
	}
	if lc.MaxEntries <= 0 {
		lc.MaxEntries = opt.MaxObjects
	}
	if lc.Logger == nil {
		lc.Logger = opt.Logger
	}
	if lc.FetchWait <= 0 {
		lc.FetchWait = opt.fetchWait()
	}
	if lc.MaxFileBytes <= 0 {
		lc.MaxFileBytes = opt.FileLimits.MaxFileBytes
	}
	// The chain opens each candidate to check it; the engine takes the
	// files it chose from it rather than opening them again. Both open with
	// the engine's limits (its decompression pool included).
	var chain *locate.Chain
	engine := symbolize.New(symbolize.Options{
		Inlines:         opt.Inlines,
		Demangle:        opt.Demangle,
		UseSymbolTable:  true,
		CacheBytes:      opt.CacheBytes,
		NegativeTTL:     opt.NegativeTTL,
		DemangleEntries: opt.DemangleEntries,
		DemangleBytes:   opt.DemangleBytes,
		Limits:          opt.FileLimits,
		// Opening a binary goes on when a batch stops waiting for it
		// (FetchWait), bounded as the batch was, so the next batch has it.
		LoadTimeout: opt.Timeout,
		MaxLoads:    opt.MaxParallel,
		Open: func(ctx context.Context, path string, lim elfx.Limits) (*elfx.File, error) {
			if f := chain.TakeOpened(path); f != nil {
				return f, nil
			}
			return elfx.OpenContext(ctx, path, lim)
		},
	})
	lc.FileLimits = engine.Options().Limits
	chain, err := locate.NewFromConfig(lc)
	if err != nil {
		engine.Close()
		return nil, err
	}
	s := &Symbolizer{
		opt:     opt,
		chain:   chain,
		engine:  engine,
		results: lru.NewClockBytes[uint64, *result](max(opt.MaxEntries*3/4, 1), opt.MaxResultBytes*3/4, resultCost),
		partial: lru.NewClockBytes[uint64, partialResult](max(opt.MaxEntries/4, 1), opt.MaxResultBytes/4,
			func(p partialResult) int64 { return resultCost(p.r) + 16 }),
		objNums: lru.NewKeyed[string, objNum](0, opt.MaxObjects, func(string, objNum) int64 { return objNumCost }, nil),
		log:     opt.Logger,
	}
	for _, src := range chain.Sources() {
		s.kernel = s.kernel || src == locate.SourceKernel
	}
	return s, nil
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

// Close releases cached objects.
func (s *Symbolizer) Close() error {
	s.chain.Close()
	return s.engine.Close()
}

// CacheStats is one cache's counters, named for telemetry.
type CacheStats struct {
	Name string
	lru.Stats
}

// Caches reports every cache the symbolizer holds: parsed objects (and,
// within them, the decompressed sections of open files), resolved
// addresses, demangled names, interned functions, object numbers, located
// files per identity and file identities.
func (s *Symbolizer) Caches() []CacheStats {
	answers, files := s.chain.Stats()
	s.mu.Lock()
	funcs := lru.Stats{Entries: len(s.funcs), Bytes: s.internBytes}
	s.mu.Unlock()
	nums := s.objNums.Stats()
	held, _, _ := s.engine.DecompressedStats()
	return []CacheStats{
		{"objects", s.engine.CacheStats()},
		{"decompressed", lru.Stats{Bytes: held}},
		{"results", s.results.Stats()},
		{"partial_results", s.partial.Stats()},
		{"demangle", s.engine.DemangleStats()},
		{"functions", funcs},
		{"object_ids", nums},
		{"located", answers},
		{"file_ids", files},
	}
}

// number interns o's identity key, ending the generation when numbers run
// out.
func (s *Symbolizer) number(o *objRef) {
	if n, ok := s.objNums.Get(o.key); ok {
		o.num, o.gen = n.num, n.gen
		return
	}
	s.numMu.Lock()
	defer s.numMu.Unlock()
	if n, ok := s.objNums.Peek(o.key); ok { // numbered meanwhile
		o.num, o.gen = n.num, n.gen
		return
	}
	if s.nextNum == maxObjNum {
		s.genMu.Lock()
		s.gen++
		s.objNums.Purge()
		s.results.Purge()
		s.partial.Purge()
		s.genMu.Unlock()
		s.nextNum = 0
	}
	s.nextNum++
	s.genMu.RLock()
	n := objNum{s.nextNum, s.gen}
	s.genMu.RUnlock()
	s.objNums.Add(o.key, n)
	o.num, o.gen = n.num, n.gen
}

func (s *Symbolizer) intern(f funcTuple) *funcTuple {
	f.name = frame.Truncate(f.name, s.opt.Limits.MaxNameBytes)
	f.system = frame.Truncate(f.system, s.opt.Limits.MaxNameBytes)
	f.file = frame.Truncate(f.file, s.opt.Limits.MaxNameBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.funcs[f]; ok {
		return p
	}
	if s.funcs == nil || s.internBytes > s.opt.internBytes() {
		// Start over, and drop the results with it: no cached result may
		// hold a function the table no longer counts.
		if s.funcs != nil {
			s.results.Purge()
			s.partial.Purge()
		}
		s.funcs = map[funcTuple]*funcTuple{}
		s.internBytes = 0
	}
	p := &f
	s.funcs[f] = p
	s.internBytes += p.bytes() + 64
	return p
}

// objRef is one object of a batch: the identity of a mapping's file and
// where to look for it.
type objRef struct {
	q        locate.Query
	key      string
	num, gen uint64 // see Symbolizer.number
	h        *symbolize.Handle
	err      error   // why the object could not be opened
	complete bool    // its files have DWARF: answers never get better
	pending  bool    // a better file is still being fetched: answers may improve soon
	mappings []int32 // mappings of the batch with this identity (hints)
	fail     *result // set for frames that fail before any lookup

	// Translation bases, looked up once per batch rather than per frame
	// (finding _stext scans the symbol table).
	base, stext                uint64
	stextOK, baseSet, stextSet bool
}

// work is one raw location to resolve.
type work struct {
	loc  int32
	obj  *objRef
	addr uint64
	tr   translation // how addr becomes an ELF address once the object is open
}

// failed is the objRef of frames that fail before any lookup (no mapping,
// an invalid identity): its answer is fixed.
func failed(err error) *objRef { return &objRef{fail: &result{err: err}} }

// translation turns a location's address into the object's ELF address.
type translation struct {
	kind uint8
	from uint64 // kernelText: the run-time _stext
}

const (
	asIs       uint8 = iota // already an ELF virtual address
	imageBase               // an offset from the image base (remote frames): plus the p_vaddr mapping file offset 0
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

// cachedLocked returns a live cached answer; s.genMu is held for reading.
func (s *Symbolizer) cachedLocked(o *objRef, addr uint64, at stamp) (*result, bool) {
	k, ok := keyOf(o.num, addr)
	if !ok || o.gen != s.gen || o.num == 0 {
		return nil, false
	}
	if r, ok := s.results.Get(k); ok {
		return r, true
	}
	if p, ok := s.partial.Get(k); ok && at.now < p.expires && p.gen == at.gen {
		return p.r, true
	}
	return nil, false
}

func (s *Symbolizer) cached(o *objRef, addr uint64, at stamp) (*result, bool) {
	s.genMu.RLock()
	defer s.genMu.RUnlock()
	return s.cachedLocked(o, addr, at)
}

// lookup asks the engine (the result cache missed) and caches the answer.
// Transient failures (fetch, timeout) are not cached, so the next batch
// retries once the object is available; other failures, and answers from
// files short of DWARF, are cached until NegativeTTL.
func (s *Symbolizer) lookup(o *objRef, addr uint64, tr translation, at stamp, buf *[]symbolize.Frame, st *Stats) *result {
	key := addr
	st.CacheMisses++
	r := &result{err: o.err}
	var terr error
	busy := false // named without DWARF only because memory was busy
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
			if m := o.h.Missing(); m != nil {
				r.missing = frame.Reason(m)
				busy = frame.Transient(m) // the DWARF may be readable next time
			} else if o.pending {
				r.missing = frame.ErrPending.Error()
			}
		} else {
			r.err = err
			if r.err == nil || symbolize.IsUnresolved(r.err) {
				r.err = fmt.Errorf("address %#x: %w", addr, frame.ErrNoDebugInfo)
			}
		}
	}
	// Only addresses that need no translation are cached: the others are
	// looked up through an object opened anyway. Nothing is cached while a
	// better file is on its way: the batch after it arrives must not find
	// this answer.
	k, ok := keyOf(o.num, key)
	if !ok || tr.kind != asIs || r.err != nil && frame.Transient(r.err) || busy || o.pending {
		return r
	}
	s.genMu.RLock()
	if o.gen == s.gen && o.num != 0 {
		if r.err != nil || !o.complete {
			s.partial.Add(k, partialResult{r: r, expires: at.now + int64(s.opt.NegativeTTL), gen: at.gen})
		} else {
			s.results.Add(k, r)
		}
	}
	s.genMu.RUnlock()
	return r
}

// Profiles symbolizes every raw native location of pd in place.
func (s *Symbolizer) Profiles(ctx context.Context, pd pprofile.Profiles) Stats {
	var st Stats
	d := pdict.New(pd.Dictionary())
	locs := d.D.LocationTable()
	maps := d.D.MappingTable()
	b := &batch{s: s, d: d, pd: pd, objs: map[string]*objRef{}}

	mapWork := make([]work, maps.Len()) // by mapping index: the object, or why there is none
	mapSeen := make([]bool, maps.Len())
	addrBase := d.StringIndex(frame.AttrAddressBase)
	todo := make([]work, 0, locs.Len())
	var noMapping *objRef
	frameType := d.StringIndex(frame.AttrFrameType)
	for i := 1; i < locs.Len(); i++ {
		loc := locs.At(i)
		if loc.Lines().Len() > 0 {
			if w, ok := s.remoteFrame(b, int32(i)); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		if v, ok := d.FindAttrKey(loc.AttributeIndices(), frameType); ok && v.Str() != frame.TypeNative && v.Str() != "" {
			if w, ok := s.kernelFrame(b, v.Str(), int32(i)); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		mi := loc.MappingIndex()
		if mi <= 0 || int(mi) >= len(mapWork) {
			if noMapping == nil {
				noMapping = failed(fmt.Errorf("native frame without a mapping: %w", frame.ErrNoMapping))
			}
			todo = append(todo, work{loc: int32(i), obj: noMapping})
			continue
		}
		if !mapSeen[mi] {
			mapWork[mi] = b.mappingObject(mi)
			mapSeen[mi] = true
			if addrBase > 0 {
				if v, ok := d.FindAttrKey(maps.At(int(mi)).AttributeIndices(), addrBase); ok && v.Str() == frame.AddressBaseImage {
					mapWork[mi].tr = translation{kind: imageBase} // image-base offsets (docs/jfr.md)
				}
			}
		}
		w := mapWork[mi]
		w.loc, w.addr = int32(i), loc.Address()
		todo = append(todo, w)
	}
	if len(todo) == 0 {
		return st
	}

	// Answers from the result cache first, in a tight loop over the cache
	// alone; objects are opened only for the misses.
	for _, o := range b.objs {
		s.number(o)
	}
	need := map[*objRef]bool{}
	answers := make([]*result, len(todo))
	at := s.stamp()
	s.genMu.RLock()
	for i, w := range todo {
		if w.obj.fail != nil {
			answers[i] = w.obj.fail
			continue
		}
		if w.tr.kind == asIs {
			if r, ok := s.cachedLocked(w.obj, w.addr, at); ok {
				answers[i] = r
				st.CacheHits++
				continue
			}
		} // else the translation is only known once the object is open
		need[w.obj] = true
	}
	s.genMu.RUnlock()
	if len(need) > 0 {
		b.hints(need)
		s.openAll(ctx, need)
		defer func() {
			for o := range need {
				if o.h != nil {
					o.h.Close()
				}
			}
		}()
	}

	touched := map[int32]*mappingFlags{}
	fnIdx := map[*funcTuple]int32{}
	var buf []symbolize.Frame
	for i, w := range todo {
		r := answers[i]
		if r == nil {
			r = s.lookup(w.obj, w.addr, w.tr, at, &buf, &st)
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
		if r.missing != "" {
			st.incomplete(r.missing)
			if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrIncomplete); !has {
				loc.AttributeIndices().Append(d.AttrStr(frame.AttrIncomplete, r.missing))
			}
		}
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

// batch is one call's view of its input.
type batch struct {
	s    *Symbolizer
	d    *pdict.Dict
	pd   pprofile.Profiles
	objs map[string]*objRef
}

type procHint struct {
	pid int64
	exe string
}

// object returns the batch's objRef for an identity, creating it.
func (b *batch) object(id frame.Identity, kernel bool) *objRef {
	q := locate.Query{ID: id, Kernel: kernel}
	key := id.Key()
	if kernel {
		key = "k" + key
	}
	if o, ok := b.objs[key]; ok {
		return o
	}
	o := &objRef{q: q, key: key}
	b.objs[key] = o
	return o
}

// mappingObject returns the work template of mapping mi: its object, or the
// reason it has none.
func (b *batch) mappingObject(mi int32) work {
	d := b.d
	m := d.D.MappingTable().At(int(mi))
	id, err := mappingIdentity(d, m)
	if err != nil {
		return work{obj: failed(err)}
	}
	if id.IsZero() {
		return work{obj: failed(fmt.Errorf("mapping %d (%.200s) has no build id or htlhash: %w", mi, d.Str(m.FilenameStrindex()), frame.ErrNoMapping))}
	}
	o := b.object(id, false)
	if len(o.mappings) < locate.MaxHints {
		o.mappings = append(o.mappings, mi)
	}
	return work{obj: o}
}

// mappingIdentity reads and validates a mapping's identity attributes.
func mappingIdentity(d *pdict.Dict, m pprofile.Mapping) (frame.Identity, error) {
	var gnu, goID, htl string
	for _, ai := range m.AttributeIndices().All() {
		k, v, ok := d.Attr(ai)
		if !ok {
			continue
		}
		switch k {
		case frame.AttrBuildIDGNU:
			gnu = v.AsString()
		case frame.AttrBuildIDGo:
			goID = v.AsString()
		case frame.AttrBuildIDHTL:
			htl = v.AsString()
		}
	}
	return frame.ParseIdentity(gnu, goID, htl)
}

// hints fills in, for the objects to locate, a process that mapped them
// (pid, executable) from the resources whose samples use their mappings:
// what the proc and local sources need for the upstream profiler's base
// name mappings. Walked once per batch, only when something is located.
func (b *batch) hints(need map[*objRef]bool) {
	if len(need) == 0 {
		return
	}
	procs := map[int32]procHint{}
	release := ""
	d := b.d
	stacks, locs := d.D.StackTable(), d.D.LocationTable()
	for _, rp := range b.pd.ResourceProfiles().All() {
		a := rp.Resource().Attributes()
		var h procHint
		if v, ok := a.Get(frame.AttrPID); ok {
			h.pid = v.Int()
		}
		if v, ok := a.Get(frame.AttrExePath); ok {
			h.exe = v.AsString()
		}
		if v, ok := a.Get(frame.AttrKernelRelease); ok && release == "" {
			release = v.AsString()
		}
		if h.pid <= 0 && h.exe == "" {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, smp := range p.Samples().All() {
					si := smp.StackIndex()
					if si <= 0 || int(si) >= stacks.Len() {
						continue
					}
					for _, li := range stacks.At(int(si)).LocationIndices().All() {
						if li <= 0 || int(li) >= locs.Len() {
							continue
						}
						mi := locs.At(int(li)).MappingIndex()
						if _, ok := procs[mi]; !ok {
							procs[mi] = h
						}
					}
				}
			}
		}
	}
	maps := d.D.MappingTable()
	for o := range need {
		if o.q.Kernel {
			o.q.KernelRelease = release
			continue
		}
		for _, mi := range o.mappings {
			m := maps.At(int(mi))
			h := procs[mi]
			o.q.AddHint(locate.Hint{File: d.Str(m.FilenameStrindex()), FileOffset: m.FileOffset(), PID: h.pid, ExePath: h.exe})
		}
	}
}

// openAll locates and opens the objects of a batch, MaxParallel at a time,
// bounded in time by Options.Timeout so a dead or slow source costs at most
// that per batch, and waiting for downloads and opening at most
// Options.FetchWait.
func (s *Symbolizer) openAll(ctx context.Context, need map[*objRef]bool) {
	if len(need) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	since := time.Now() // the fetch wait runs from here (Options.FetchWait)
	for o := range need {
		o.q.Since = since
	}
	ch := make(chan *objRef)
	var wg sync.WaitGroup
	for range min(s.opt.MaxParallel, len(need)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				if ctx.Err() != nil {
					o.err = fmt.Errorf("%s: %w: %v", o.key, frame.ErrTimeout, ctx.Err())
					continue
				}
				o.h, o.err = s.open(ctx, o)
			}
		}()
	}
	for o := range need {
		ch <- o
	}
	close(ch)
	wg.Wait()
}

// open locates an object's files and opens them. Files that vanished since
// they were located (a process exited) are located again, once.
func (s *Symbolizer) open(ctx context.Context, o *objRef) (*symbolize.Handle, error) {
	for attempt := 0; ; attempt++ {
		res, err := s.chain.Locate(ctx, o.q)
		if err != nil {
			return nil, err
		}
		o.complete, o.pending = res.Complete(), res.Pending
		bin, dbg := res.Paths()
		// Opening (DWARF to index, sections to inflate) is waited for as
		// long as downloads are; it goes on in the engine past that.
		wctx, cancel := context.WithDeadline(ctx, o.q.Since.Add(s.opt.fetchWait()))
		h, err := s.engine.Open(wctx, bin, dbg)
		cancel()
		if err != nil && attempt == 0 && frame.Reason(err) == frame.ErrNotFound.Error() {
			s.chain.Forget(&o.q)
			continue
		}
		return h, err
	}
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

// kernelFrame queues a raw kernel frame when the kernel source is on and
// its mapping says which vmlinux (build id) and where its text ran
// (memory_start is the run-time _stext).
func (s *Symbolizer) kernelFrame(b *batch, ftype string, i int32) (work, bool) {
	if ftype != frame.TypeKernel || !s.kernel {
		return work{}, false
	}
	d := b.d
	loc := d.D.LocationTable().At(int(i))
	mi := loc.MappingIndex()
	if mi <= 0 || int(mi) >= d.D.MappingTable().Len() {
		return work{}, false
	}
	m := d.D.MappingTable().At(int(mi))
	v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGNU)
	if !ok || m.MemoryStart() == 0 || d.Str(m.FilenameStrindex()) != frame.FileKernel {
		return work{}, false
	}
	w := work{loc: i, addr: loc.Address(), tr: translation{kind: kernelText, from: m.MemoryStart()}}
	id, err := frame.ParseIdentity(v.AsString(), "", "")
	if err != nil {
		w.obj = failed(err)
		return w, true
	}
	w.obj = b.object(id, true)
	return w, true
}
