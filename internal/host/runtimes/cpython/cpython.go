// Package cpython is the host half of the CPython walker (bpf/cpython.h,
// docs/runtimes.md): it finds the interpreter in a Python process, reads
// its layout once per build (_Py_DebugOffsets from 3.13, per-version
// offsets checked against the interpreter's own type tables and the live
// process before), tells the BPF walker where the frame chain is, and names
// the Python frames the walker records from the process's code objects,
// with a bounded cache revalidated by the id the walker recorded.
package cpython

import (
	"errors"
	"fmt"
	"path/filepath"
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

// FrameKind is the kind of the Python frames the walker records.
const FrameKind = uint8(bpf.ProfileCpythonFrameKindFRAME_CPYTHON)

// Map is the part of an *ebpf.Map the runtime writes (cpython_procs).
type Map interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Runtime.
type Options struct {
	Logger   *zap.Logger
	ProcRoot string // "/proc" unless testing
	Config   runtimes.Config
	// Procs is the walker's cpython_procs map: pid -> bpf.ProfileCpythonProc.
	Procs Map
	// Counters, when set, reads the walker's per-CPU cpython_stats.
	Counters interface{ Lookup(key, value any) error }
	Now      func() time.Time
}

// Bounds of the host side.
const (
	maxFiles      = 64                     // interpreter builds whose inspection is kept
	maxOpenMems   = 32                     // /proc/PID/mem files kept open for naming
	maxCodeBytes  = 32 << 20               // name cache, besides Config.MaxNames entries
	maxAttachTry  = 50                     // attaches of a process not initialized yet
	retryInterval = 100 * time.Millisecond // the walker asks at most that often
)

// Runtime walks CPython. Safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *zap.Logger
	files *lru.Cache[normalize.FileID, *fileInfo]
	selfs *lru.Cache[normalize.FileID, uint64] // threadSelf per glibc file
	codes *lru.Cache[codeKey, *codeInfo]
	mems  *runtimes.MemFiles

	mu    sync.Mutex
	procs map[int]*proc
	stats Stats
}

type codeKey struct {
	pid  int
	addr uint64
	id   uint32
}

// proc is one attached process.
type proc struct {
	file   normalize.FileID
	start  uint64 // the interpreter mapping's start
	fi     *fileInfo
	lay    layout
	a      addrs
	ranges [][2]uint64
	err    error // refused for good
	ready  bool  // its walker entry is written
	tries  int
	next   time.Time // not ready: no attach before
}

// Stats count what the runtime did, cumulatively.
type Stats struct {
	Attached, Refused, NotReady uint64
	CodeReads, CodeCacheHits    uint64
}

// New makes the CPython runtime.
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
	r.selfs = lru.New[normalize.FileID, uint64](0, maxFiles, nil, nil)
	r.codes = lru.New[codeKey, *codeInfo](maxCodeBytes, opt.Config.MaxNames, (*codeInfo).cost, nil)
	r.mems = runtimes.NewMemFiles(r.opt.ProcRoot, maxOpenMems)
	return r
}

// Kind is runtimes.KindCPython.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindCPython }

// Attach finds the interpreter p runs, if any: its eval loop is what the
// walker hands to the CPython walker. A build or process that cannot be
// walked still returns the ranges (its stacks keep native frames and say
// runtime) with the reason.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	c, ok := findCandidate(p)
	if !ok {
		r.Forget(p.PID)
		return nil, false, nil
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
			return st.ranges, true, cmpErr(st.err, st.ready)
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
			// Not the file's fault: not kept for the file's other
			// processes (kept, it once made a CI run refuse a python that
			// was fine), and this one is tried again at its next
			// snapshot.
			fi = &fileInfo{err: fmt.Errorf("%w: %w", errNotReady, err)}
		} else {
			r.files.Add(c.m.File.ID, fi)
			r.log.Debug("python interpreter", zap.String("file", c.m.Path), zap.Int("minor", fi.minor),
				zap.String("cold_part", fi.coldFrom), zap.Error(fi.err))
		}
	}
	if fi.shim {
		// Not loaded its libpython yet: a later snapshot finds it.
		r.Forget(p.PID)
		return nil, false, nil
	}
	var ranges [][2]uint64
	for _, rg := range [][2]uint64{fi.eval, fi.cold} {
		if rg[1] > rg[0] {
			ranges = append(ranges, [2]uint64{rg[0] + b, rg[1] + b})
		}
	}
	lay, a := fi.lay, fi.addrs(b)
	err := fi.err
	if err == nil {
		// Not before the loader is done with the file: its data reads as
		// something else until then.
		if err = runtimes.Loaded(r.opt.ProcRoot, p.PID, c.m); err != nil {
			err = fmt.Errorf("%w: %w", errNotReady, err)
		} else if a.tpSelf, err = r.threadSelf(filepath.Join(r.opt.ProcRoot, strconv.Itoa(p.PID)), p, c.m); err == nil {
			err = r.probe(p.PID, &lay, &a)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs[p.PID] != st {
		return nil, false, nil // exited (forgotten) meanwhile
	}
	st.fi, st.lay, st.a, st.ranges, st.tries = fi, lay, a, ranges, st.tries+1
	switch {
	case errors.Is(err, errNotReady) && st.tries < maxAttachTry:
		if st.tries == 1 {
			r.log.Debug("python interpreter not ready", zap.Int("pid", p.PID), zap.Error(err))
		}
		// No walker entry: the walker asks again (PROC_REMAP), and the
		// next snapshot retries, at most once a second.
		st.next = now.Add(retryInterval)
		r.stats.NotReady++
		return ranges, true, nil
	case err != nil:
		st.err = err
		r.stats.Refused++
		// Refused for good: an entry that says so stops the walker's
		// requests; the stacks keep their native frames.
		if perr := r.opt.Procs.Put(uint32(p.PID), bpf.ProfileCpythonProc{}); perr != nil {
			err = fmt.Errorf("%w (and the walker entry: %v)", err, perr)
		}
		return ranges, true, err
	}
	if err := r.opt.Procs.Put(uint32(p.PID), lay.bpf(a)); err != nil {
		st.err = fmt.Errorf("writing the walker entry: %w", err)
		r.stats.Refused++
		return ranges, true, st.err
	}
	st.ready = true
	r.stats.Attached++
	// 0: threads are found by searching the lists (slower, bounded).
	r.log.Debug("python interpreter attached", zap.Int("pid", p.PID), zap.Int64("thread_state_offset", a.tss))
	return ranges, true, nil
}

func cmpErr(err error, ready bool) error {
	if err != nil || ready {
		return err
	}
	return nil
}

// probe completes the layout from the process's type tables and checks it
// against the live interpreter. A racing interpreter (frames pushed and
// popped while they are read) gets a few tries.
func (r *Runtime) probe(pid int, l *layout, a *addrs) error {
	m, err := runtimes.OpenMem(r.opt.ProcRoot, pid)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := fromMembers(m, l, *a); err != nil {
		return notReady(err)
	}
	// A wrong layout fails every try; a chain read while the interpreter
	// pushes and pops frames fails some (freed code objects: 206 of 206
	// samples lost once when 3 tries back to back all failed, the agent
	// slowed by the race detector), so tries are spread over a few ms.
	for try := 1; ; try++ {
		err = checkLive(m, l, *a)
		if err == nil {
			a.tss = findTSS(m, l, *a)
		}
		if err == nil || errors.Is(err, errNotReady) || try == liveChecks {
			return notReady(err)
		}
		time.Sleep(time.Millisecond)
	}
}

// liveChecks is how many times probe checks a live interpreter's frames
// before a failure is the layout's.
const liveChecks = 10

// notReady turns a failed read into errNotReady: a process that is still
// mapping its libraries, or frames that went away while read, are looked
// at again (maxAttachTry times) before they are refused.
func notReady(err error) error {
	if err == nil || errors.Is(err, errLayout) || errors.Is(err, errUnsupported) || errors.Is(err, errNotReady) {
		return err
	}
	return fmt.Errorf("%w: %w", errNotReady, err)
}

// bpf is the walker's entry for a process with layout l.
func (l *layout) bpf(a addrs) bpf.ProfileCpythonProc {
	p := bpf.ProfileCpythonProc{
		Runtime: a.runtime, CodeType: a.codeType, CodeMask: l.codeMask, Layout: l.kind,
		InterpHead: uint16(l.interpHead), InterpNext: uint16(l.interpNext), ThreadsHead: uint16(l.threadsHead),
		TsNext: uint16(l.tsNext), TsThreadId: uint16(l.tsThreadID), TsFrame: uint16(l.tsFrame),
		CframeFrame: uint16(l.cframeFrame), F_back: uint16(l.fBack), F_code: uint16(l.fCode),
		F_instr: uint16(l.fInstr), F_entry: uint16(l.fEntry), EntryVal: uint16(l.entryVal),
		FrameSize: uint16(l.frameSize()), CoCode: uint16(l.coCode), CoFilename: uint16(l.coFilename),
		CoName: uint16(l.coName), CoFirstlineno: uint16(l.coFirstline), CodeSize: uint16(l.codeSize()),
		TsTss:  int16(a.tss),     // within [-tssBelow, tssAbove)
		TpSelf: uint16(a.tpSelf), // < maxTPSelf
	}
	if l.cframe {
		p.Flags |= uint32(bpf.ProfileCpythonFlagsCPY_CFRAME)
	}
	return p
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
	r.codes.EvictWhere(func(k codeKey, _ *codeInfo) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one Python frame of pid: the code object's qualified name
// (3.11+) or name, its file, and the line of the recorded instruction.
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	if f.Kind != FrameKind {
		return runtimes.Symbol{}, fmt.Errorf("cpython frame kind %d: %w", f.Kind, runtimes.ErrNotAttached)
	}
	r.mu.Lock()
	st := r.procs[pid]
	r.mu.Unlock()
	if st == nil || !st.ready {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	k := codeKey{pid: pid, addr: f.Ptr, id: uint32(f.Aux >> 32)}
	c, ok := r.codes.Get(k)
	if ok {
		r.count(func(s *Stats) { s.CodeCacheHits++ })
	} else {
		var err error
		if c, err = r.read(pid, st, k); err != nil {
			r.log.Debug("python frame left unnamed", zap.Int("pid", pid), zap.Uint64("code", f.Ptr), zap.Error(err))
			return runtimes.Symbol{}, err
		}
		r.codes.Add(k, c)
	}
	instr := int32(uint32(f.Aux))
	switch st.lay.lines {
	case linesLocations:
		instr >>= 1 // bytes after co_code_adaptive -> code units
	case linesTable310:
		instr *= 2 // f_lasti counts code units
	}
	fr := frame.Frame{Name: c.name, File: c.file, StartFile: c.file, StartLine: uint32(max(c.first, 0))}
	if c.lines != nil {
		fr.Line = lineOf(st.lay.lines, c.lines, c.first, instr)
	}
	return runtimes.Symbol{Frames: []frame.Frame{fr}, Type: frame.TypeCPython}, nil
}

// read reads a code object of pid through its (cached) memory file.
func (r *Runtime) read(pid int, st *proc, k codeKey) (*codeInfo, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*codeInfo, error) {
		r.count(func(s *Stats) { s.CodeReads++ })
		return readCode(m, &st.lay, st.a, k.addr, k.id, r.opt.Config.MaxNameBytes)
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
func (r *Runtime) WalkStats() (bpf.ProfileCpythonCounters, error) {
	var sum bpf.ProfileCpythonCounters
	if r.opt.Counters == nil {
		return sum, nil
	}
	var per []bpf.ProfileCpythonCounters
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
