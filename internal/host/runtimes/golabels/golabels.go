// Package golabels puts a Go program's pprof labels (runtime/pprof.Do,
// SetGoroutineLabels) on its samples: it finds the Go processes, tells the
// BPF program (bpf/golabels.h) where their goroutines' labels pointer is,
// and reads the label sets those pointers lead to from the process.
package golabels

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/gopclntab"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Procs is the BPF map of the Go processes (go_procs); *ebpf.Map is one.
type Procs interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Tracker.
type Options struct {
	Procs    Procs
	Limits   Limits
	ProcRoot string // "" means /proc
	Logger   *zap.Logger
}

// Stats count what a Tracker did, cumulatively: Refused by reason
// (unsupported, process_gone, unreadable).
type Stats = runtimes.LabelStats

type fileResult struct {
	l   Layout
	err error
}

type proc struct {
	file normalize.FileID
	l    Layout
	err  error
}

// maxOpenMems bounds the /proc/PID/mem files kept open for reading label
// sets (one per process, least recently used closed first).
const maxOpenMems = 32

// Tracker holds the Go processes seen. Safe for concurrent use.
type Tracker struct {
	opt   Options
	log   *zap.Logger
	files *lru.Clock[normalize.FileID, fileResult]

	mu     sync.Mutex
	procs  map[int]*proc
	stats  Stats
	closed bool // Close ran: no file is opened any more

	memMu sync.Mutex // held while a mem is used: eviction closes it
	mems  *lru.Cache[int, *runtimes.Mem]
}

// New makes a Tracker.
func New(opt Options) *Tracker {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	return &Tracker{
		opt: opt, log: opt.Logger,
		files: lru.NewClock[normalize.FileID, fileResult](1024),
		mems:  lru.New[int, *runtimes.Mem](0, maxOpenMems, nil, func(_ int, m *runtimes.Mem) { _ = m.Close() }),
		procs: map[int]*proc{}, stats: Stats{Refused: map[string]uint64{}},
	}
}

// exe returns p's main executable mapping when it is a Go binary.
func exe(p *normalize.Process) *normalize.Mapping {
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File != nil && m.File.GoBuildID != "" && (p.ExePath == "" || m.Path == p.ExePath) {
			return m
		}
	}
	return nil
}

const openTimeout = 10 * time.Second

// Attach looks at a process snapshot: a Go program gets its entry in
// go_procs, anything else loses the one it had (exec).
func (t *Tracker) Attach(p *normalize.Process) {
	if t == nil || p == nil {
		return
	}
	m := exe(p)
	if m == nil {
		t.Forget(p.PID)
		return
	}
	t.mu.Lock()
	st := t.procs[p.PID]
	if st != nil && st.file == m.File.ID {
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	if st != nil {
		t.Forget(p.PID) // exec'd into another Go binary
	}
	fr, ok := t.files.Get(m.File.ID)
	if !ok {
		fr = t.inspect(p.PID, m)
		if !errors.Is(fr.err, runtimes.ErrProcessGone) {
			t.files.Add(m.File.ID, fr)
		}
	}
	st = &proc{file: m.File.ID, l: fr.l, err: fr.err}
	if st.err == nil {
		v := bpf.ProfileGoProc{TlsG: st.l.TLSG, G_m: st.l.GM, M_curg: st.l.MCurg, G_labels: st.l.GLabels}
		if err := t.opt.Procs.Put(uint32(p.PID), &v); err != nil {
			st.err = fmt.Errorf("go_procs: %w", err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.procs[p.PID] = st
	if st.err != nil {
		if errors.Is(st.err, runtimes.ErrProcessGone) {
			delete(t.procs, p.PID)
			return
		}
		t.stats.Refused[reason(st.err)]++
		t.log.Info("go program: no pprof labels", zap.Int("pid", p.PID), zap.String("exe", m.Path), zap.Error(st.err))
		return
	}
	t.stats.Attached++
	t.log.Debug("go program: reading pprof labels", zap.Int("pid", p.PID), zap.String("exe", m.Path))
}

func reason(err error) string {
	switch {
	case errors.Is(err, ErrUnsupported):
		return "unsupported"
	case errors.Is(err, runtimes.ErrProcessGone):
		return "process_gone"
	}
	return "unreadable"
}

// inspect reads the Go release and TLS slot of a Go executable.
func (t *Tracker) inspect(pid int, m *normalize.Mapping) fileResult {
	want, ok := machines[runtime.GOARCH]
	if !ok {
		return fileResult{err: fmt.Errorf("go labels on %s: %w", runtime.GOARCH, ErrUnsupported)}
	}
	root := t.opt.ProcRoot
	if root == "" {
		root = "/proc"
	}
	procDir := filepath.Join(root, strconv.Itoa(pid))
	var f *elfx.File
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(procDir, m.Start, m.End, m.Path) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		var oerr error
		f, oerr = elfx.OpenContext(ctx, pth, elfx.Limits{})
		cancel()
		if oerr == nil {
			break
		}
		err = oerr
	}
	if f == nil {
		return fileResult{err: fmt.Errorf("opening %s: %w", m.Path, err)}
	}
	defer func() { _ = f.Close() }()
	if f.Machine != want || f.Class != elf.ELFCLASS64 {
		return fileResult{err: fmt.Errorf("%s: %s: %w", m.Path, f.Machine, ErrUnsupported)}
	}
	v, err := gopclntab.GoVersion(f)
	if err != nil {
		return fileResult{err: err}
	}
	l, table, err := LayoutFor(v)
	if err != nil {
		return fileResult{err: err}
	}
	if gm, gl, mc, derr := offsetsFromDWARF(f); derr == nil {
		l.GM, l.GLabels, l.MCurg = gm, gl, mc
	} else if !table {
		return fileResult{err: fmt.Errorf("%s (%s): offsets not known, no DWARF: %w: %w", m.Path, v, ErrUnsupported, derr)}
	}
	if want == elf.EM_X86_64 {
		l.TLSG = tlsSlot(f) // arm64 keeps g in x28 (bpf/golabels.h)
	}
	return fileResult{l: l}
}

// machines are the architectures whose goroutine the BPF side finds: by
// the TLS slot (amd64) or register x28 (arm64).
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// tlsSlot is where g lives relative to the thread pointer. The Go linker
// puts runtime.tlsg first in the executable's TLS block, 8 bytes: fs-8.
// Linked externally (cgo) the block holds C's variables too; runtime.tlsg's
// TLS offset then says where, when the symbol table is kept.
func tlsSlot(f *elfx.File) int64 {
	var tls *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS {
			tls = p
		}
	}
	if tls == nil || tls.Memsz <= 8 {
		return -8
	}
	syms, err := f.Symbols()
	if err != nil {
		return -8
	}
	for _, s := range syms {
		if s.Name == "runtime.tlsg" && elf.ST_TYPE(s.Info) == elf.STT_TLS {
			align := max(tls.Align, 1)
			block := (tls.Memsz + align - 1) &^ (align - 1)
			return int64(s.Value) - int64(block)
		}
	}
	return -8
}

// Forget drops pid (it exited, or is no Go program any more).
func (t *Tracker) Forget(pid int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	st := t.procs[pid]
	delete(t.procs, pid)
	t.mu.Unlock()
	t.memMu.Lock()
	t.mems.Remove(pid)
	t.memMu.Unlock()
	if st == nil {
		return
	}
	if st.err == nil {
		_ = t.opt.Procs.Delete(uint32(pid))
	}
}

// Labels returns the label set at ptr in pid, sorted by key; nil when
// there is none or it cannot be read. It reads the set each time: the
// caller reads each (pid, ptr) once per report. A set kept from one
// report to the next would be wrong once the goroutine's set is freed
// and another allocated at its address (a span id's, a request's), which
// Go's allocator does often: sets of one size come from the same slots.
func (t *Tracker) Labels(pid int, ptr uint64) []Label {
	if t == nil || ptr == 0 {
		return nil
	}
	t.mu.Lock()
	st, closed := t.procs[pid], t.closed
	t.mu.Unlock()
	if st == nil || st.err != nil || closed {
		return nil
	}
	s, err := t.read(pid, ptr, st.l)
	t.mu.Lock()
	if err != nil {
		t.stats.Failed++
	} else {
		t.stats.Read++
	}
	t.mu.Unlock()
	if err != nil {
		t.log.Debug("go labels unreadable", zap.Int("pid", pid), zap.Uint64("ptr", ptr), zap.Error(err))
		if errors.Is(err, runtimes.ErrProcessGone) {
			return nil
		}
	}
	return s
}

// read reads the set at ptr through pid's memory file, opened on first use.
func (t *Tracker) read(pid int, ptr uint64, l Layout) ([]Label, error) {
	t.memMu.Lock()
	defer t.memMu.Unlock()
	mem, ok := t.mems.Get(pid)
	if !ok {
		var err error
		if mem, err = runtimes.OpenMem(t.opt.ProcRoot, pid); err != nil {
			return nil, err
		}
		t.mems.Add(pid, mem)
	}
	return Read(mem, ptr, l, t.opt.Limits)
}

// Reading is how many processes' labels are read now.
func (t *Tracker) Reading() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, st := range t.procs {
		if st.err == nil {
			n++
		}
	}
	return n
}

// Stats returns a copy of the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	st.Refused = make(map[string]uint64, len(t.stats.Refused))
	for k, v := range t.stats.Refused {
		st.Refused[k] = v
	}
	return st
}

// Close releases every process's memory file.
func (t *Tracker) Close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.memMu.Lock()
	defer t.memMu.Unlock()
	t.mems.Purge()
}
