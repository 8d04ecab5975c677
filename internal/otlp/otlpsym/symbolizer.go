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
	"sync"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/symbolize"
)

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
	idx     *indexer // nil without Options.Indexes

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
	funcs       map[funcTuple]*function
	internBytes int64
	nextFunc    uint64    // the next function's number
	funcBase    uint64    // the first number of the current table
	funcIdx     sync.Pool // *funcIndex
}

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
		MaxIndexBytes:   opt.MaxIndexBytes,
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
		Supplementary: func(ctx context.Context, r symbolize.SupRequest) (string, error) {
			return chain.LocateSup(ctx, r.BuildID, r.Name, r.From, r.ByName)
		},
		Split: func(ctx context.Context, r symbolize.SplitRequest) (string, error) {
			return chain.LocateSplit(ctx, r.Files, r.DWOName, r.CompDir)
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
	if opt.Indexes != nil {
		s.idx = newIndexer(opt.Indexes, engine, chain.Generation, &s.opt)
	}
	return s, nil
}

// Close releases cached objects.
func (s *Symbolizer) Close() error {
	if s.idx != nil {
		s.idx.close()
	}
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
