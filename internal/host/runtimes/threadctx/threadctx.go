// Package threadctx puts the span a thread publishes in the OpenTelemetry
// thread context (OTEP 4947) on its samples: it finds the processes that
// export otel_thread_ctx_v1, works out where the variable sits relative
// to each thread's thread pointer, and tells the BPF program
// (bpf/threadctx.h), which copies the span's ids into every sample.
package threadctx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/lru"
)

// Procs is the BPF map of the publishing processes (tctx_procs); *ebpf.Map
// is one.
type Procs interface {
	Put(key, value any) error
	Delete(key any) error
}

// Options configure a Tracker.
type Options struct {
	Procs    Procs
	ProcRoot string // "" means /proc
	Logger   *zap.Logger
	// RetryEvery and Retries bound how long a library the loader has not
	// relocated yet is waited for (defaults 100 ms, 50 times).
	RetryEvery time.Duration
	Retries    int
}

// Stats count what a Tracker did, cumulatively.
type Stats struct {
	Attached uint64            // processes whose spans are read
	Refused  map[string]uint64 // publishing processes that cannot be read, by reason
}

type fileResult struct {
	w     Where
	found bool
	err   error
}

type proc struct {
	file  normalize.FileID // the publishing file
	off   int64
	err   error
	tries int
	timer *time.Timer
}

const openTimeout = 10 * time.Second

// Tracker holds the publishing processes. Safe for concurrent use.
type Tracker struct {
	opt   Options
	log   *zap.Logger
	files *lru.Clock[normalize.FileID, fileResult]

	mu     sync.Mutex
	procs  map[int]*proc
	stats  Stats
	closed bool
}

// New makes a Tracker.
func New(opt Options) *Tracker {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.RetryEvery <= 0 {
		opt.RetryEvery = 100 * time.Millisecond
	}
	if opt.Retries <= 0 {
		opt.Retries = 50
	}
	return &Tracker{
		opt: opt, log: opt.Logger,
		files: lru.NewClock[normalize.FileID, fileResult](4096),
		procs: map[int]*proc{}, stats: Stats{Refused: map[string]uint64{}},
	}
}

// Attach looks at a process snapshot: a process one of whose files exports
// otel_thread_ctx_v1 gets its tctx_procs entry; one that no longer does
// (exec) loses it.
func (t *Tracker) Attach(p *normalize.Process) {
	if t == nil || p == nil {
		return
	}
	m, fr := t.publisher(p)
	if m == nil {
		t.Forget(p.PID)
		return
	}
	t.mu.Lock()
	st := t.procs[p.PID]
	if t.closed || (st != nil && st.file == m.File.ID && (st.err == nil || st.timer != nil)) {
		t.mu.Unlock()
		return // known, or waiting for the loader
	}
	t.mu.Unlock()
	t.Forget(p.PID)
	t.place(p.PID, m, fr, 0)
}

// publisher returns the mapping of p's first file exporting the variable
// (the executable before libraries), with what the file says of it.
func (t *Tracker) publisher(p *normalize.Process) (*normalize.Mapping, fileResult) {
	seen := map[normalize.FileID]bool{}
	var best *normalize.Mapping
	var bestFR fileResult
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File == nil || m.File.Err != nil || m.Anonymous || seen[m.File.ID] {
			continue
		}
		seen[m.File.ID] = true
		exe := p.ExePath != "" && m.Path == p.ExePath
		fr, ok := t.files.Get(m.File.ID)
		if !ok {
			fr = t.inspect(p.PID, m, exe)
			t.files.Add(m.File.ID, fr)
		}
		if !fr.found {
			continue
		}
		if best == nil || exe {
			best, bestFR = m, fr
		}
		if exe {
			break
		}
	}
	return best, bestFR
}

func (t *Tracker) inspect(pid int, m *normalize.Mapping, exe bool) fileResult {
	root := t.opt.ProcRoot
	if root == "" {
		root = "/proc"
	}
	var f *elfx.File
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(filepath.Join(root, strconv.Itoa(pid)), m.Start, m.End, m.Path) {
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
		// Unreadable files are no publishers we can follow; the
		// process keeps its samples, without spans.
		t.log.Debug("thread context: file unreadable", zap.String("path", m.Path), zap.Error(err))
		return fileResult{}
	}
	defer func() { _ = f.Close() }()
	w, found, ierr := Inspect(f, exe)
	return fileResult{w: w, found: found, err: ierr}
}

// place works out the offset in pid and writes the entry; a library the
// loader has not relocated yet is looked at again RetryEvery later.
func (t *Tracker) place(pid int, m *normalize.Mapping, fr fileResult, tries int) {
	st := &proc{file: m.File.ID, err: fr.err, tries: tries}
	if st.err == nil {
		st.off, st.err = t.offset(pid, m, fr.w)
	}
	if errors.Is(st.err, runtimes.ErrNotLoaded) && tries < t.opt.Retries {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return
		}
		mc := *m
		st.timer = time.AfterFunc(t.opt.RetryEvery, func() { t.retry(pid, st, &mc, fr) })
		t.procs[pid] = st
		return
	}
	if st.err == nil {
		v := bpf.ProfileTctxProc{TlsOff: st.off}
		if err := t.opt.Procs.Put(uint32(pid), &v); err != nil {
			st.err = fmt.Errorf("tctx_procs: %w", err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if errors.Is(st.err, runtimes.ErrProcessGone) {
		return
	}
	t.procs[pid] = st
	if st.err != nil {
		t.stats.Refused[reason(st.err)]++
		t.log.Info("process publishes a thread context that cannot be read: no span ids on its samples",
			zap.Int("pid", pid), zap.String("file", m.Path), zap.Error(st.err))
		return
	}
	t.stats.Attached++
	t.log.Debug("thread context: reading span ids", zap.Int("pid", pid), zap.String("file", m.Path), zap.Int64("tls_offset", st.off))
}

// retry places pid again if st is still its state (no Forget, no exec).
func (t *Tracker) retry(pid int, st *proc, m *normalize.Mapping, fr fileResult) {
	t.mu.Lock()
	if t.closed || t.procs[pid] != st {
		t.mu.Unlock()
		return
	}
	delete(t.procs, pid)
	t.mu.Unlock()
	t.place(pid, m, fr, st.tries+1)
}

// offset is the variable's offset from pid's thread pointer.
func (t *Tracker) offset(pid int, m *normalize.Mapping, w Where) (int64, error) {
	if w.How == Static {
		return Resolve(w, 0, 0)
	}
	if err := runtimes.Loaded(t.opt.ProcRoot, pid, m); err != nil {
		return 0, err
	}
	v, ok := addrmap.FileOffsetToVaddr(m.File.Loads, m.Offset)
	if !ok {
		return 0, fmt.Errorf("%s: mapping offset %#x outside its segments", m.Path, m.Offset)
	}
	mem, err := runtimes.OpenMem(t.opt.ProcRoot, pid)
	if err != nil {
		return 0, err
	}
	defer func() { _ = mem.Close() }()
	var buf [16]byte
	if err := mem.Read(m.Start-v+w.Slot, buf[:]); err != nil {
		return 0, fmt.Errorf("reading the GOT of %s: %w", m.Path, err)
	}
	return Resolve(w, binary.LittleEndian.Uint64(buf[:8]), binary.LittleEndian.Uint64(buf[8:]))
}

func reason(err error) string {
	switch {
	case errors.Is(err, ErrUnsupported):
		return "unsupported"
	case errors.Is(err, runtimes.ErrNotLoaded):
		return "not_loaded"
	}
	return "unreadable"
}

// Forget drops pid (it exited, or no longer publishes).
func (t *Tracker) Forget(pid int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	st := t.procs[pid]
	delete(t.procs, pid)
	t.mu.Unlock()
	if st == nil {
		return
	}
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.err == nil {
		_ = t.opt.Procs.Delete(uint32(pid))
	}
}

// Reading is how many processes' spans are read now.
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
	st.Refused = maps.Clone(t.stats.Refused)
	return st
}

// Close stops the retries.
func (t *Tracker) Close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, st := range t.procs {
		if st.timer != nil {
			st.timer.Stop()
		}
	}
}
