// Package perl is the host half of the Perl walker (bpf/perl.h,
// docs/runtimes.md): it finds libperl in a Perl process, its version and
// that version's layout, tells the BPF walker where the interpreter is,
// and names the Perl frames the walker records (Package::sub, the file
// the sub was compiled from, the line of its COP) from the process's
// memory, with a bounded cache revalidated by the id the walker recorded.
package perl

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Frame kinds the walker records (enum perl_frame_kind).
const (
	KindSub  = uint8(bpf.ProfilePerlFrameKindFRAME_PERL_SUB)
	KindEval = uint8(bpf.ProfilePerlFrameKindFRAME_PERL_EVAL)
	KindMain = uint8(bpf.ProfilePerlFrameKindFRAME_PERL_MAIN)
)

// Map is the part of an *ebpf.Map the runtime writes (perl_procs).
type Map interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Runtime.
type Options struct {
	Logger   *zap.Logger
	ProcRoot string // "/proc" unless testing
	Config   runtimes.Config
	// Procs is the walker's perl_procs map: pid -> bpf.ProfilePerlProc.
	Procs Map
	// Counters, when set, reads the walker's per-CPU perl_stats.
	Counters interface{ Lookup(key, value any) error }
}

// Bounds of the host side.
const (
	maxFiles     = 64       // libperl builds whose inspection is kept
	maxOpenMems  = 32       // /proc/PID/mem files kept open for naming
	maxNameCache = 16 << 20 // name cache bytes, besides Config.MaxNames entries
	maxAttachTry = 50       // attaches of a process whose interpreter is not up yet
	openTimeout  = 10 * time.Second
)

// nameRE matches the files the interpreter lives in: libperl.so.5.36, or
// a perl executable that has it built in.
var nameRE = regexp.MustCompile(`^(libperl\.so(?:\.[0-9.]+)?|perl(?:5(?:\.[0-9.]+)?)?)$`)

// Runtime walks Perl. Safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *zap.Logger
	files *lru.Cache[normalize.FileID, *fileInfo]
	names *lru.Cache[nameKey, *nameInfo]
	mems  *runtimes.MemFiles

	mu    sync.Mutex
	procs map[int]*proc
	stats Stats
}

// Stats count what the runtime did, cumulatively.
type Stats struct {
	Attached, Refused, NotReady uint64
	NameReads, NameCacheHits    uint64
}

type proc struct {
	file   normalize.FileID
	start  uint64
	lay    layout
	ranges [][2]uint64
	err    error
	ready  bool
	tries  int
}

// fileInfo is what one libperl (or perl executable) says about itself;
// addresses are the file's own.
type fileInfo struct {
	shim      bool // an executable that links libperl: the interpreter is there
	minor     int
	lay       layout
	runops    [2]uint64
	curinterp uint64
	thrKey    uint64
	err       error
}

// Symbols libperl exports.
const (
	symRunops    = "Perl_runops_standard"
	symCurinterp = "PL_curinterp"
	symThrKey    = "PL_thr_key"
	symRevision  = "PL_revision"
	symVersion   = "PL_version"
)

// New makes the Perl runtime.
func New(opt Options) *Runtime {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.ProcRoot == "" {
		opt.ProcRoot = "/proc"
	}
	opt.Config.SetDefaults()
	r := &Runtime{opt: opt, log: opt.Logger, procs: map[int]*proc{}}
	r.files = lru.New[normalize.FileID, *fileInfo](0, maxFiles, nil, nil)
	r.names = lru.New[nameKey, *nameInfo](maxNameCache, opt.Config.MaxNames, (*nameInfo).cost, nil)
	r.mems = runtimes.NewMemFiles(r.opt.ProcRoot, maxOpenMems)
	return r
}

// Kind is runtimes.KindPerl.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindPerl }

// findCandidate picks the mapping of p whose file is the interpreter: the
// library when there is one.
func findCandidate(p *normalize.Process) (*normalize.Mapping, bool, bool) {
	var best *normalize.Mapping
	bestLib := false
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File == nil || m.Anonymous || !nameRE.MatchString(path.Base(m.Path)) {
			continue
		}
		lib := path.Base(m.Path)[0] == 'l'
		if best == nil || lib && !bestLib {
			best, bestLib = m, lib
		}
	}
	return best, bestLib, best != nil
}

// Attach finds libperl in p, if any: its run loop is what the walker hands
// to the Perl walker.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	m, lib, ok := findCandidate(p)
	if !ok {
		r.Forget(p.PID)
		return nil, false, nil
	}
	fi, ok := r.files.Get(m.File.ID)
	if !ok {
		var err error
		if fi, err = readFile(filepath.Join(r.opt.ProcRoot, strconv.Itoa(p.PID)), m, lib); err != nil {
			// Not the file's fault (the process exiting, the host
			// busy): not kept, and tried again at the next snapshot.
			fi = &fileInfo{err: fmt.Errorf("%w: %w", errNotReady, err)}
		} else {
			r.files.Add(m.File.ID, fi)
			r.log.Debug("perl interpreter", zap.String("file", m.Path), zap.Int("minor", fi.minor), zap.Error(fi.err))
		}
	}
	if fi.shim {
		r.Forget(p.PID)
		return nil, false, nil
	}
	if runtime.GOARCH != "amd64" {
		return nil, true, fmt.Errorf("perl on %s: not walked yet: %w", runtime.GOARCH, errUnsupported)
	}
	v, ok := addrmap.FileOffsetToVaddr(m.File.Loads, m.Offset)
	if !ok {
		return nil, true, fmt.Errorf("%s: mapping offset %#x outside its segments: %w", m.Path, m.Offset, errUnsupported)
	}
	b := m.Start - v
	var ranges [][2]uint64
	if fi.runops[1] > fi.runops[0] {
		ranges = [][2]uint64{{fi.runops[0] + b, fi.runops[1] + b}}
	}
	r.mu.Lock()
	st := r.procs[p.PID]
	if st != nil && st.file == m.File.ID && st.start == m.Start && (st.ready || st.err != nil) {
		defer r.mu.Unlock()
		return st.ranges, true, st.err
	}
	if st == nil || st.file != m.File.ID || st.start != m.Start {
		st = &proc{file: m.File.ID, start: m.Start}
		r.procs[p.PID] = st
	}
	r.mu.Unlock()

	err := fi.err
	curinterp, thrKey := fi.curinterp+b, uint64(0)
	if fi.thrKey != 0 {
		thrKey = fi.thrKey + b
	}
	if err == nil {
		// Not before the loader is done with the file: its data reads as
		// something else until then.
		if err = runtimes.Loaded(r.opt.ProcRoot, p.PID, m); err != nil {
			err = fmt.Errorf("%w: %w", errNotReady, err)
		} else {
			err = r.probe(p.PID, &fi.lay, curinterp)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs[p.PID] != st {
		return nil, false, nil // forgotten meanwhile
	}
	st.lay, st.ranges, st.tries = fi.lay, ranges, st.tries+1
	switch {
	case errors.Is(err, runtimes.ErrProcessGone):
		return ranges, true, err
	case errors.Is(err, errNotReady) && st.tries < maxAttachTry:
		// No walker entry yet: the walker asks again (PROC_REMAP).
		r.stats.NotReady++
		return ranges, true, nil
	case err != nil:
		st.err = err
		r.stats.Refused++
		if perr := r.opt.Procs.Put(uint32(p.PID), bpf.ProfilePerlProc{}); perr != nil {
			err = fmt.Errorf("%w (and the walker entry: %w)", err, perr)
		}
		return ranges, true, err
	}
	if err := r.opt.Procs.Put(uint32(p.PID), fi.lay.bpf(curinterp, thrKey)); err != nil {
		st.err = fmt.Errorf("writing the walker entry: %w", err)
		r.stats.Refused++
		return ranges, true, st.err
	}
	st.ready = true
	r.stats.Attached++
	return ranges, true, nil
}

// probe checks that the process has an interpreter up, and that the
// layout reads it: its stackinfo chain ends at the main one, with context
// indexes within bounds.
func (r *Runtime) probe(pid int, l *layout, curinterp uint64) error {
	m, err := runtimes.OpenMem(r.opt.ProcRoot, pid)
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }()
	interp, err := m.U64(curinterp)
	if err != nil {
		if errors.Is(err, runtimes.ErrProcessGone) {
			return err
		}
		return fmt.Errorf("%w: reading PL_curinterp: %w", errNotReady, err)
	}
	if interp == 0 {
		return fmt.Errorf("%w: no interpreter yet", errNotReady)
	}
	if err := checkLive(m, l, interp); err != nil {
		if errors.Is(err, runtimes.ErrProcessGone) {
			return err
		}
		return fmt.Errorf("%w: %w", errNotReady, err)
	}
	return nil
}

func readFile(procDir string, m *normalize.Mapping, lib bool) (*fileInfo, error) {
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(procDir, m.Start, m.End, m.Path) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		f, oerr := elfx.OpenContext(ctx, pth, elfx.Limits{})
		cancel()
		if oerr == nil {
			defer func() { _ = f.Close() }()
			return inspect(f, m.Path, lib), nil
		}
		err = oerr
	}
	return nil, fmt.Errorf("opening %s: %w", m.Path, err)
}

// inspect reads libperl's symbols and version.
func inspect(f *elfx.File, name string, lib bool) *fileInfo {
	fi := &fileInfo{}
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		fi.err = fmt.Errorf("%s on %s: %w", name, f.Machine, errUnsupported)
		return fi
	}
	syms := map[string]elf.Symbol{}
	ss, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		fi.err = fmt.Errorf("%s symbols: %w", name, err)
		return fi
	}
	for _, s := range ss {
		switch s.Name {
		case symRunops, symCurinterp, symThrKey, symRevision, symVersion:
			if s.Value != 0 {
				syms[s.Name] = s
			}
		}
	}
	if !lib {
		if _, ok := syms[symRunops]; !ok {
			needed, _ := f.DynString(elf.DT_NEEDED)
			for _, n := range needed {
				if nameRE.MatchString(n) {
					fi.shim = true
					return fi
				}
			}
		}
	}
	rs, ok := syms[symRunops]
	if !ok || rs.Size == 0 {
		fi.err = fmt.Errorf("%s: no %s: %w", name, symRunops, errUnsupported)
		return fi
	}
	fi.runops = [2]uint64{rs.Value, rs.Value + rs.Size}
	rev, ok1 := syms[symRevision]
	ver, ok2 := syms[symVersion]
	if !ok1 || !ok2 {
		fi.err = fmt.Errorf("%s: no %s: %w", name, symVersion, errUnsupported)
		return fi
	}
	rb, err1 := f.ReadVaddr(rev.Value, 1)
	vb, err2 := f.ReadVaddr(ver.Value, 1)
	if err := errors.Join(err1, err2); err != nil {
		fi.err = fmt.Errorf("%s: reading the version: %w", name, err)
		return fi
	}
	if rb[0] != 5 {
		fi.err = fmt.Errorf("%s: perl %d.%d: %w", name, rb[0], vb[0], errUnsupported)
		return fi
	}
	fi.minor = int(vb[0])
	ci, ok1 := syms[symCurinterp]
	tk, ok2 := syms[symThrKey]
	if !ok1 || !ok2 {
		// An unthreaded perl keeps the interpreter's variables as
		// globals: another layout, not walked yet.
		fi.err = fmt.Errorf("%s: perl 5.%d built without threads: %w", name, fi.minor, errUnsupported)
		return fi
	}
	fi.curinterp, fi.thrKey = ci.Value, tk.Value
	fi.lay, fi.err = layoutOf(fi.minor)
	if fi.err != nil {
		fi.err = fmt.Errorf("%s: %w", name, fi.err)
	}
	return fi
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
	r.names.EvictWhere(func(k nameKey, _ *nameInfo) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one Perl frame of pid.
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	if f.Kind != KindSub && f.Kind != KindEval && f.Kind != KindMain {
		return runtimes.Symbol{}, fmt.Errorf("perl frame kind %d: %w", f.Kind, runtimes.ErrNotAttached)
	}
	r.mu.Lock()
	st := r.procs[pid]
	r.mu.Unlock()
	if st == nil || !st.ready {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	line := uint32(f.Aux)
	k := nameKey{pid: pid, kind: f.Kind, addr: f.Ptr, id: uint32(f.Aux >> 32)}
	if f.Kind != KindSub {
		k.id = line // a COP: its line is what is checked
	}
	n, ok := r.names.Get(k)
	if ok {
		r.count(func(s *Stats) { s.NameCacheHits++ })
	} else {
		var err error
		if n, err = r.read(pid, &st.lay, k); err != nil {
			r.log.Debug("perl frame left unnamed", zap.Int("pid", pid), zap.Uint64("ptr", f.Ptr), zap.Error(err))
			return runtimes.Symbol{}, err
		}
		r.names.Add(k, n)
	}
	fr := frame.Frame{Name: n.name, File: n.file, Line: line}
	return runtimes.Symbol{Frames: []frame.Frame{fr}, Type: frame.TypePerl}, nil
}

func (r *Runtime) read(pid int, l *layout, k nameKey) (*nameInfo, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*nameInfo, error) {
		r.count(func(s *Stats) { s.NameReads++ })
		maxBytes := r.opt.Config.MaxNameBytes
		switch k.kind {
		case KindSub:
			return readSub(m, l, k.addr, k.id, maxBytes)
		case KindEval:
			return readCop(m, l, k.addr, k.id, "(eval)", maxBytes)
		}
		return readCop(m, l, k.addr, k.id, "main", maxBytes)
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
func (r *Runtime) WalkStats() (bpf.ProfilePerlCounters, error) {
	var sum bpf.ProfilePerlCounters
	if r.opt.Counters == nil {
		return sum, nil
	}
	var per []bpf.ProfilePerlCounters
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

// errorNames are the walker's reasons (enum perl_error), by value.
var errorNames = map[bpf.ProfilePerlError]string{
	bpf.ProfilePerlErrorPERL_ERR_NOT_ATTACHED: "not_attached",
	bpf.ProfilePerlErrorPERL_ERR_REFUSED:      "refused",
	bpf.ProfilePerlErrorPERL_ERR_NO_INTERP:    "no_interpreter",
	bpf.ProfilePerlErrorPERL_ERR_READ:         "read",
	bpf.ProfilePerlErrorPERL_ERR_READ_CX:      "read_context",
	bpf.ProfilePerlErrorPERL_ERR_READ_CV:      "read_cv",
	bpf.ProfilePerlErrorPERL_ERR_NOT_CV:       "not_cv",
	bpf.ProfilePerlErrorPERL_ERR_BAD_IX:       "bad_index",
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
