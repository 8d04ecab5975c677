// Package php is the host half of the PHP walker (bpf/php.h,
// docs/runtimes.md): it finds the Zend engine in a PHP process (the CLI,
// FPM or CGI executable, or libphp), its version and executor_globals,
// tells the BPF walker where the execute_data chain starts, and names the
// PHP frames the walker records from the process's zend_functions, with a
// bounded cache revalidated by the id the walker recorded.
package php

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

// Kinds of the PHP frames the walker records (enum php_frame_kind).
const (
	FrameKind     = uint8(bpf.ProfilePhpFrameKindFRAME_PHP)      // a function
	FrameKindMain = uint8(bpf.ProfilePhpFrameKindFRAME_PHP_MAIN) // a file's {main}: its filename string
)

// Map is the part of an *ebpf.Map the runtime writes (php_procs).
type Map interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Runtime.
type Options struct {
	Logger   *zap.Logger
	ProcRoot string // "/proc" unless testing
	Config   runtimes.Config
	// Procs is the walker's php_procs map: pid -> bpf.ProfilePhpProc.
	Procs Map
	// Counters, when set, reads the walker's per-CPU php_stats.
	Counters interface{ Lookup(key, value any) error }
	Now      func() time.Time
}

// Bounds of the host side.
const (
	maxFiles      = 64                     // engine builds whose inspection is kept
	maxOpenMems   = 32                     // /proc/PID/mem files kept open for naming
	maxFuncBytes  = 32 << 20               // name cache, besides Config.MaxNames entries
	maxAttachTry  = 50                     // attaches of a process not checked yet
	retryInterval = 100 * time.Millisecond // the walker asks at most that often
)

// Runtime walks PHP. Safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *zap.Logger
	files *lru.Cache[normalize.FileID, *fileInfo]
	funcs *lru.Cache[funcKey, *funcInfo]
	mems  *runtimes.MemFiles

	mu    sync.Mutex
	procs map[int]*proc
	stats Stats
}

type funcKey struct {
	pid  int
	addr uint64
	id   uint32
	main bool // addr is a {main}'s filename, not a function
}

// proc is one attached process.
type proc struct {
	file   normalize.FileID
	start  uint64 // the engine mapping's start
	fi     *fileInfo
	ranges [][2]uint64
	err    error // refused for good
	ready  bool  // its walker entry is written
	tries  int
	next   time.Time // not ready: no attach before
}

// Stats count what the runtime did, cumulatively.
type Stats struct {
	Attached, Refused, NotReady uint64
	FuncReads, FuncCacheHits    uint64
}

// New makes the PHP runtime.
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
	r.funcs = lru.New[funcKey, *funcInfo](maxFuncBytes, opt.Config.MaxNames, (*funcInfo).cost, nil)
	r.mems = runtimes.NewMemFiles(r.opt.ProcRoot, maxOpenMems)
	return r
}

// Kind is runtimes.KindPHP.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindPHP }

// Attach finds the Zend engine p runs, if any: its VM loop is what the
// walker hands to the PHP walker. A build that cannot be walked still
// returns the ranges (its stacks keep native frames and say runtime) with
// the reason.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	c, ok := findCandidate(p)
	if !ok {
		r.Forget(p.PID)
		return nil, false, nil
	}
	if runtime.GOARCH != "amd64" {
		return nil, true, fmt.Errorf("php on %s: not walked yet: %w", runtime.GOARCH, errUnsupported)
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
			// Not the file's fault: not kept, tried again at the next
			// snapshot.
			fi = &fileInfo{err: fmt.Errorf("%w: %w", errNotReady, err)}
		} else {
			r.files.Add(c.m.File.ID, fi)
			r.log.Debug("php engine", zap.String("file", c.m.Path), zap.String("version", fi.version),
				zap.Error(fi.err), zap.NamedError("cold_part", fi.coldErr))
		}
	}
	if fi.notPHPFile {
		r.Forget(p.PID)
		return nil, false, nil
	}
	var ranges [][2]uint64
	for _, rg := range [][2]uint64{fi.executeEx, fi.cold} {
		if rg[1] > rg[0] {
			ranges = append(ranges, [2]uint64{rg[0] + b, rg[1] + b})
		}
	}
	cur := fi.eg + b + uint64(fi.lay.egCurrentEx)
	err := fi.err
	if err == nil {
		err = fi.lay.check()
	}
	if err == nil {
		// Not before the loader is done with the file: its data reads as
		// something else until then.
		if err = runtimes.Loaded(r.opt.ProcRoot, p.PID, c.m); err != nil {
			err = fmt.Errorf("%w: %w", errNotReady, err)
		} else {
			err = r.probe(p.PID, &fi.lay, cur)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs[p.PID] != st {
		return nil, false, nil // exited (forgotten) meanwhile
	}
	st.fi, st.ranges, st.tries = fi, ranges, st.tries+1
	switch {
	case errors.Is(err, runtimes.ErrProcessGone):
		delete(r.procs, p.PID)
		return ranges, true, err
	case errors.Is(err, errNotReady) && st.tries < maxAttachTry:
		// No walker entry: the walker asks again (PROC_REMAP) and the
		// next snapshot retries.
		st.next = now.Add(retryInterval)
		r.stats.NotReady++
		return ranges, true, nil
	case err != nil:
		st.err = err
		r.stats.Refused++
		// Refused for good: an entry that says so stops the walker's
		// requests; the stacks keep their native frames.
		if perr := r.opt.Procs.Put(uint32(p.PID), bpf.ProfilePhpProc{}); perr != nil {
			err = fmt.Errorf("%w (and the walker entry: %w)", err, perr)
		}
		return ranges, true, err
	}
	if err := r.opt.Procs.Put(uint32(p.PID), fi.lay.bpf(cur)); err != nil {
		st.err = fmt.Errorf("writing the walker entry: %w", err)
		r.stats.Refused++
		return ranges, true, st.err
	}
	st.ready = true
	r.stats.Attached++
	return ranges, true, nil
}

// probe checks the layout against the live process: the execute_data
// chain, when a script runs, must lead to functions that read as such. A
// process that runs no script yet (or frames popped while read) is looked
// at again.
func (r *Runtime) probe(pid int, l *layout, cur uint64) error {
	m, err := runtimes.OpenMem(r.opt.ProcRoot, pid)
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }()
	for try := 1; ; try++ {
		err = checkLive(m, l, cur, r.opt.Config.MaxNameBytes)
		if err == nil || errors.Is(err, runtimes.ErrProcessGone) || try == liveChecks {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != nil && !errors.Is(err, runtimes.ErrProcessGone) && !errors.Is(err, errLayout) {
		err = fmt.Errorf("%w: %w", errNotReady, err)
	}
	return err
}

// liveChecks is how many times probe reads a live chain before it gives
// up for this snapshot.
const liveChecks = 5

// maxCheckFrames bounds the frames checked at attach.
const maxCheckFrames = 64

// checkLive reads the chain at cur (&current_execute_data): every function
// on it must read and be named.
func checkLive(m memory, l *layout, cur uint64, maxName int) error {
	ex, err := m.U64(cur)
	if err != nil {
		return fmt.Errorf("executor_globals unreadable: %w", err)
	}
	if ex == 0 {
		// No script running (an FPM master, an idle worker): nothing
		// to check until one runs; the walker only looks when one does.
		return nil
	}
	var buf [64]byte
	for i := 0; ex != 0 && i < maxCheckFrames; i++ {
		if err := m.Read(ex, buf[:]); err != nil {
			return fmt.Errorf("execute_data %#x: %w", ex, err)
		}
		fn := le64(buf[:], l.exFunc)
		if fn != 0 {
			if _, err := readFunc(m, l, fn, 0, maxName); err != nil {
				return fmt.Errorf("execute_data %#x: %w", ex, err)
			}
		}
		next := le64(buf[:], l.exPrev)
		if next == ex {
			return fmt.Errorf("execute_data %#x is its own caller: %w", ex, errLayout)
		}
		ex = next
	}
	return nil
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
	r.funcs.EvictWhere(func(k funcKey, _ *funcInfo) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one PHP frame of pid: Class::method, function or {main}, the
// file of its op_array and the line of the recorded opline (none for a
// built-in).
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	if f.Kind != FrameKind && f.Kind != FrameKindMain {
		return runtimes.Symbol{}, fmt.Errorf("php frame kind %d: %w", f.Kind, runtimes.ErrNotAttached)
	}
	r.mu.Lock()
	st := r.procs[pid]
	r.mu.Unlock()
	if st == nil || !st.ready {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	k := funcKey{pid: pid, addr: f.Ptr, id: uint32(f.Aux >> 32), main: f.Kind == FrameKindMain}
	fi, ok := r.funcs.Get(k)
	if ok {
		r.count(func(s *Stats) { s.FuncCacheHits++ })
	} else {
		var err error
		if fi, err = r.read(pid, st, k); err != nil {
			r.log.Debug("php frame left unnamed", zap.Int("pid", pid), zap.Uint64("function", f.Ptr), zap.Error(err))
			return runtimes.Symbol{}, err
		}
		r.funcs.Add(k, fi)
	}
	fr := frame.Frame{Name: fi.name}
	if !fi.builtin {
		fr.File, fr.StartFile, fr.StartLine = fi.file, fi.file, fi.first
		fr.Line = uint32(f.Aux)
	}
	return runtimes.Symbol{Frames: []frame.Frame{fr}, Type: frame.TypePHP}, nil
}

// read reads a function of pid through its (cached) memory file.
func (r *Runtime) read(pid int, st *proc, k funcKey) (*funcInfo, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*funcInfo, error) {
		r.count(func(s *Stats) { s.FuncReads++ })
		if k.main {
			return readMain(m, &st.fi.lay, k.addr, k.id, r.opt.Config.MaxNameBytes)
		}
		return readFunc(m, &st.fi.lay, k.addr, k.id, r.opt.Config.MaxNameBytes)
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
func (r *Runtime) WalkStats() (bpf.ProfilePhpCounters, error) {
	var sum bpf.ProfilePhpCounters
	if r.opt.Counters == nil {
		return sum, nil
	}
	var per []bpf.ProfilePhpCounters
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

// errorNames are the walker's reasons (enum php_error), by value.
var errorNames = map[bpf.ProfilePhpError]string{
	bpf.ProfilePhpErrorPHP_ERR_NOT_ATTACHED: "not_attached",
	bpf.ProfilePhpErrorPHP_ERR_REFUSED:      "refused",
	bpf.ProfilePhpErrorPHP_ERR_READ:         "read",
	bpf.ProfilePhpErrorPHP_ERR_READ_FRAME:   "read_frame",
	bpf.ProfilePhpErrorPHP_ERR_READ_FUNC:    "read_func",
	bpf.ProfilePhpErrorPHP_ERR_BAD_FUNC:     "bad_func",
	bpf.ProfilePhpErrorPHP_ERR_CHAIN_END:    "chain_end",
	bpf.ProfilePhpErrorPHP_ERR_LOOP:         "loop",
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
