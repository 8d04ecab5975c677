// Package v8 is the host half of the V8 (Node.js) walker (bpf/v8.h,
// docs/runtimes.md): it finds V8 in a node process by its v8dbg_*
// postmortem tables, checks the constants the walker and the namer need,
// hands the walker V8's code (the embedded builtins and the JIT code
// range), and names the JavaScript frames the walker records from the
// process's SharedFunctionInfos, with a bounded cache revalidated by the
// bytecode the walker saw.
package v8

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Frame kinds the walker records.
const (
	FrameInterp = uint8(bpf.ProfileV8FrameKindFRAME_V8INTERP)
	FrameJIT    = uint8(bpf.ProfileV8FrameKindFRAME_V8JIT)
	FrameOpt    = uint8(bpf.ProfileV8FrameKindFRAME_V8OPT)
)

// Map is the part of an *ebpf.Map the runtime writes (v8_procs).
type Map interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Runtime.
type Options struct {
	Logger   *zap.Logger
	ProcRoot string // "/proc" unless testing
	Config   runtimes.Config
	// Procs is the walker's v8_procs map: pid -> bpf.ProfileV8Proc.
	Procs Map
	// Counters, when set, reads the walker's per-CPU v8_stats.
	Counters interface{ Lookup(key, value any) error }
}

// Bounds of the host side.
const (
	maxFiles     = 16       // V8 builds whose inspection is kept
	maxOpenMems  = 32       // /proc/PID/mem files kept open for naming
	maxFnBytes   = 32 << 20 // function cache, besides Config.MaxNames entries
	maxScripts   = 256      // scripts' line ends kept
	maxLineBytes = 64 << 20
	openTimeout  = 10 * time.Second
	// codeRangeSpan bounds each step of the JIT code span: V8 reserves at
	// most 512 MB for an isolate's code on x86-64 (and keeps its copy of the
	// builtins there); node 20's isolates' ranges were 640 MB apart.
	codeRangeSpan = 1 << 30
	// shortCallReach is how far from V8's own builtins an isolate's code
	// range may lie and still call them directly (a 32-bit displacement):
	// such a range holds no copy of them.
	shortCallReach = 2 << 30
)

// Runtime walks V8. Safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *zap.Logger
	files *lru.Cache[normalize.FileID, *fileInfo]
	fns   *lru.Cache[fnKey, *fnInfo]
	jits  *lru.Cache[fnKey, []frame.Frame] // by function and PC
	lines *lru.Cache[fnKey, []int32]
	mems  *runtimes.MemFiles

	mu    sync.Mutex
	procs map[int]*proc
}

type fnKey struct {
	pid  int
	addr uint64
	id   uint32
	sfi  uint32 // optimized frames: the low bits of the code's function
}

type proc struct {
	file   normalize.FileID
	lay    layout
	ranges [][2]uint64
	err    error
}

// New makes the V8 runtime.
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
	r.fns = lru.New[fnKey, *fnInfo](maxFnBytes, opt.Config.MaxNames, (*fnInfo).cost, nil)
	r.jits = lru.New[fnKey, []frame.Frame](maxFnBytes, opt.Config.MaxNames, framesCost, nil)
	r.lines = lru.New[fnKey, []int32](maxLineBytes, maxScripts, func(v []int32) int64 { return int64(4*len(v)) + 32 }, nil)
	r.mems = runtimes.NewMemFiles(r.opt.ProcRoot, maxOpenMems)
	return r
}

// Kind is runtimes.KindV8.
func (r *Runtime) Kind() runtimes.Kind { return runtimes.KindV8 }

// Attach finds V8 in p, if any: its builtins and JIT code are what the
// walker hands to the V8 walker.
func (r *Runtime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	m := candidate(p)
	if m == nil {
		r.Forget(p.PID)
		return nil, false, nil
	}
	fi, ok := r.files.Get(m.File.ID)
	if !ok {
		var err error
		if fi, err = r.readFile(p.PID, m); err != nil {
			return nil, true, err
		}
		r.files.Add(m.File.ID, fi)
		r.log.Debug("v8 build", zap.String("file", m.Path), zap.Int("constants", len(fi.consts)), zap.Error(fi.err))
	}
	if fi.err != nil && len(fi.consts) == 0 {
		// No V8 tables at all: a program named node that is not Node.
		r.Forget(p.PID)
		return nil, false, nil
	}
	bias, ok := loadBias(m)
	if !ok {
		return nil, true, fmt.Errorf("%s: mapping offset %#x outside its segments: %w", m.Path, m.Offset, errRefused)
	}
	var ranges [][2]uint64
	var copies [][2]uint64
	entry := bpf.ProfileV8Proc{}
	if fi.err == nil {
		ranges = append(ranges, [2]uint64{fi.blobLo + bias, fi.blobHi + bias})
		var jit [][2]uint64
		var left int
		copies, jit, left = codeRange(p, m, fi, len(entry.Blob)-1, len(bpf.ProfileUnwindProc{}.Rt)-1)
		ranges = append(ranges, jit...)
		if left > 0 {
			// Their isolates' frames stay native (or, interpreted,
			// come out as JIT frames the host cannot name): a limit,
			// said at each attach.
			r.log.Debug("v8: more isolates than the walker takes", zap.Int("pid", p.PID),
				zap.Int("copies", len(copies)), zap.Int("spans", len(jit)), zap.Int("left", left))
		}
	}
	err := fi.err
	var lay layout
	if err == nil {
		lay, err = newLayout(fi.consts)
		lay.bytecodeSizes = fi.bytecodeSizes
	}
	if err == nil && runtime.GOARCH != "amd64" {
		err = fmt.Errorf("node on %s: not walked yet: %w", runtime.GOARCH, errRefused)
	}
	st := &proc{file: m.File.ID, lay: lay, ranges: ranges, err: err}
	if err == nil {
		entry = lay.bpf()
		entry.Blob[0].Lo, entry.Blob[0].Hi = fi.blobLo+bias, fi.blobHi+bias
		for i, c := range copies {
			entry.Blob[1+i].Lo, entry.Blob[1+i].Hi = c[0], c[1]
		}
	}
	if perr := r.opt.Procs.Put(uint32(p.PID), entry); perr != nil && err == nil {
		err = fmt.Errorf("writing the walker entry: %w", perr)
		st.err = err
	}
	r.mu.Lock()
	r.procs[p.PID] = st
	r.mu.Unlock()
	return ranges, true, err
}

func (r *Runtime) readFile(pid int, m *normalize.Mapping) (*fileInfo, error) {
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(filepath.Join(r.opt.ProcRoot, strconv.Itoa(pid)), m.Start, m.End, m.Path) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		f, oerr := elfx.OpenContext(ctx, pth, elfx.Limits{})
		cancel()
		if oerr != nil {
			err = oerr
			continue
		}
		fi := inspect(f)
		_ = f.Close()
		return fi, nil
	}
	return nil, fmt.Errorf("opening %s: %w", m.Path, err)
}

// loadBias is the difference between run-time and link-time addresses of
// the file mapped by m.
func loadBias(m *normalize.Mapping) (uint64, bool) {
	for _, s := range m.File.Loads {
		if m.Offset >= s.Off && m.Offset-s.Off < s.Filesz {
			return m.Start - (s.Vaddr + m.Offset - s.Off), true
		}
	}
	return 0, false
}

// codeRange finds V8's code in p: the copies of the builtins V8 maps into
// an isolate's code range (mappings of V8's file at the blob's offset, away
// from the file's own place), at most `most` of them, and at most `spans`
// spans of JIT code (anonymous executable mappings) around them. Each
// worker thread runs an isolate with a code range of its own. An isolate
// whose range V8 placed within reach of the file's own builtins (short
// builtin calls: node's static build, ranges right above its heap) has no
// copy, so a span is not only where the copies are: the pieces are grouped
// into clusters, each grown by at most codeRangeSpan at a time and never
// over another file's code (which the V8 walker would be handed); clusters
// holding copies come first, then those near the file's builtins, then the
// largest. left counts the copies and clusters not taken.
func codeRange(p *normalize.Process, file *normalize.Mapping, fi *fileInfo, most, spans int) (copies, jit [][2]uint64, left int) {
	bias, _ := loadBias(file)
	size := fi.blobHi - fi.blobLo
	// V8 maps whole pages: a range found without symbols may begin with
	// padding on the page before, which the copy does not hold.
	fileHi := fi.blobFileLo + size
	isCopy := func(m *normalize.Mapping) bool {
		if m.File == nil || m.File.ID != file.File.ID || fileHi <= m.Offset || fi.blobFileLo >= m.Offset+(m.End-m.Start) {
			return false
		}
		b, ok := loadBias(m)
		return !ok || b != bias // not the file's own text
	}
	type cluster struct {
		lo, hi uint64
		copies [][2]uint64
	}
	var cls []*cluster
	// p.Mappings is in address order: a piece joins the cluster before it
	// unless another file's code came between them.
	other := false
	for i := range p.Mappings {
		m := &p.Mappings[i]
		piece := [2]uint64{m.Start, m.End}
		var cp [][2]uint64
		switch {
		case isCopy(m):
			from := max(fi.blobFileLo, m.Offset)
			piece[0] = m.Start + from - m.Offset
			piece[1] = piece[0] + min(fileHi, m.Offset+(m.End-m.Start)) - from
			cp = [][2]uint64{piece}
		case m.Anonymous && m.File == nil && (m.Path == "" || strings.HasPrefix(m.Path, "[anon:")):
		default:
			other = other || m.File != nil
			continue
		}
		if n := len(cls); n > 0 && !other && piece[0]-cls[n-1].hi <= codeRangeSpan {
			c := cls[n-1]
			c.hi = max(c.hi, piece[1])
			c.copies = append(c.copies, cp...)
		} else {
			cls = append(cls, &cluster{lo: piece[0], hi: piece[1], copies: cp})
		}
		other = false
	}
	blob := [2]uint64{fi.blobLo + bias, fi.blobHi + bias}
	near := func(c *cluster) bool {
		return c.hi > blob[0]-min(blob[0], shortCallReach) && c.lo < blob[1]+shortCallReach
	}
	rank := func(c *cluster) int {
		switch {
		case len(c.copies) > 0:
			return 0
		case near(c):
			return 1
		}
		return 2
	}
	slices.SortStableFunc(cls, func(a, b *cluster) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return cmp.Compare(b.hi-b.lo, a.hi-a.lo)
	})
	for i, c := range cls {
		if i >= spans {
			left += max(1, len(c.copies))
			continue
		}
		for _, cp := range c.copies {
			if len(copies) == most {
				left++
				continue
			}
			copies = append(copies, cp)
		}
		jit = append(jit, [2]uint64{c.lo, c.hi})
	}
	slices.SortFunc(copies, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	slices.SortFunc(jit, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	return copies, jit, left
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
	r.fns.EvictWhere(func(k fnKey, _ *fnInfo) bool { return k.pid == pid }, func() bool { return false })
	r.jits.EvictWhere(func(k fnKey, _ []frame.Frame) bool { return k.pid == pid }, func() bool { return false })
	r.lines.EvictWhere(func(k fnKey, _ []int32) bool { return k.pid == pid }, func() bool { return false })
}

// Name names one JavaScript frame of pid: the function's name, its
// script, and for an interpreted frame the line and column of the
// bytecode it ran.
func (r *Runtime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	if f.Kind != FrameInterp && f.Kind != FrameJIT && f.Kind != FrameOpt {
		return runtimes.Symbol{}, fmt.Errorf("v8 frame kind %d: %w", f.Kind, runtimes.ErrNotAttached)
	}
	r.mu.Lock()
	st := r.procs[pid]
	r.mu.Unlock()
	if st == nil || st.err != nil {
		return runtimes.Symbol{}, fmt.Errorf("pid %d: %w", pid, runtimes.ErrNotAttached)
	}
	if f.Kind == FrameOpt || f.Kind == FrameJIT {
		k := fnKey{pid: pid, addr: f.Ptr, id: uint32(f.Aux), sfi: uint32(f.Aux >> 32)}
		if f.Kind == FrameJIT {
			k = fnKey{pid: pid, addr: f.Ptr, id: uint32(f.Aux), sfi: 2}
		}
		frs, ok := r.jits.Get(k)
		if !ok {
			var err error
			if f.Kind == FrameJIT {
				frs, err = r.readJIT(pid, st, f.Ptr, f.Aux)
			} else {
				frs, err = r.readOpt(pid, st, f.Ptr, f.Aux)
			}
			if err != nil {
				r.log.Debug("javascript frame left unnamed", zap.Int("pid", pid), zap.Uint64("function", f.Ptr), zap.Error(err))
				return runtimes.Symbol{}, err
			}
			r.jits.Add(k, frs)
		}
		return runtimes.Symbol{Frames: frs, Type: frame.TypeV8JS}, nil
	}
	// Interpreted frames are checked against the bytecode they ran; JIT
	// frames of other code by the SFI's type only.
	var id uint32
	if f.Kind == FrameInterp {
		id = uint32(f.Aux >> 32)
	}
	k := fnKey{pid: pid, addr: f.Ptr, id: id}
	fi, ok := r.fns.Get(k)
	if !ok {
		var err error
		if fi, err = r.read(pid, st, f.Ptr); err != nil {
			r.log.Debug("javascript frame left unnamed", zap.Int("pid", pid), zap.Uint64("sfi", f.Ptr), zap.Error(err))
			return runtimes.Symbol{}, err
		}
		if f.Kind == FrameJIT {
			fi = &fnInfo{name: fi.name, file: fi.file}
		}
		if f.Kind == FrameInterp && fi.bytecode != id {
			// Not the bytecode the frame ran: the function was moved,
			// flushed or freed since, and what is there now is not it.
			return runtimes.Symbol{}, fmt.Errorf("sfi %#x: bytecode %#x, frame ran %#x: %w", f.Ptr, fi.bytecode, id, runtimes.ErrBadFrame)
		}
		r.fns.Add(k, fi)
	}
	fr := frame.Frame{Name: fi.name, File: fi.file, StartFile: fi.file}
	if f.Kind == FrameInterp && fi.spt != nil {
		off := int64(int32(uint32(f.Aux))) - (st.lay.bytecodeHeader - 1)
		if pos := sourcePosition(fi.spt, off); pos >= 0 {
			fr.Line, fr.Column = lineCol(fi.lineEnds, pos)
		}
	}
	return runtimes.Symbol{Frames: []frame.Frame{fr}, Type: frame.TypeV8JS}, nil
}

// read reads a function of pid through its (cached) memory file.
func (r *Runtime) read(pid int, st *proc, sfi uint64) (*fnInfo, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*fnInfo, error) {
		rd := &reader{m: m, l: &st.lay, max: r.opt.Config.MaxNameBytes}
		return rd.function(sfi, r.scriptLines(pid, rd))
	})
}

// readJIT names a frame of JIT code that is not its function's current
// code (on-stack replacement, baseline code): the code object is searched
// from the PC; optimized code of the same function gives lines and
// inlined functions, anything else the function's name.
func (r *Runtime) readJIT(pid int, st *proc, sfi, pc uint64) ([]frame.Frame, error) {
	var code, start uint64
	var base frame.Frame
	baseline := false
	err := r.mems.Do(pid, func(m *runtimes.Mem) error {
		if !st.lay.jit {
			return nil // code objects unknown: the function's name only
		}
		rd := &reader{m: m, l: &st.lay, max: r.opt.Config.MaxNameBytes}
		if code, start = rd.codeAt(pc); code != 0 {
			base, baseline = rd.baselineFrame(code, sfi, pc-start, r.scriptLines(pid, rd))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if baseline {
		return []frame.Frame{base}, nil
	}
	if code != 0 {
		if frs, err := r.readOpt(pid, st, code, pc-start|uint64(uint32(sfi))<<32); err == nil {
			return frs, nil
		}
	}
	fi, err := runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) (*fnInfo, error) {
		rd := &reader{m: m, l: &st.lay, max: r.opt.Config.MaxNameBytes}
		return rd.function(sfi, nil)
	})
	if err != nil {
		return nil, err
	}
	return []frame.Frame{{Name: fi.name, File: fi.file, StartFile: fi.file}}, nil
}

// readOpt names an optimized frame of pid: code object code at the
// offset in aux's low bits, the function's SFI's low bits above them.
func (r *Runtime) readOpt(pid int, st *proc, code, aux uint64) ([]frame.Frame, error) {
	return runtimes.MemRead(r.mems, pid, func(m *runtimes.Mem) ([]frame.Frame, error) {
		rd := &reader{m: m, l: &st.lay, max: r.opt.Config.MaxNameBytes}
		return rd.optFrames(code, int64(uint32(aux)), uint32(aux>>32), st.lay.deopt, func(sfi uint64) (*fnInfo, error) {
			k := fnKey{pid: pid, addr: sfi, sfi: 1} // apart from a JIT frame's names-only entry
			if fi, ok := r.fns.Get(k); ok {
				return fi, nil
			}
			fi, err := rd.function(sfi, r.scriptLines(pid, rd))
			if err == nil {
				r.fns.Add(k, fi)
			}
			return fi, err
		})
	})
}

// scriptLines looks up (and caches) the line ends of pid's scripts.
func (r *Runtime) scriptLines(pid int, rd *reader) func(script uint64) ([]int32, error) {
	return func(script uint64) ([]int32, error) {
		k := fnKey{pid: pid, addr: script}
		if le, ok := r.lines.Get(k); ok {
			return le, nil
		}
		le, err := rd.lineEnds(script)
		if err == nil {
			r.lines.Add(k, le)
		}
		return le, err
	}
}

func framesCost(frs []frame.Frame) int64 {
	n := int64(64)
	for _, f := range frs {
		n += int64(len(f.Name)+len(f.File)) + 64
	}
	return n
}

// WalkStats sums the BPF walker's counters over CPUs.
func (r *Runtime) WalkStats() (bpf.ProfileV8Counters, error) {
	var sum bpf.ProfileV8Counters
	if r.opt.Counters == nil {
		return sum, nil
	}
	var per []bpf.ProfileV8Counters
	if err := r.opt.Counters.Lookup(uint32(0), &per); err != nil {
		return sum, err
	}
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		sum.Typed += p.Typed
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return sum, nil
}

// errorNames are the walker's reasons (enum v8_error), by value.
var errorNames = map[bpf.ProfileV8Error]string{
	bpf.ProfileV8ErrorV8ERR_NOT_ATTACHED: "not_attached",
	bpf.ProfileV8ErrorV8ERR_REFUSED:      "refused",
	bpf.ProfileV8ErrorV8ERR_READ_FRAME:   "read_frame",
	bpf.ProfileV8ErrorV8ERR_BAD_FP:       "bad_fp",
	bpf.ProfileV8ErrorV8ERR_NOT_FUNCTION: "not_function",
	bpf.ProfileV8ErrorV8ERR_READ_SFI:     "read_sfi",
}

// Errors returns the walker's failures so far, by reason (runtimes.WalkErrors).
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
