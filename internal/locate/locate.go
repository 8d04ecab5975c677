// Package locate finds, for one object known by its identity (GNU build id,
// Go build id, htlhash) and a few hints from its frame (file name, process,
// kernel release), the files on this machine that hold its symbols. Sources
// are tried in one configured order (proc, local, debug directories, symbol
// directories, a symbol store, debuginfod, kernel); every file any of them
// offers is opened, checked to carry the identity asked for, and scored by
// the symbol data it holds. The best file wins: DWARF over Go's pclntab over
// .symtab over .dynsym, and a stripped binary is paired with a debug file
// rather than replacing one that has symbols. Answers are cached per
// identity; an answer short of DWARF, and a failure, expire after a TTL so
// that files that appear later are used for addresses already seen.
package locate

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/lru"
)

// Query asks for the files of one object. ID is required and must come from
// frame.ParseIdentity (validated); every other field is a hint a source may
// use, taken from untrusted input: sources never build a path from them
// without containment.
type Query struct {
	ID frame.Identity
	// Hints say where frames saw the file, at most MaxHints (see AddHint).
	Hints []Hint
	// Kernel asks for a vmlinux; KernelRelease is `uname -r` of its host.
	Kernel        bool
	KernelRelease string

	// Since is when the caller began waiting (a batch's start). Sources
	// that fetch in the background (debuginfod) wait for a fetch only until
	// their wait after the earlier of Since and the fetch's start, then
	// answer frame.ErrPending while it goes on. Zero: wait as long as the
	// context.
	Since time.Time

	// Found lists the files accepted so far by earlier sources, best first
	// (the debug directories look up .gnu_debuglink of binaries found).
	Found []File

	// SupName, when set, asks for a supplementary file (a dwz common file,
	// by the build id in ID) that the file at SupFrom records as SupName
	// (untrusted): the debug directories look in their .dwz/ folders too.
	SupName, SupFrom string
}

// Hint is where one mapping with the query's identity says its file was.
type Hint struct {
	// File is the mapping's file name as received: an absolute path
	// (profsym's receiver) or a base name (the upstream eBPF profiler).
	File string
	// FileOffset is the mapping's file offset, which tells apart the
	// mappings of one file name in /proc/PID/maps.
	FileOffset uint64
	// PID is a process on this host that mapped the file (0: none known),
	// ExePath its executable (the resource's process.executable.path).
	PID     int64
	ExePath string
}

// MaxHints bounds the hints of one query: the mappings of one identity in a
// batch (one per process, or per path in containers) can be many.
const MaxHints = 8

// AddHint adds h unless it is known already or MaxHints are held.
func (q *Query) AddHint(h Hint) {
	if len(q.Hints) >= MaxHints || h == (Hint{}) {
		return
	}
	for _, x := range q.Hints {
		if x == h {
			return
		}
	}
	q.Hints = append(q.Hints, h)
}

// Candidate is a file a source offers. The chain opens it and checks its
// identity; a source need not.
type Candidate struct {
	Path string
	// Dir is the folder holding the file as its process saw it, and HostDir
	// where that folder is reachable here (a host mount, /proc/PID/root/...);
	// both empty when unknown. .gnu_debuglink targets are searched there.
	Dir, HostDir string
	// LinkCRC is set for a debug file found through a binary's
	// .gnu_debuglink whose CRC matched: that vouches for a debug file
	// without a build id.
	LinkCRC bool
}

// Source finds candidate files for a query. Implementations are safe for
// concurrent use. An answer of nothing is (nil, nil); an error says why the
// source could not answer (frame.ErrTimeout, frame.ErrFetchFailed,
// frame.ErrInvalidPath, ...) and is reported only when no source finds a
// file. A symbol store plugs in here (see SourceProvider).
type Source interface {
	Name() string
	Find(ctx context.Context, q *Query) ([]Candidate, error)
}

// SourceProvider may be implemented by a collector extension that serves
// symbols in process (the symbol store) to give the chain a Source of its
// own; an extension that only implements Locator is adapted by Store.
type SourceProvider interface {
	SymbolSource() Source
}

// Score ranks the symbol data of a file.
type Score uint8

const (
	ScoreNone    Score = iota // nothing names addresses
	ScoreDynsym               // exported symbols only (a stripped shared object)
	ScoreSymtab               // the full ELF symbol table: every function's name
	ScorePclntab              // Go's pclntab: names, files, lines, inlines
	ScoreDWARF                // DWARF: all of it, for every language
)

func (s Score) String() string {
	return [...]string{"none", "dynsym", "symtab", "pclntab", "dwarf"}[min(int(s), 4)]
}

// File is a candidate the chain accepted.
type File struct {
	Candidate
	Source string
	ID     frame.Identity
	Score  Score
	// Code is set for a file holding the object's code (a binary, stripped
	// or not) rather than only debug data (a separate debug file).
	Code bool
}

// Result is what to open for an object: the binary (code, its own symbol
// tables, pclntab) and a separate debug file holding what it lacks. Either
// may be nil, not both.
type Result struct {
	Bin, Debug *File
	// Pending is set when the files lack DWARF and a source is still
	// fetching one that may have it: a later Locate may find better.
	Pending bool
}

// Paths returns the files' paths ("" for a nil file).
func (r Result) Paths() (bin, debug string) {
	if r.Bin != nil {
		bin = r.Bin.Path
	}
	if r.Debug != nil {
		debug = r.Debug.Path
	}
	return bin, debug
}

// Score is the best symbol data of the pair.
func (r Result) Score() Score {
	var s Score
	for _, f := range []*File{r.Bin, r.Debug} {
		if f != nil && f.Score > s {
			s = f.Score
		}
	}
	return s
}

// Complete reports whether no better file can exist: the pair has DWARF.
// Incomplete answers expire so that a better file is found when it appears.
func (r Result) Complete() bool { return r.Score() == ScoreDWARF }

// Options configure a Chain.
type Options struct {
	Sources []Source
	// NegativeTTL is how long a failure, or an answer short of DWARF, is
	// remembered before the sources are asked again (0: DefaultNegativeTTL).
	NegativeTTL time.Duration
	// MaxEntries bounds the identities remembered (0: DefaultMaxEntries).
	MaxEntries int
	// MaxFileBytes refuses larger files (0: DefaultMaxFileBytes).
	MaxFileBytes int64
	// FileLimits are the limits the engine opens files with (its
	// decompression bounds and pool): files the chain opened to check them
	// are opened so too, and handed over (TakeOpened).
	FileLimits elfx.Limits
	Logger     *zap.Logger
}

// Defaults for zero Options.
const (
	DefaultNegativeTTL  = time.Minute
	DefaultMaxEntries   = 1 << 16
	DefaultMaxFileBytes = 4 << 30
)

// Chain is the ordered list of sources. It is safe for concurrent use.
type Chain struct {
	opt   Options
	log   *zap.Logger
	cache *lru.Cache[string, *answer]
	files *inspector
	group singleflight.Group

	asked atomic.Int64 // source queries, for tests and telemetry
}

type answer struct {
	res     Result
	err     error
	expires time.Time // zero: until evicted
	gen     uint64    // Generation() when found
}

// entryCost approximates an answer's memory: the entry, two Files and
// their strings.
const entryCost = 640

// IdentityCost is what the chain may hold per identity at most: its answer
// and the identity of a file it inspected (both caches hold MaxEntries).
const IdentityCost = entryCost + infoCost

// New makes a Chain.
func New(opt Options) *Chain {
	if opt.NegativeTTL <= 0 {
		opt.NegativeTTL = DefaultNegativeTTL
	}
	if opt.MaxEntries <= 0 {
		opt.MaxEntries = DefaultMaxEntries
	}
	if opt.MaxFileBytes <= 0 {
		opt.MaxFileBytes = DefaultMaxFileBytes
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	return &Chain{
		opt:   opt,
		log:   opt.Logger,
		cache: lru.New[string, *answer](0, opt.MaxEntries, func(*answer) int64 { return entryCost }, nil),
		files: newInspector(opt.MaxEntries, opt.MaxFileBytes, opt.FileLimits),
	}
}

// Sources returns the names of the chain's sources, in order.
func (c *Chain) Sources() []string {
	var out []string
	for _, s := range c.opt.Sources {
		out = append(out, s.Name())
	}
	return out
}

// Stats reports the answer cache and the file-identity cache.
func (c *Chain) Stats() (answers, files lru.Stats) {
	return c.cache.Stats(), c.files.cache.Stats()
}

func queryKey(q *Query) string {
	switch {
	case q.Kernel:
		return "k" + q.ID.Key()
	case q.SupName != "":
		return "s" + q.ID.Key()
	}
	return q.ID.Key()
}

// Generation sums the generations of the chain's growing sources (a
// symbol store): when it moves, answers short of DWARF are stale.
func (c *Chain) Generation() uint64 {
	var g uint64
	for _, s := range c.opt.Sources {
		if gs, ok := s.(Generational); ok {
			g += gs.Generation()
		}
	}
	return g
}

// TakeOpened returns the file at path if the chain opened it to check it
// moments ago and it has not changed since, or nil. The caller owns it.
// The engine opens the files Locate chose through this, so that a file is
// opened once on the cold path.
func (c *Chain) TakeOpened(path string) *elfx.File { return c.files.take(path) }

// Close closes the files held for TakeOpened.
func (c *Chain) Close() { c.files.close() }

// Forget drops what is remembered for q's identity (its files vanished).
func (c *Chain) Forget(q *Query) { c.cache.Remove(queryKey(q)) }

// Locate returns the best files for q. The error carries a reason:
// frame.ErrNoMapping without identity, frame.ErrNoDebugInfo when no source
// has a file, or the most telling failure met on the way
// (frame.ErrBuildIDMismatch, frame.ErrInvalidPath, frame.ErrLimitExceeded,
// frame.ErrTimeout, frame.ErrFetchFailed, frame.ErrCorruptFile).
func (c *Chain) Locate(ctx context.Context, q Query) (Result, error) {
	if q.ID.IsZero() {
		return Result{}, fmt.Errorf("no build id or htlhash: %w", frame.ErrNoMapping)
	}
	key := queryKey(&q)
	gen := c.Generation()
	if a, ok := c.cache.Get(key); ok {
		if a.expires.IsZero() || time.Now().Before(a.expires) && a.gen == gen {
			return a.res, a.err
		}
		c.cache.Remove(key)
	}
	ch := c.group.DoChan(key, func() (any, error) {
		a := c.locate(ctx, &q)
		a.gen = gen
		// Transient failures, and answers that a fetch still running may
		// better, are not remembered: the next batch asks again (debuginfod
		// keeps its own short memory of failures, and its downloads).
		if (a.err == nil || !frame.Transient(a.err)) && !a.res.Pending {
			c.cache.Add(key, a)
		}
		return a, nil
	})
	select {
	case r := <-ch:
		a := r.Val.(*answer)
		return a.res, a.err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("locating %s: %w: %v", q.ID, frame.ErrTimeout, ctx.Err())
	}
}

func (c *Chain) locate(ctx context.Context, q *Query) *answer {
	var errs []error
	for _, src := range c.opt.Sources {
		if best(q.Found) == ScoreDWARF {
			break // nothing can beat it: later sources (downloads) are skipped
		}
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("%w: %v", frame.ErrTimeout, ctx.Err()))
			break
		}
		c.asked.Add(1)
		cands, err := src.Find(ctx, q)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src.Name(), err))
		}
		for _, cand := range cands {
			f, err := c.accept(ctx, q, src.Name(), cand)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", src.Name(), err))
				continue
			}
			q.Found = append(q.Found, f)
		}
	}
	res := choose(q.Found)
	if !res.Complete() {
		for _, e := range errs {
			res.Pending = res.Pending || errors.Is(e, frame.ErrPending)
		}
	}
	a := &answer{res: res}
	if res.Bin == nil && res.Debug == nil {
		a.err = mostTelling(q, errs)
	}
	if !res.Complete() {
		a.expires = time.Now().Add(c.opt.NegativeTTL)
	}
	if a.err != nil {
		c.log.Debug("no file for object", zap.String("id", q.ID.Key()), zap.Error(a.err))
	}
	return a
}

// accept opens a candidate and checks that it is the object asked for: a
// binary by its identity, a debug file by its build id (or by the CRC of
// the .gnu_debuglink that named it, for debug files without one).
func (c *Chain) accept(ctx context.Context, q *Query, source string, cand Candidate) (File, error) {
	for _, f := range q.Found {
		if f.Path == cand.Path {
			return File{}, fmt.Errorf("%s: already found", cand.Path)
		}
	}
	info, o, err := c.files.inspect(ctx, cand.Path)
	if err != nil {
		return File{}, err
	}
	f := File{Candidate: cand, Source: source, ID: info.id, Score: info.score, Code: info.code}
	ok := false
	switch {
	case q.ID.Matches(info.id):
		ok = true
	case !info.code && q.ID.MatchesDebug(info.id):
		ok = true
	case cand.LinkCRC && info.id.GNU == "":
		ok = true
	}
	if !ok {
		o.close()
		return File{}, fmt.Errorf("%s is %s, want %s: %w", cand.Path, info.id.Key(), q.ID.Key(), frame.ErrBuildIDMismatch)
	}
	c.files.hold(o)
	return f, nil
}

func best(files []File) Score {
	var s Score
	for _, f := range files {
		s = max(s, f.Score)
	}
	return s
}

// choose picks the binary with the most symbol data (the earliest source on
// a tie), then a debug file only if it has more than that binary.
func choose(files []File) Result {
	var r Result
	for i := range files {
		f := &files[i]
		if f.Code && (r.Bin == nil || f.Score > r.Bin.Score) {
			r.Bin = f
		}
	}
	floor := ScoreNone
	if r.Bin != nil {
		floor = r.Bin.Score
	}
	for i := range files {
		f := &files[i]
		if f == r.Bin || f.Score <= floor && r.Bin != nil {
			continue
		}
		if r.Debug == nil || f.Score > r.Debug.Score || (f.Score == r.Debug.Score && r.Debug.Code && !f.Code) {
			r.Debug = f
		}
	}
	return r
}

// mostTelling picks the reason to report when nothing was found. A file
// still being fetched comes first: the frame may be named soon.
func mostTelling(q *Query, errs []error) error {
	for _, reason := range []error{frame.ErrPending, frame.ErrInvalidPath, frame.ErrLimitExceeded, frame.ErrBuildIDMismatch,
		frame.ErrCorruptFile, frame.ErrTimeout, frame.ErrFetchFailed} {
		for _, e := range errs {
			if errors.Is(e, reason) {
				return e
			}
		}
	}
	return fmt.Errorf("%s: no file or debug info found: %w", q.ID, frame.ErrNoDebugInfo)
}
