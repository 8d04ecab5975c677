// Package hotspot is the host half of the HotSpot (Java) walker
// (bpf/hotspot.h, docs/runtimes.md): it finds libjvm in a process, reads
// the JVM's own description of its layout (libjvm's gHotSpotVM* tables)
// once per libjvm build, hands the walker the process's code cache, and
// names the frames the walker records: interpreted and compiled Java
// methods (with the methods inlined into them, from the nmethod's scope
// descriptors) and the stubs between them.
//
// Names are package.Class.method, as the jfr receiver names JFR frames,
// with the source file and the line of the frame's bytecode index. They
// are read from the process, whose memory may be hostile: every read is
// bounded and every pointer checked, and a frame that fails a check stays
// unnamed with a reason.
package hotspot

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Frame kinds the walker records (enum hotspot_frame_kind).
const (
	KindInterpreted = uint8(bpf.ProfileHotspotFrameKindFRAME_HS_INTERPRETED)
	KindCompiled    = uint8(bpf.ProfileHotspotFrameKindFRAME_HS_COMPILED)
	KindStub        = uint8(bpf.ProfileHotspotFrameKindFRAME_HS_STUB)

	bciNone = uint64(bpf.ProfileHotspotLimitsHS_BCI_NONE)
	pcLeaf  = uint32(bpf.ProfileHotspotLimitsHS_PC_LEAF)
)

// ProcMap is the walker's per-process map (hotspot_procs): an *ebpf.Map.
type ProcMap interface {
	Put(key, value any) error
	Delete(key any) error
}

// Counters is the walker's per-CPU failure counters (hotspot_errors).
type Counters interface {
	Lookup(key, valueOut any) error
}

// Bytes the name caches may hold, each.
const cacheBytes = 16 << 20

// Runtime walks HotSpot JVMs. Safe for concurrent use: the sampler's
// event goroutine attaches processes while its report goroutine names
// their frames and forgets those that exited.
type Runtime struct {
	cfg      runtimes.Config
	procMap  ProcMap
	errs     Counters
	log      *zap.Logger
	procRoot string
	openMem  func(pid int) (memory, error)
	loaded   func(pid int, m *normalize.Mapping) error // runtimes.Loaded; forged memory has no maps
	now      func() time.Time                          // attachRetryGap's clock; tests move it

	// attachMu serializes Attach and Forget, the two writers of a proc's
	// attach state (its fields above ready). Name never takes it: an
	// attach reads the process and must not hold up naming.
	attachMu sync.Mutex

	mu      sync.Mutex
	layouts map[layoutKey]layoutEntry
	procs   map[int]*proc

	methods *lru.Cache[methodKey, *methodInfo]
	names   *lru.Cache[nameKey, runtimes.Symbol]
}

type methodKey struct {
	pid  int
	addr uint64
}

type nameKey struct {
	pid int
	f   runtimes.Frame
}

// memory is a process's memory (runtimes.Mem; fakes in tests).
type memory interface {
	Read(addr uint64, p []byte) error
	U64(addr uint64) (uint64, error)
	U32(addr uint64) (uint32, error)
	U16(addr uint64) (uint16, error)
	CString(addr uint64, max int) (string, error)
	Close() error
}

// proc is one JVM process.
//
// pid, file, start and mem are set when it is made, before it is
// published in Runtime.procs. The attach state (l, bias, err, failed,
// ranges and the code cache's bounds) is written only under
// Runtime.attachMu, and Name reads it only once ready says the attach is
// complete: ready is stored last and the fields it covers are never
// written again, so that load orders Name's reads after the writes.
type proc struct {
	pid   int
	file  normalize.FileID
	start uint64 // libjvm's mapping: a new one means a new JVM (exec)
	mem   memory

	l    *layout
	bias uint64
	err  error // why it cannot be walked (permanent)
	// failed counts attach failures: a JVM read while it starts (its
	// tables not yet relocated, its code heaps not yet made) can look
	// inconsistent, so only the attachTries-th failure is final. Those
	// within attachRetryGap of the last one counted count once.
	failed     int
	lastFailed time.Time

	ranges                      [][2]uint64
	codeLo, codeHi, callStubRet uint64

	ready atomic.Bool // the walker has its entry; the fields above are final

	mu    sync.Mutex
	stubs []stubEntry
}

// New makes the HotSpot runtime over the walker's maps. errs may be nil.
func New(cfg runtimes.Config, procMap ProcMap, errs Counters, log *zap.Logger) *Runtime {
	cfg.SetDefaults()
	if log == nil {
		log = zap.NewNop()
	}
	symCost := func(k nameKey, s runtimes.Symbol) int64 {
		n := int64(64)
		for _, f := range s.Frames {
			n += int64(48 + len(f.Name) + len(f.File))
		}
		return n
	}
	r := &Runtime{
		cfg: cfg, procMap: procMap, errs: errs, log: log, procRoot: "/proc",
		layouts: map[layoutKey]layoutEntry{}, procs: map[int]*proc{},
		methods: lru.New[methodKey](cacheBytes, cfg.MaxNames, (*methodInfo).cost, nil),
		names:   lru.NewKeyed(cacheBytes, cfg.MaxNames, symCost, nil),
	}
	r.now = time.Now
	r.openMem = func(pid int) (memory, error) { return runtimes.OpenMem(r.procRoot, pid) }
	r.loaded = func(pid int, m *normalize.Mapping) error { return runtimes.Loaded(r.procRoot, pid, m) }
	return r
}

// Kind is runtimes.KindHotSpot.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindHotSpot }

// Attach finds libjvm in p and hands its code cache to the walker. A JVM
// still starting is found but not attached yet: its code goes to the
// walker without the walker's entry, so that running there asks for the
// snapshot that attaches it. A JVM that fails a check returns the code
// it runs (when known) with the error, so that its stacks say runtime.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	m := libjvm(p)
	r.attachMu.Lock()
	defer r.attachMu.Unlock()
	r.mu.Lock()
	pr := r.procs[p.PID]
	r.mu.Unlock()
	if m == nil {
		if pr != nil {
			r.forget(p.PID)
		}
		return nil, false, nil
	}
	if pr != nil && (pr.start != m.Start || pr.file != m.File.ID) {
		r.forget(p.PID) // exec'd another JVM
		pr = nil
	}
	if pr != nil && pr.ready.Load() {
		return pr.ranges, true, nil
	}
	if pr != nil && pr.err != nil {
		// Its code may have been mapped since (a JVM refused while it
		// started): the walker marks it from now on.
		return r.broken(p, pr), true, pr.err
	}
	if pr == nil {
		mem, err := r.openMem(p.PID)
		if err != nil {
			return nil, true, err
		}
		pr = &proc{pid: p.PID, file: m.File.ID, start: m.Start, mem: mem}
		r.mu.Lock()
		if old := r.procs[p.PID]; old != nil {
			old.mem.Close()
		}
		r.procs[p.PID] = pr
		r.mu.Unlock()
	}
	err := r.attach(p, m, pr)
	switch {
	case errors.Is(err, errNotReady):
		// Its code, for the walker to ask for another snapshot when
		// it runs there (bpf/hotspot.h); not a failure.
		return fallbackRanges(p, pr), true, nil
	case errors.Is(err, runtimes.ErrProcessGone):
		return nil, true, err
	case err != nil:
		// Everything is read from the process's memory, which may be
		// half set up: the tables' pointers before the loader relocated
		// them (a layout that looks unusable), its code heaps, the
		// interpreter. It is read again on the next snapshot, which the
		// walker asks for (at most once a second) while it runs in this
		// code; attachTries failures are final, and a final verdict on
		// the layout is the file's.
		if now := r.now(); pr.failed == 0 || now.Sub(pr.lastFailed) >= attachRetryGap {
			pr.failed++
			pr.lastFailed = now
		}
		if pr.failed < attachTries {
			r.log.Debug("HotSpot attach failed, will retry", zap.Int("pid", p.PID), zap.Int("failures", pr.failed), zap.Error(err))
			return fallbackRanges(p, pr), true, nil
		}
		if pr.l == nil && errors.Is(err, errLayout) {
			r.rememberLayout(m, layoutEntry{err: err})
		}
		pr.err = fmt.Errorf("%s: %w", m.Path, err)
		return r.broken(p, pr), true, pr.err
	}
	return pr.ranges, true, nil
}

// attachTries is how many attach failures make a JVM one that cannot be
// walked.
const attachTries = 3

// attachRetryGap spaces the failures attachTries counts. A starting JVM
// brings snapshots in bursts (its first sample, each library it opens:
// the remaps), which could spend the budget within one moment of its
// start-up; the emulated arm64 VM's slow start-up took three in the 0.8 s
// TestHostileProcess's walker-late keeps its tables unset. The walker asks
// for a snapshot at most once a second while it runs in the JVM's code, so
// a JVM that stays unusable is still refused, 2 s after its first failure.
const attachRetryGap = time.Second

// broken hands the code of a JVM that cannot be walked to the walker with
// an entry that says so: its stacks say runtime, and the walker asks for
// no snapshots.
func (r *Runtime) broken(p *normalize.Process, pr *proc) [][2]uint64 {
	ranges := fallbackRanges(p, pr)
	if len(ranges) > 0 && len(pr.ranges) == 0 {
		_ = r.procMap.Put(uint32(p.PID), &bpf.ProfileHotspotProc{Broken: 1})
	}
	pr.ranges = ranges
	return ranges
}

func (r *Runtime) attach(p *normalize.Process, m *normalize.Mapping, pr *proc) error {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		// The walker knows x86-64's and arm64's frames (bpf/hotspot.h).
		return layoutErr("HotSpot is walked on x86-64 and arm64, not %s", runtime.GOARCH)
	}
	bias, ok := loadBias(m)
	if !ok {
		return layoutErr("no load segment maps libjvm's offset %#x", m.Offset)
	}
	if pr.l == nil {
		// libjvm's tables read as something else until the loader has
		// mapped and relocated it.
		if err := r.loaded(p.PID, m); err != nil {
			return errors.Join(err, errNotReady)
		}
		l, err := r.layoutFor(p.PID, m, pr.mem, bias)
		if err != nil {
			return err
		}
		pr.l, pr.bias = l, bias
	}
	v, err := pr.codeCache()
	if err != nil {
		return err
	}
	if err := r.procMap.Put(uint32(p.PID), &v); err != nil {
		return fmt.Errorf("hotspot_procs: %w", err)
	}
	pr.ranges = [][2]uint64{{pr.codeLo, pr.codeHi}}
	pr.ready.Store(true)
	r.log.Debug("HotSpot attached", zap.Int("pid", p.PID), zap.Int("jdk", pr.l.version),
		zap.Uint32("code_heaps", v.Nheaps), zap.Uint64("code_cache_bytes", pr.codeHi-pr.codeLo))
	return nil
}

// fallbackRanges is the code of a JVM that cannot be walked, for its
// stacks to end with reason runtime: the code cache when known, else its
// anonymous executable memory.
func fallbackRanges(p *normalize.Process, pr *proc) [][2]uint64 {
	if pr.codeLo != 0 {
		return [][2]uint64{{pr.codeLo, pr.codeHi}}
	}
	var lo, hi uint64
	for _, m := range p.Mappings {
		if !m.Anonymous {
			continue
		}
		if lo == 0 {
			lo = m.Start
		}
		if m.End-lo > maxCodeCache {
			break
		}
		hi = m.End
	}
	if lo == 0 {
		return nil
	}
	return [][2]uint64{{lo, hi}}
}

// Forget drops pid.
func (r *Runtime) Forget(pid int) {
	r.attachMu.Lock()
	defer r.attachMu.Unlock()
	r.forget(pid)
}

// forget is Forget with attachMu held.
func (r *Runtime) forget(pid int) {
	r.mu.Lock()
	pr := r.procs[pid]
	delete(r.procs, pid)
	r.mu.Unlock()
	if pr == nil {
		return
	}
	pr.mem.Close()
	if pr.ready.Load() || pr.err != nil {
		_ = r.procMap.Delete(uint32(pid))
	}
	r.methods.EvictWhere(func(k methodKey, _ *methodInfo) bool { return k.pid == pid }, func() bool { return false })
	r.names.EvictWhere(func(k nameKey, _ runtimes.Symbol) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one frame of pid. A name cached from an earlier report is
// used only after checking that the method or nmethod is still the one
// sampled (one read), or when the process has exited since.
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	r.mu.Lock()
	pr := r.procs[pid]
	r.mu.Unlock()
	key := nameKey{pid: pid, f: f}
	if sym, ok := r.names.Get(key); ok {
		if pr == nil {
			return sym, nil
		}
		if !pr.ready.Load() {
			// A JVM that replaced the one named (exec, or a reused pid)
			// while this name was cached: without its layout nothing
			// can be checked, and the frame is not its.
			r.names.Remove(key)
			return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
		}
		err := pr.same(f)
		if err == nil || errors.Is(err, runtimes.ErrProcessGone) {
			return sym, nil
		}
		r.names.Remove(key)
		return runtimes.Symbol{}, err
	}
	if pr == nil || !pr.ready.Load() {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	var sym runtimes.Symbol
	var err error
	switch f.Kind {
	case KindInterpreted:
		sym, err = r.interpretedSymbol(pr, f)
	case KindCompiled:
		sym, err = r.compiledSymbol(pr, f.Ptr, uint32(f.Aux)&^pcLeaf, uint32(f.Aux)&pcLeaf != 0, uint32(f.Aux>>32))
	case KindStub:
		sym, err = r.stubSymbol(pr, f.Ptr, uint32(f.Aux))
	default:
		err = fmt.Errorf("HotSpot frame of kind %d: %w", f.Kind, runtimes.ErrBadFrame)
	}
	if err != nil {
		return runtimes.Symbol{}, err
	}
	r.names.Add(key, sym)
	return sym, nil
}

func (r *Runtime) interpretedSymbol(pr *proc, f runtimes.Frame) (runtimes.Symbol, error) {
	m, err := r.method(pr, f.Ptr)
	if err != nil {
		return runtimes.Symbol{}, err
	}
	if (m.cm>>3)&0xffffffff != f.Aux>>32 {
		return runtimes.Symbol{}, fmt.Errorf("Method %#x changed since sampled (class unloaded): %w", f.Ptr, runtimes.ErrBadFrame)
	}
	bci := -1
	if b := f.Aux & 0xffff; b != bciNone {
		bci = int(b)
	}
	return runtimes.Symbol{Frames: []frame.Frame{m.frame(pr.l, bci)}, Type: frame.TypeJVM}, nil
}

// method reads the Method at addr, through the cache when the Method still
// has the ConstMethod it had.
func (r *Runtime) method(pr *proc, addr uint64) (*methodInfo, error) {
	if addr == 0 || addr&7 != 0 {
		return nil, fmt.Errorf("Method* %#x: %w", addr, runtimes.ErrBadFrame)
	}
	cm, err := pr.mem.U64(addr + pr.l.methodConst)
	if err != nil {
		return nil, err
	}
	key := methodKey{pid: pr.pid, addr: addr}
	if m, ok := r.methods.Get(key); ok && m.cm == cm {
		return m, nil
	}
	m, err := pr.readMethod(addr, r.cfg.MaxNameBytes)
	if err != nil {
		return nil, err
	}
	r.methods.Add(key, m)
	return m, nil
}

// same checks that what f points at is still what the walker sampled.
func (pr *proc) same(f runtimes.Frame) error {
	switch f.Kind {
	case KindInterpreted:
		cm, err := pr.mem.U64(f.Ptr + pr.l.methodConst)
		if err != nil {
			return err
		}
		if (cm>>3)&0xffffffff != f.Aux>>32 {
			return fmt.Errorf("Method %#x changed since sampled: %w", f.Ptr, runtimes.ErrBadFrame)
		}
	case KindCompiled:
		id, err := pr.mem.U32(f.Ptr + pr.l.nmCompileID)
		if err != nil {
			return err
		}
		if id != uint32(f.Aux>>32) {
			return fmt.Errorf("nmethod %#x flushed since sampled: %w", f.Ptr, runtimes.ErrBadFrame)
		}
	}
	return nil
}

// Errors returns the walker's failures so far, by reason (hotspot_errors),
// summed over CPUs.
func (r *Runtime) Errors() map[string]uint64 {
	out := map[string]uint64{}
	if r.errs == nil {
		return out
	}
	var per [][bpf.ProfileHotspotErrorHS_ERR_SLOTS]uint64
	if err := r.errs.Lookup(uint32(0), &per); err != nil {
		return out
	}
	names := [...]string{"no_proc", "no_blob", "blob_read", "interpreter", "return_address", "stub"}
	for _, c := range per {
		for i, n := range names {
			if c[i] > 0 {
				out[n] += c[i]
			}
		}
	}
	return out
}

// Close forgets every process, closing the memory file each JVM keeps
// open: the agent is stopping.
func (r *Runtime) Close() error {
	r.attachMu.Lock()
	defer r.attachMu.Unlock()
	r.mu.Lock()
	pids := make([]int, 0, len(r.procs))
	for pid := range r.procs {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		r.forget(pid)
	}
	return nil
}
