// Package ruby is the host half of the Ruby walker (bpf/ruby.h,
// docs/runtimes.md): it finds the Ruby VM in a process (libruby), its
// version and its thread-local execution context, tells the BPF walker
// where to find them, and names the Ruby frames the walker records from
// the process's iseqs and method entries, with a bounded cache whose
// entries are checked against the objects they name.
package ruby

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Map is the part of an *ebpf.Map the runtime writes (ruby_procs).
type Map interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Runtime.
type Options struct {
	Logger   *zap.Logger
	ProcRoot string // "/proc" unless testing
	Config   runtimes.Config
	// Procs is the walker's ruby_procs map: pid -> bpf.ProfileRubyProc.
	Procs Map
	// Counters, when set, reads the walker's per-CPU ruby_stats.
	Counters interface{ Lookup(key, value any) error }
	Now      func() time.Time
}

// Bounds of the host side.
const (
	maxFiles      = 64                     // VM builds whose inspection is kept
	maxOpenMems   = 32                     // /proc/PID/mem files kept open for naming
	maxNameBytes  = 32 << 20               // name cache, besides Config.MaxNames entries
	maxAttachTry  = 50                     // attaches of a process not ready yet
	retryInterval = 100 * time.Millisecond // the walker asks at most that often
)

// Runtime walks Ruby. Safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *zap.Logger
	files *lru.Cache[normalize.FileID, *fileInfo]
	names *lru.Cache[nameKey, *iseqInfo]
	mems  *runtimes.MemFiles

	mu    sync.Mutex
	procs map[int]*proc
	stats Stats
}

// nameKey is one recorded frame: the object, and the method entry and
// instruction index beside it.
type nameKey struct {
	pid      int
	kind     uint8
	ptr, aux uint64
}

// proc is one attached process.
type proc struct {
	file   normalize.FileID
	start  uint64
	fi     *fileInfo
	ranges [][2]uint64
	err    error
	ready  bool
	tries  int
	next   time.Time
	// symbols is ruby_global_symbols (C function names), 0: not found.
	symbols uint64
}

// Stats count what the runtime did, cumulatively.
type Stats struct {
	Attached, Refused, NotReady uint64
	NameReads, NameCacheHits    uint64
}

// New makes the Ruby runtime.
func New(opt Options) *Runtime {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.ProcRoot == "" {
		opt.ProcRoot = "/proc"
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	opt.Config.SetDefaults()
	r := &Runtime{opt: opt, log: opt.Logger, procs: map[int]*proc{}}
	r.files = lru.New[normalize.FileID, *fileInfo](0, maxFiles, nil, nil)
	r.names = lru.New[nameKey, *iseqInfo](maxNameBytes, opt.Config.MaxNames, (*iseqInfo).cost, nil)
	r.mems = runtimes.NewMemFiles(r.opt.ProcRoot, maxOpenMems)
	return r
}

// Kind is runtimes.KindRuby.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindRuby }

// Attach finds the Ruby VM p runs, if any: its VM entry is what the
// walker hands to the Ruby walker. A build that cannot be walked still
// returns the ranges (its stacks keep native frames and say runtime) with
// the reason.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	c, ok := findCandidate(p)
	if !ok {
		r.Forget(p.PID)
		return nil, false, nil
	}
	if runtime.GOARCH != "amd64" {
		return nil, true, fmt.Errorf("ruby on %s: not walked yet: %w", runtime.GOARCH, errUnsupported)
	}
	b, ok := bias(c.m)
	if !ok {
		return nil, true, fmt.Errorf("%s: mapping offset %#x outside its segments: %w", c.m.Path, c.m.Offset, errLayout)
	}
	now := r.opt.Now()
	r.mu.Lock()
	st := r.procs[p.PID]
	if st != nil && st.file == c.m.File.ID && st.start == c.m.Start {
		if st.ready || st.err != nil || now.Before(st.next) {
			defer r.mu.Unlock()
			return st.ranges, true, st.err
		}
	} else {
		st = &proc{file: c.m.File.ID, start: c.m.Start}
		r.procs[p.PID] = st
	}
	r.mu.Unlock()

	fi, ok := r.files.Get(c.m.File.ID)
	if !ok {
		var err error
		if fi, err = readFile(filepath.Join(r.opt.ProcRoot, strconv.Itoa(p.PID)), c); err != nil {
			fi = &fileInfo{err: fmt.Errorf("%w: %w", errNotReady, err)}
		} else {
			r.files.Add(c.m.File.ID, fi)
			r.log.Debug("ruby vm", zap.String("file", c.m.Path), zap.String("version", fi.version), zap.Error(fi.err))
		}
	}
	if fi.notRubyLib {
		r.Forget(p.PID)
		return nil, false, nil
	}
	var ranges [][2]uint64
	if fi.vmExec[1] > fi.vmExec[0] {
		ranges = append(ranges, [2]uint64{fi.vmExec[0] + b, fi.vmExec[1] + b})
	}
	err := fi.err
	if err == nil {
		err = fi.lay.check()
	}
	var entry bpf.ProfileRubyProc
	var symbols uint64
	if err == nil {
		// Not before the loader is done with the file: its data reads as
		// something else until then.
		if err = runtimes.Loaded(r.opt.ProcRoot, p.PID, c.m); err != nil {
			err = fmt.Errorf("%w: %w", errNotReady, err)
		} else {
			entry, symbols, err = r.tlsEntry(p.PID, fi, b)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs[p.PID] != st {
		return nil, false, nil // exited (forgotten) meanwhile
	}
	st.fi, st.ranges, st.tries, st.symbols = fi, ranges, st.tries+1, symbols
	switch {
	case errors.Is(err, runtimes.ErrProcessGone):
		delete(r.procs, p.PID)
		return ranges, true, err
	case errors.Is(err, errNotReady) && st.tries < maxAttachTry:
		st.next = now.Add(retryInterval)
		r.stats.NotReady++
		return ranges, true, nil
	case err != nil:
		st.err = err
		r.stats.Refused++
		// Refused for good: an entry that says so stops the walker's
		// requests; the stacks keep their native frames.
		if perr := r.opt.Procs.Put(uint32(p.PID), bpf.ProfileRubyProc{Refused: 1}); perr != nil {
			err = fmt.Errorf("%w (and the walker entry: %w)", err, perr)
		}
		return ranges, true, err
	}
	if err := r.opt.Procs.Put(uint32(p.PID), entry); err != nil {
		st.err = fmt.Errorf("writing the walker entry: %w", err)
		r.stats.Refused++
		return ranges, true, st.err
	}
	st.ready = true
	r.stats.Attached++
	return ranges, true, nil
}

// maxTLSModule bounds the TLS module id read from the process.
const maxTLSModule = uint64(bpf.ProfileRubyLimitsRUBY_MAX_TLS_MODULE)

// tlsEntry reads what the loader put in ruby_current_ec's GOT slot of pid
// (the module id, or the offset from the thread pointer) and makes the
// walker's entry; it finds the global symbol table on the way.
func (r *Runtime) tlsEntry(pid int, fi *fileInfo, bias uint64) (bpf.ProfileRubyProc, uint64, error) {
	m, err := runtimes.OpenMem(r.opt.ProcRoot, pid)
	if err != nil {
		return bpf.ProfileRubyProc{}, 0, err
	}
	defer func() { _ = m.Close() }()
	v, err := m.U64(fi.tlsGOT + bias)
	if err != nil {
		return bpf.ProfileRubyProc{}, 0, fmt.Errorf("%w: TLS slot: %w", errNotReady, err)
	}
	var symbols uint64
	if n := fi.data[1] - fi.data[0]; n > 0 {
		data := make([]byte, n)
		if m.Read(fi.data[0]+bias, data) == nil {
			symbols = findSymbols(m, data, fi.data[0]+bias)
		}
	}
	if !fi.tlsDTV {
		return fi.lay.bpf(int64(v)+int64(fi.tlsOff), 0), symbols, nil //nolint:gosec // an offset below the thread pointer
	}
	if v == 0 || v > maxTLSModule {
		// Zero until the loader relocated libruby.
		return bpf.ProfileRubyProc{}, 0, fmt.Errorf("TLS module id %d: %w", v, errNotReady)
	}
	e := fi.lay.bpf(int64(fi.tlsOff), uint32(v)) //nolint:gosec // bounded above
	e.TlsCandidates = fi.tlsCandidates
	return e, symbols, nil
}

// Forget drops pid.
func (r *Runtime) Forget(pid int) {
	r.mu.Lock()
	_, ok := r.procs[pid]
	delete(r.procs, pid)
	r.mu.Unlock()
	if !ok {
		return
	}
	_ = r.opt.Procs.Delete(uint32(pid))
	r.mems.Forget(pid)
	r.names.EvictWhere(func(k nameKey, _ *iseqInfo) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one Ruby frame of pid: a method or block ("Chain#mid",
// "block in Chain#mid", "<main>") with its file and the line of the
// recorded instruction, or a C function.
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	if f.Kind != KindIseq && f.Kind != KindCFunc {
		return runtimes.Symbol{}, fmt.Errorf("ruby frame kind %d: %w", f.Kind, runtimes.ErrNotAttached)
	}
	r.mu.Lock()
	st := r.procs[pid]
	r.mu.Unlock()
	if st == nil || !st.ready {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	k := nameKey{pid: pid, kind: f.Kind, ptr: f.Ptr, aux: f.Aux}
	fi, ok := r.names.Get(k)
	if ok && !r.still(pid, st, k, fi) {
		// Freed since it was named (its slot no longer holds such an
		// object, or holds another): named again, which fails unless the
		// slot holds a new one. Without this check one name read before
		// the free named every later frame at that address
		// (TestForgedRuby/freed and /reused, when the first report came
		// before the free).
		r.names.Remove(k)
		ok = false
	}
	if ok {
		r.count(func(s *Stats) { s.NameCacheHits++ })
	} else {
		var err error
		if fi, err = r.read(pid, st, k); err != nil {
			r.log.Debug("ruby frame left unnamed", zap.Int("pid", pid), zap.Uint64("ptr", f.Ptr), zap.Error(err))
			return runtimes.Symbol{}, err
		}
		r.names.Add(k, fi)
	}
	fr := frame.Frame{Name: fi.name}
	if fi.file != "" {
		fr.File, fr.StartFile, fr.StartLine, fr.Line = fi.file, fi.file, fi.first, fi.line
	}
	return runtimes.Symbol{Frames: []frame.Frame{fr}, Type: frame.TypeRuby}, nil
}

// still reports whether a cached name's object is still the one it
// named: an iseq or a method entry by its flags word, and the same one by
// its ident (two or three short reads).
func (r *Runtime) still(pid int, st *proc, k nameKey, fi *iseqInfo) bool {
	ok, err := runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (bool, error) {
		id, ok := identOf(m, &st.fi.lay, k.kind, k.ptr)
		return ok && id == fi.id, nil
	})
	return err == nil && ok
}

// read reads a frame's names through pid's (cached) memory file.
func (r *Runtime) read(pid int, st *proc, k nameKey) (*iseqInfo, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*iseqInfo, error) {
		r.count(func(s *Stats) { s.NameReads++ })
		if k.kind == KindCFunc {
			name, err := readCFunc(m, &st.fi.lay, k.ptr, st.symbols, r.opt.Config.MaxNameBytes)
			if err != nil {
				return nil, err
			}
			// Read after the name: a method entry freed in between
			// leaves an ident that the next use does not match.
			id, _ := identOf(m, &st.fi.lay, k.kind, k.ptr)
			return &iseqInfo{name: name, id: id}, nil
		}
		return readIseq(m, &st.fi.lay, k.ptr, k.aux, r.opt.Config.MaxNameBytes)
	})
}

func (r *Runtime) count(f func(*Stats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// Stats returns the runtime's counters.
func (r *Runtime) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// WalkStats sums the BPF walker's counters over CPUs.
func (r *Runtime) WalkStats() (bpf.ProfileRubyCounters, error) {
	var sum bpf.ProfileRubyCounters
	if r.opt.Counters == nil {
		return sum, nil
	}
	var per []bpf.ProfileRubyCounters
	if err := r.opt.Counters.Lookup(uint32(0), &per); err != nil {
		return sum, err
	}
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return sum, nil
}

// errorNames are the walker's reasons (enum ruby_error), by value.
var errorNames = map[bpf.ProfileRubyError]string{
	bpf.ProfileRubyErrorRUBY_ERR_NOT_ATTACHED: "not_attached",
	bpf.ProfileRubyErrorRUBY_ERR_REFUSED:      "refused",
	bpf.ProfileRubyErrorRUBY_ERR_READ_EC:      "read_ec",
	bpf.ProfileRubyErrorRUBY_ERR_BAD_EC:       "bad_ec",
	bpf.ProfileRubyErrorRUBY_ERR_READ_FRAME:   "read_frame",
	bpf.ProfileRubyErrorRUBY_ERR_READ_ENV:     "read_env",
	bpf.ProfileRubyErrorRUBY_ERR_STACK_END:    "stack_end",
	bpf.ProfileRubyErrorRUBY_ERR_NO_TP:        "no_thread_pointer",
}

// Errors returns the walker's failures so far, by reason, summed over
// CPUs (runtimes.WalkErrors).
func (r *Runtime) Errors() map[string]uint64 {
	st, err := r.WalkStats()
	if err != nil {
		return map[string]uint64{}
	}
	return runtimes.NameErrors(st.Errors[:], errorNames)
}

// Close closes the process memory files kept open for naming.
func (r *Runtime) Close() error {
	r.mems.Close()
	return nil
}
