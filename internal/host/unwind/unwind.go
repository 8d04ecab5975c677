//go:build linux && (amd64 || arm64)

// Package unwind keeps the eBPF sampler's unwind tables: one table per
// executable file (built from .eh_frame, .debug_frame or Go's pcsp by package
// table, off the sampling path), shared by every process that maps the file,
// and one sorted list of executable mappings per process that points each
// address range at its file's table. The BPF walker (bpf/unwind.h) reads
// them. See docs/unwinding.md.
package unwind

import (
	"container/list"
	"debug/elf"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// Maps are the sampler's BPF maps the tables live in, and a function that
// returns once no BPF program can still be reading what was there before
// the call (an RCU grace period).
type Maps struct {
	Procs, Mappings, Tables, Rows *ebpf.Map
	// Exits marks the processes that exited and are not forgotten yet
	// (bpf/unwind.h unwind_exits). Optional.
	Exits *ebpf.Map
	Sync  func() error
	// Seen holds per process, besides that it was announced, its stack
	// copies so far (bpf/unwind.h not_ready_step); Ignore spends them.
	// Optional.
	Seen *ebpf.Map
	// ExecTimes holds when each sampled process last exec'd
	// (CLOCK_BOOTTIME): a stack copy taken before then is of the image
	// the process replaced (copy.go). Optional.
	ExecTimes *ebpf.Map
}

// speculativeDelay: a table queued because a process maps the file, not
// because a sample waits for it, is built this long after, so that the
// tables of processes that exit at once (most short-lived processes: a
// shell's commands) are never built. A sample that needs the table meanwhile
// makes it wanted, and it is built at once.
const speculativeDelay = 100 * time.Millisecond

// eagerCost: files with up to this many bytes of unwind information
// (.eh_frame, .debug_frame, .gopclntab) get their table when first mapped,
// larger ones when first sampled. Building costs 5-40 ms per MB of it
// (docs/unwinding.md); libc has 0.15 MB.
const eagerCost = 1 << 20

// slot 0 of unwind_tables never holds a table: it is the "no room" slot,
// whose state is stateNone, for files that got no slot of their own.
const noRoomSlot = 0

type file struct {
	id    normalize.FileID
	path  string
	slot  uint32
	refs  int
	state uint32
	rows  span
	base  uint64 // ELF address of row 0
	// rowIndex is the pc of every rowIndexStride-th row: a stack copy's
	// walk finds a row by it and one block of rows read from the map,
	// not by a map lookup per step of a binary search.
	rowIndex []uint32
	lru      *list.Element // in Manager.idle while refs == 0 and the table holds rows
	noRoom   bool
	queued   bool
	building bool
	wanted   bool      // a sample is waiting for this table
	eligible time.Time // a speculative build waits until then (see speculativeDelay)
	cost     int64     // bytes of unwind information: orders the builds
	retired  bool      // evicted: the slot and rows are released
	// unopened: the last build found no process to open the file through
	// (all gone or exec'd since their snapshot); the next process that
	// maps it brings paths that work, and it is tried again then.
	unopened bool
}

type proc struct {
	maps  span
	files []*file
	opens [][2]string // per files[i]: the paths to open it by through this process
	// What a copied stack is walked with on the host (copy.go): the
	// mappings as loaded, and the files by their table slot.
	ents   []bpf.ProfileUnwindMapping
	bySlot map[uint32]*file
}

// Manager owns the table maps' contents. Safe for concurrent use.
type Manager struct {
	cfg  Config
	maps Maps
	log  *zap.Logger
	// maxRows bounds a build: a table larger than the rows map could never
	// be loaded, so its build stops there, and a build's transient memory
	// (about 2-2.5 times its rows' 8 bytes) is bounded by max_table_bytes.
	maxRows int

	mu      sync.Mutex
	files   map[normalize.FileID]*file
	bySlot  map[uint32]*file
	procs   map[int]*proc
	rows    *allocator
	mapSlot *allocator
	slots   *allocator // of unwind_tables
	idle    *list.List // unreferenced files with rows, least recently used first
	queue   []*file
	// Builders run only while there is work (see kick): an idle agent has
	// no goroutine to wake, and each wake costs tens of µs of CPU.
	builders int  // running
	bigBuild bool // one of them builds a file over fastLaneCost
	wake     *time.Timer
	wakeAt   time.Time
	workers  sync.WaitGroup
	stats    Stats
	closed   bool
	runtimes map[int]Runtime // by pid, kept across Track

	// Stacks copied by the BPF walker (copy.go): waiting for their
	// process's tables, walked and not yet taken, and the exited
	// processes copies still wait on (their files referenced).
	copies []*pendingCopy
	walked []WalkedCopy
	dead   map[int]*proc
	// copyWalks counts host walks of copies, retries included (tests).
	copyWalks int
	// blocks are the blocks of rows copy walks read lately (rowBlock).
	blocks map[blockKey][]bpf.ProfileUnwindRow
}

func (m *Manager) procValue(pid int, sp span) bpf.ProfileUnwindProc {
	val := bpf.ProfileUnwindProc{First: sp.off, Count: sp.n}
	if rt, ok := m.runtimes[pid]; ok {
		val.RtKind = rt.Kind
		for i, r := range rt.Ranges[:min(len(rt.Ranges), MaxRuntimeRanges)] {
			val.Rt[i].Lo, val.Rt[i].Hi = r[0], r[1]
		}
	}
	return val
}

// SetRuntime tells the walker which runtime pid runs (a zero Runtime:
// none). It lasts until Forget, across Track.
func (m *Manager) SetRuntime(pid int, rt Runtime) error {
	if len(rt.Ranges) > MaxRuntimeRanges {
		return fmt.Errorf("unwind: %d runtime code ranges, at most %d", len(rt.Ranges), MaxRuntimeRanges)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	if rt.Kind == 0 {
		delete(m.runtimes, pid)
	} else {
		m.runtimes[pid] = rt
	}
	pr := m.procs[pid]
	if pr == nil {
		return nil // Track writes it
	}
	if err := m.maps.Procs.Update(uint32(pid), m.procValue(pid, pr.maps), ebpf.UpdateExist); err != nil &&
		!errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unwind: pid %d: %w", pid, err)
	}
	return nil
}

// New starts a Manager over maps sized by cfg (the sampler sizes them).
func New(cfg Config, maps Maps) (*Manager, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, maps: maps, log: cfg.Logger, maxRows: min(MaxRowsPerTable, int(cfg.Rows())),
		files: map[normalize.FileID]*file{}, bySlot: map[uint32]*file{}, procs: map[int]*proc{}, runtimes: map[int]Runtime{}, dead: map[int]*proc{},
		rows:    newAllocator(cfg.Rows()),
		mapSlot: newAllocator(uint32(cfg.MaxMappings)),
		slots:   newAllocator(uint32(cfg.MaxTables)),
		idle:    list.New(),
	}
	m.slots.alloc(1) // noRoomSlot
	if err := maps.Tables.Put(uint32(noRoomSlot), bpf.ProfileUnwindTable{State: stateNone}); err != nil {
		return nil, fmt.Errorf("unwind: %w", err)
	}
	return m, nil
}

// Close stops the builder. The maps belong to the sampler.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	if m.wake != nil {
		m.wake.Stop()
	}
	m.mu.Unlock()
	m.workers.Wait()
}

// Stats returns the current figures.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.CopiesWaiting = len(m.copies)
	st.Processes = len(m.procs)
	st.Mappings = int(m.mapSlot.used)
	st.Rows = int(m.rows.used)
	st.RowBytes = int64(m.rows.used) * RowBytes
	for _, f := range m.files {
		switch f.state {
		case stateReady:
			st.Tables++
		case statePending:
			st.TablesPending++
		case stateLazy:
			st.TablesLazy++
		default:
			st.TablesNone++
		}
	}
	return st
}

// Track loads (or replaces) p's mappings, queueing a table build for every
// file not seen before. Until a table is ready, the BPF side walks that
// file's frames with frame pointers and marks the stack not_ready.
func (m *Manager) Track(p *normalize.Process) error {
	if p == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	pr := &proc{bySlot: map[uint32]*file{}}
	ents := make([]bpf.ProfileUnwindMapping, 0, len(p.Mappings))
	for i := range p.Mappings {
		if len(ents) == MaxMappingsPerProcess {
			break // as far as the BPF search reaches; the rest walk with FP, marked unknown_mapping
		}
		mp := &p.Mappings[i]
		e := bpf.ProfileUnwindMapping{Start: mp.Start, End: mp.End, Table: tableFP}
		if mp.Path == "[vdso]" {
			e.Table = tableVDSO
		}
		if fi := mp.File; fi != nil && fi.Err == nil && len(fi.Loads) > 0 {
			if bias, ok := loadBias(fi.Loads, mp); ok {
				f := m.fileFor(fi)
				pr.files = append(pr.files, f)
				pr.opens = append(pr.opens, openPaths(m.cfg.ProcRoot, p.PID, mp))
				pr.bySlot[f.slot] = f
				e.Table = f.slot
				e.Bias = bias
			}
		}
		ents = append(ents, e)
	}
	old := m.procs[p.PID]
	sp, ok := m.mapSlot.alloc(uint32(len(ents)))
	if !ok && len(m.mapSlot.pending) > 0 {
		if err := m.reclaim(); err != nil {
			m.unref(pr.files)
			return err
		}
		sp, ok = m.mapSlot.alloc(uint32(len(ents)))
	}
	if !ok {
		m.stats.ProcsNoRoom++
		m.unref(pr.files)
		m.log.Debug("no room for the mappings of a process: frame pointers", zap.Int("pid", p.PID))
		return nil
	}
	pr.maps = sp
	pr.ents = ents
	if err := m.writeMappings(sp, ents); err != nil {
		m.mapSlot.release(sp)
		m.unref(pr.files)
		return err
	}
	if err := m.maps.Procs.Put(uint32(p.PID), m.procValue(p.PID, sp)); err != nil {
		m.mapSlot.release(sp)
		m.unref(pr.files)
		if errors.Is(err, errE2BIG) {
			m.stats.ProcsNoRoom++
			return nil
		}
		return fmt.Errorf("unwind: pid %d: %w", p.PID, err)
	}
	m.procs[p.PID] = pr
	if old != nil {
		m.mapSlot.release(old.maps)
		m.retireProc(p.PID, old)
	}
	m.tryCopies(p.PID, time.Time{})
	return nil
}

// retireProc releases pr's files, unless copies of its stacks wait for
// them: then it stays in m.dead until they are walked.
func (m *Manager) retireProc(pid int, pr *proc) {
	for _, c := range m.copies {
		if c.pr == pr || c.pr == nil && int(c.c.Pid) == pid {
			if old := m.dead[pid]; old != nil && old != pr {
				m.unref(old.files) // one image of a pid waits at a time
			}
			for _, c := range m.copies {
				if c.pr == nil && int(c.c.Pid) == pid {
					c.pr = pr
				}
			}
			m.dead[pid] = pr
			return
		}
	}
	m.unref(pr.files)
}

// loadBias returns pc - (ELF address of pc) for the code of mapping mp: the
// bias of the executable PT_LOAD segment whose file bytes the mapping holds.
// Mapping offsets are page-aligned and segments need not be (lld), so the
// mapping's first byte may belong to the segment before; its bias would be
// wrong for the code.
func loadBias(loads []elfx.Segment, mp *normalize.Mapping) (uint64, bool) {
	lo, hi := mp.Offset, mp.Offset+(mp.End-mp.Start)
	for _, s := range loads {
		if s.Flags&elf.PF_X == 0 || s.Off >= hi || s.Off+s.Filesz <= lo {
			continue
		}
		return mp.Start - mp.Offset + s.Off - s.Vaddr, true
	}
	if v, ok := addrmap.FileOffsetToVaddr(loads, mp.Offset); ok {
		return mp.Start - v, true
	}
	return 0, false
}

// Forget drops pid's mappings (it exited; the BPF side already dropped its
// entry, so a reused PID never sees them).
func (m *Manager) Forget(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.runtimes, pid)
	pr := m.procs[pid]
	if pr == nil {
		m.deleteExit(pid) // marked though never loaded (bpf/profile.c handle_exit)
		return
	}
	m.tryCopies(pid, time.Time{}) // binds its copies that came before its mappings
	delete(m.procs, pid)
	_ = m.maps.Procs.Delete(uint32(pid))
	m.deleteExit(pid)
	m.mapSlot.release(pr.maps)
	m.retireProc(pid, pr)
}

// Tracked reports whether pid has mappings in the kernel (checked there).
func (m *Manager) Tracked(pid int) bool {
	m.mu.Lock()
	_, ok := m.procs[pid]
	m.mu.Unlock()
	var v bpf.ProfileUnwindProc
	return ok || m.maps.Procs.Lookup(uint32(pid), &v) == nil
}

func (m *Manager) writeMappings(sp span, ents []bpf.ProfileUnwindMapping) error {
	if len(ents) == 0 {
		return nil
	}
	keys := make([]uint32, len(ents))
	for i := range keys {
		keys[i] = sp.off + uint32(i)
	}
	if _, err := m.maps.Mappings.BatchUpdate(keys, ents, nil); err != nil {
		return fmt.Errorf("unwind: writing mappings: %w", err)
	}
	return nil
}

// openPaths are the paths to open mp's file by through pid: its mapping
// (right while the process lives and maps it there), and its path under the
// process's root (for a chrooted process /proc/PID/maps gives the path from
// the host's root, which misses under the chroot; the FileID check catches
// any other file).
func openPaths(procRoot string, pid int, mp *normalize.Mapping) [2]string {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	return [2]string{
		filepath.Join(dir, "map_files", fmt.Sprintf("%x-%x", mp.Start, mp.End)),
		filepath.Join(dir, "root", mp.Path),
	}
}

// maxOpens bounds the paths a build tries: those of four processes.
const maxOpens = 8

// opensOf returns the paths to open f by, those of the processes the BPF
// side still has (alive, same image) first. They are gathered when the
// build starts, not when the file was first seen: the processes that saw it
// first may be gone while others map it still (a chrooted JVM's libc was
// first seen in the shell that exec'd java).
func (m *Manager) opensOf(f *file) []string {
	var alive, rest []string
	for pid, pr := range m.procs {
		for i, g := range pr.files {
			if g != f {
				continue
			}
			if len(alive) < maxOpens && m.runsImage(pid) {
				alive = append(alive, pr.opens[i][:]...)
			} else if len(rest) < maxOpens {
				rest = append(rest, pr.opens[i][:]...)
			}
			break
		}
	}
	return append(alive, rest...)[:min(len(alive)+len(rest), maxOpens)]
}

// fileFor returns the file of fi with a reference taken, creating its
// entry and queueing its build on first sight.
func (m *Manager) fileFor(fi *normalize.FileInfo) *file {
	f := m.files[fi.ID]
	if f == nil {
		// Built only once a sample needs it (Request): most files of
		// most processes are never sampled.
		f = &file{id: fi.ID, path: fi.Path, state: stateLazy, cost: fi.UnwindBytes}
		if f.cost == 0 {
			f.cost = fi.Size // no section headers: the file's size bounds it
		}
		if s, ok := m.allocSlot(); ok {
			f.slot = s
			_ = m.maps.Tables.Put(s, bpf.ProfileUnwindTable{State: stateLazy})
			m.files[fi.ID] = f
			m.bySlot[s] = f
			if f.cost <= eagerCost {
				// Cheap enough to build now, so that a new program's
				// first samples find its own binary, ld.so and libc ready;
				// after the tables samples are waiting for.
				m.request(f, false)
			}
		} else {
			f.slot, f.state, f.noRoom = noRoomSlot, stateNone, true
			m.stats.NoRoom++
			// Not remembered: the next process mapping it tries again.
		}
	} else if f.state == stateLazy && f.cost <= eagerCost && !f.queued && !f.building {
		m.request(f, false) // its build was skipped: its processes had gone
	} else if f.unopened && !f.queued && !f.building {
		// Its last build could open it through none of the processes
		// then known; this one can: back to lazy, as if new (a sample
		// asks, or a cheap file is queued).
		f.unopened, f.wanted = false, false
		f.state = stateLazy
		_ = m.maps.Tables.Put(f.slot, bpf.ProfileUnwindTable{State: stateLazy})
		if f.cost <= eagerCost {
			m.request(f, false)
		}
	}
	if f.lru != nil {
		m.idle.Remove(f.lru)
		f.lru = nil
	}
	f.refs++
	return f
}

func (m *Manager) unref(fs []*file) {
	for _, f := range fs {
		if f.slot == noRoomSlot && f.noRoom {
			continue
		}
		f.refs--
		if f.refs == 0 {
			switch {
			case f.state == stateReady:
				f.lru = m.idle.PushBack(f)
			case f.queued:
				// Its processes are gone before the builders reached it
				// (most short-lived processes): no build. The next process
				// that maps the file queues it again.
				m.dequeue(f)
				m.stats.BuildsSkipped++
				m.retire(f)
			case f.state != statePending:
				m.retire(f) // nothing worth caching
			}
		}
	}
}

// allocSlot takes a table slot, evicting the least recently used idle
// table when none is free.
func (m *Manager) allocSlot() (uint32, bool) {
	for {
		if s, ok := m.slots.alloc(1); ok {
			return s.off, true
		}
		if len(m.slots.pending) > 0 {
			if m.reclaim() == nil {
				continue
			}
			return 0, false
		}
		if !m.evictOne() {
			return 0, false
		}
	}
}

// evictOne drops the least recently used unreferenced table.
func (m *Manager) evictOne() bool {
	e := m.idle.Front()
	if e == nil {
		return false
	}
	f := e.Value.(*file)
	m.idle.Remove(e)
	f.lru = nil
	m.retire(f)
	m.stats.Evictions++
	return true
}

// retire forgets f and releases its slot and rows once no program can
// still read them.
func (m *Manager) retire(f *file) {
	if f.retired {
		return
	}
	f.retired = true
	if m.files[f.id] == f {
		delete(m.files, f.id)
	}
	if m.bySlot[f.slot] == f {
		delete(m.bySlot, f.slot)
	}
	m.rows.release(f.rows)
	f.rows, f.rowIndex = span{}, nil
	for k := range m.blocks {
		if k.f == f {
			delete(m.blocks, k) // its rows go to another file
		}
	}
	if f.slot != noRoomSlot {
		_ = m.maps.Tables.Put(f.slot, bpf.ProfileUnwindTable{State: stateNone})
		m.slots.release(span{f.slot, 1})
	}
}

// reclaim waits for a grace period, after which released spans are free.
func (m *Manager) reclaim() error {
	if err := m.maps.Sync(); err != nil {
		return fmt.Errorf("unwind: waiting for BPF programs: %w", err)
	}
	m.rows.settle()
	m.mapSlot.settle()
	m.slots.settle()
	return nil
}

// Request queues the build of the table in slot: a sample needed it (the
// BPF side flipped it from lazy to pending and said so).
func (m *Manager) Request(slot uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.bySlot[slot]
	if f == nil || m.closed {
		return
	}
	m.asked(f)
}

// asked answers the BPF side's "pending" in f's slot.
func (m *Manager) asked(f *file) {
	switch f.state {
	case stateReady:
		// The BPF side read "lazy" just before the table was published
		// and wrote "pending" over it: publish it again.
		m.publish(f)
	case stateNone:
		// The same race over "none" (the build failed meanwhile): put it
		// back, or the file would say not_ready, and never be asked for,
		// for as long as it is mapped.
		m.setState(f, stateNone)
	default:
		m.request(f, true)
	}
}

// publish writes f's ready table into its slot.
func (m *Manager) publish(f *file) {
	t := bpf.ProfileUnwindTable{Base: f.base, First: f.rows.off, Count: f.rows.n, State: stateReady}
	if err := m.maps.Tables.Put(f.slot, t); err != nil {
		m.log.Warn("publishing an unwind table failed", zap.String("file", f.path), zap.Error(err))
	}
}

// request queues f's build. wanted: a sample is waiting for it (the BPF
// side flipped it to pending), which puts it ahead of speculative builds.
// A speculative build leaves the kernel's state "lazy", so that a sample
// still says when it needs the table.
func (m *Manager) request(f *file, wanted bool) {
	if wanted && !f.wanted {
		f.wanted = true
		f.eligible = time.Time{}
		if f.slot != noRoomSlot && f.state != stateReady {
			_ = m.maps.Tables.Put(f.slot, bpf.ProfileUnwindTable{State: statePending})
		}
		if f.queued {
			m.kick() // eligible now
		}
	}
	if f.state != stateLazy && f.state != statePending || f.queued || f.building {
		return
	}
	f.state = statePending
	if !wanted {
		f.eligible = time.Now().Add(speculativeDelay)
	}
	m.enqueue(f)
}

// Poll finds tables the BPF side asked for whose event was lost (events
// ring full) and queues them, and republishes ready tables (or puts back
// "none") the BPF side marked pending over (it read "lazy" just before,
// and its store is a plain one: 5.10 has no BPF compare-and-swap), which
// Request does when that event arrives. Cheap: one lookup per table; run
// it once per report interval.
func (m *Manager) Poll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	var t bpf.ProfileUnwindTable
	for slot, f := range m.bySlot {
		if f.state == statePending && f.wanted {
			continue
		}
		if err := m.maps.Tables.Lookup(slot, &t); err != nil || t.State != statePending {
			continue
		}
		if f.state == stateReady {
			m.stats.Republished++
		}
		m.asked(f)
	}
}

// reclaimUnlocked is reclaim for the builders: it waits for the grace
// period without m.mu (held on entry and on return), so process events are
// not held up, and frees only what was released before the wait.
func (m *Manager) reclaimUnlocked() error {
	rows, maps, slots := m.rows.takePending(), m.mapSlot.takePending(), m.slots.takePending()
	m.mu.Unlock()
	err := m.maps.Sync()
	m.mu.Lock()
	if err != nil {
		m.rows.pending = append(m.rows.pending, rows...)
		m.mapSlot.pending = append(m.mapSlot.pending, maps...)
		m.slots.pending = append(m.slots.pending, slots...)
		return fmt.Errorf("unwind: waiting for BPF programs: %w", err)
	}
	m.rows.addFree(rows)
	m.mapSlot.addFree(maps)
	m.slots.addFree(slots)
	return nil
}

func (m *Manager) enqueue(f *file) {
	f.queued = true
	m.queue = append(m.queue, f)
	m.kick()
}

// anyAlive reports whether a tracked process that maps f still runs its
// image.
func (m *Manager) anyAlive(f *file) bool {
	for pid, pr := range m.procs {
		if slices.Contains(pr.files, f) && m.runsImage(pid) {
			return true
		}
	}
	return false
}

// runsImage reports whether the BPF side says pid still runs the image it
// was loaded with: exec drops its entry, exit marks it (unwind_exits) until
// Forget drops it.
func (m *Manager) runsImage(pid int) bool {
	var v bpf.ProfileUnwindProc
	return m.maps.Procs.Lookup(uint32(pid), &v) == nil && !m.exited(pid)
}

// exited reports whether the exit tracepoint marked pid.
func (m *Manager) exited(pid int) bool {
	var start uint64
	return m.maps.Exits != nil && m.maps.Exits.Lookup(uint32(pid), &start) == nil
}

func (m *Manager) deleteExit(pid int) {
	if m.maps.Exits != nil {
		_ = m.maps.Exits.Delete(uint32(pid))
	}
}

// setLazy leaves f unbuilt until a sample or a new process asks for it.
func (m *Manager) setLazy(f *file) {
	f.state, f.eligible = stateLazy, time.Time{}
}

func (m *Manager) dequeue(f *file) {
	if i := slices.Index(m.queue, f); i >= 0 {
		m.queue = slices.Delete(m.queue, i, i+1)
	}
	f.queued = false
}

// wakeBuilders arranges a kick at t, when a speculative build becomes
// eligible.
func (m *Manager) wakeBuilders(t time.Time) {
	if m.wake != nil && !m.wakeAt.After(t) {
		return
	}
	if m.wake != nil {
		m.wake.Stop()
	}
	m.wakeAt = t
	m.wake = time.AfterFunc(time.Until(t), func() {
		m.mu.Lock()
		m.wake = nil
		m.kick()
		m.mu.Unlock()
	})
}
