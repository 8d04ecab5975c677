//go:build linux && (amd64 || arm64)

package unwind

// Stacks the BPF walker copied because it met code whose table was not
// loaded yet (a new process's first samples): they wait here until the
// process's mappings and tables are, then are walked with the same rows
// the BPF walker reads, in the copied bytes. docs/unwinding.md.

import (
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"

	"github.com/profsym/profsym/bpf"
)

// StackCopy is a not-ready sample's stack as the BPF walker copied it
// (struct stack_copy).
type StackCopy struct {
	Pid, Tid, CPU uint32
	Comm          string
	BootNs        uint64 // CLOCK_BOOTTIME of the sample
	// PC, SP, FP are the registers of the frame at PC, the last of Walked.
	PC, SP, FP uint64
	PCExact    bool     // PC is no return address (the leaf)
	Walked     []uint64 // the walk so far, words as in the walked stacks
	Kernel     []uint64
	Stack      []byte // copied from SP up
	// FPCallers are the callers of PC checked frame-pointer steps gave:
	// the walk a copy that cannot be walked gets, as without copies.
	FPCallers []uint64
}

// unwalked is c as far as the BPF walker got without the copy, marked
// not_ready: for a copy whose process or tables never load. The BPF side
// takes the frame-pointer callers without searching the mappings (that
// search, 32 times over, was most of the copy program's verification);
// with the process known (pr) they end here at the first PC in none of
// its mappings, where the walk without copies ends (untrusted_fp_step).
func unwalked(c *StackCopy, pr *proc, maxWords int) WalkedCopy {
	fp := c.FPCallers
	if pr != nil {
		for i, pc := range fp {
			if !pr.mapped(pc - 1) {
				fp = fp[:i]
				break
			}
		}
	}
	w := append(append(make([]uint64, 0, len(c.Walked)+len(fp)), c.Walked...), fp...)
	return WalkedCopy{Copy: c, Words: w[:min(len(w), maxWords)], Reason: stopNotReady}
}

// mapped reports whether addr is in one of the process's executable
// mappings as loaded.
func (pr *proc) mapped(addr uint64) bool {
	i := sort.Search(len(pr.ents), func(i int) bool { return pr.ents[i].Start > addr }) - 1
	return i >= 0 && addr < pr.ents[i].End
}

// WalkedCopy is a StackCopy walked on the host: Words (as the BPF walker
// stores a walked stack) and the stop reason (enum stop_reason).
type WalkedCopy struct {
	Copy   *StackCopy
	Words  []uint64
	Reason uint32
}

const (
	// copyWait bounds how long a copy waits for its process's tables; it
	// is then given as far as it was walked, marked not_ready. Emulated
	// VMs build tables 10-30 times slower than the host (docs/kernels.md).
	copyWait = 10 * time.Second
	// unloadedWait bounds how long a copy waits for its process to be
	// loaded at all (Track follows the sampler's ProcessNew event within
	// milliseconds); one never loaded (no client tracks it, a snapshot
	// that failed) then comes as the frame-pointer walk gave it.
	unloadedWait = 2 * time.Second
	// maxCopies bounds the copies waiting (about 10 KiB each with the
	// default stack_copy_bytes); more are given up on at once. maxWalked
	// bounds the walked ones not yet taken by a Drain (about 1 KiB each);
	// more are dropped, counted.
	maxCopies = 512
	maxWalked = 8192
)

// waitMaps is what a copy waits for when its PC is in no mapping of its
// live process: the snapshot may have been taken before the loader
// mapped the libraries, and a sample there makes the BPF side ask for
// another (ProcessMapsChanged), which Track brings.
var waitMaps = &file{}

type pendingCopy struct {
	c     *StackCopy
	pr    *proc // the process image it belongs to, once known
	added time.Time
	// waiting is what its last walk stopped at: a file whose table was
	// not ready, or waitMaps. It is walked again only once that changed,
	// so that copies waiting on one table cost one walk each, not one
	// per copy that arrives or table that loads meanwhile.
	waiting *file
}

// Stop reasons the host walk gives (generated from bpf/types.h).
const (
	stopOK        = uint32(bpf.ProfileStopReasonSTOP_OK)
	stopNotReady  = uint32(bpf.ProfileStopReasonSTOP_NOT_READY)
	stopUnknown   = uint32(bpf.ProfileStopReasonSTOP_UNKNOWN_MAPPING)
	stopNoTable   = uint32(bpf.ProfileStopReasonSTOP_NO_TABLE)
	stopDepth     = uint32(bpf.ProfileStopReasonSTOP_DEPTH)
	stopBadFrame  = uint32(bpf.ProfileStopReasonSTOP_BAD_FRAME)
	stopJIT       = uint32(bpf.ProfileStopReasonSTOP_JIT)
	stopRuntime   = uint32(bpf.ProfileStopReasonSTOP_RUNTIME)
	stopTruncated = uint32(bpf.ProfileStopReasonSTOP_STACK_COPY_TRUNCATED)
	stopExec      = uint32(bpf.ProfileStopReasonSTOP_EXEC)

	rtPtrMask = uint64(1)<<bpf.ProfileStackWordBitsRT_KIND_SHIFT - 1
)

// AddCopy takes a copied stack; it is walked now if its process's tables
// are loaded, else when they are (TakeWalked returns it then).
func (m *Manager) AddCopy(c *StackCopy) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats.CopiesReceived++
	if m.closed || len(m.walked) >= maxWalked {
		m.stats.CopiesDropped++
		return
	}
	if len(m.copies) >= maxCopies {
		// No room to wait: the sample as far as the BPF side walked it.
		m.stats.CopiesExpired++
		c.Stack = nil
		m.walked = append(m.walked, unwalked(c, m.procs[int(c.Pid)], m.cfg.MaxStackWords))
		return
	}
	p := &pendingCopy{c: c, added: time.Now()}
	if m.tryCopy(p, time.Time{}) {
		m.copies = append(m.copies, p)
	}
}

// TakeWalked returns the copies walked since the last call, and those
// that waited longer than copyWait, walked as far as they could be.
func (m *Manager) TakeWalked() []WalkedCopy {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tryCopies(-1, time.Now())
	out := m.walked
	m.walked = nil
	for i := range out {
		m.beforeExec(&out[i])
	}
	return out
}

// tryCopies walks the copies of pid (-1: all) whose tables are ready. With
// a non-zero now, copies older than copyWait are given up on: walked as
// far as possible and marked not_ready. Called with m.mu held.
func (m *Manager) tryCopies(pid int, now time.Time) {
	kept := m.copies[:0]
	for _, p := range m.copies {
		if pid >= 0 && int(p.c.Pid) != pid || m.tryCopy(p, now) {
			kept = append(kept, p)
		}
	}
	clear(m.copies[len(kept):])
	m.copies = kept
	m.releaseDead()
}

// tryCopy walks p if what it waits for is there, or gives up on it (see
// tryCopies); the walk goes to m.walked. It reports whether p still waits.
func (m *Manager) tryCopy(p *pendingCopy, now time.Time) bool {
	if p.pr == nil {
		if pr := m.procs[int(p.c.Pid)]; pr != nil {
			p.pr = pr
		} else if pr := m.dead[int(p.c.Pid)]; pr != nil {
			p.pr = pr
		}
	}
	expired := !now.IsZero() && now.Sub(p.added) > copyWait
	if p.pr == nil {
		expired = !now.IsZero() && now.Sub(p.added) > unloadedWait
		// Its process is not loaded yet (or never will be: filtered
		// out, no room): the walk so far, once given up on.
		if !expired {
			return true
		}
		m.stats.CopiesExpired++
		m.walked = append(m.walked, unwalked(p.c, nil, m.cfg.MaxStackWords))
		return false
	}
	if !expired && m.stillWaits(p) {
		return true
	}
	m.copyWalks++
	w, waiting := m.walkCopy(p.pr, p.c)
	switch {
	case waiting != nil && !expired:
		if waiting != waitMaps {
			m.request(waiting, true) // a sample waits for it
		}
		p.waiting = waiting
		return true
	case waiting != nil:
		m.stats.CopiesExpired++
		w = unwalked(p.c, p.pr, m.cfg.MaxStackWords)
	default:
		m.stats.CopiesWalked++
	}
	m.walked = append(m.walked, w)
	return false
}

// beforeExec gives w no user frames, stop reason exec, when its process
// exec'd after its stack was copied: the stack is of the image the process
// replaced (a fork child's, between fork and exec, is its parent's
// program), which no snapshot of the process shows any more, so whatever
// it was walked against, or not walked at all (Ignore: the child was not
// targeted yet), its frames would be another program's. Checked as the
// copies are taken, by when the exec that follows a copy has come. Called
// with m.mu held.
func (m *Manager) beforeExec(w *WalkedCopy) {
	if m.maps.ExecTimes == nil {
		return
	}
	var at uint64
	if err := m.maps.ExecTimes.Lookup(w.Copy.Pid, &at); err != nil || w.Copy.BootNs >= at {
		return
	}
	m.stats.CopiesBeforeExec++
	w.Words, w.Reason = nil, stopExec
}

// stillWaits reports whether what p's last walk stopped at is unchanged:
// the same table not loaded yet, or the same process image without the
// mapping (step's conditions for waiting).
func (m *Manager) stillWaits(p *pendingCopy) bool {
	switch f := p.waiting; f {
	case nil:
		return false
	case waitMaps:
		return m.procs[int(p.c.Pid)] == p.pr
	default:
		return !f.retired && (f.state == statePending || f.state == stateLazy)
	}
}

// releaseDead drops the exited processes no copy waits for any more.
func (m *Manager) releaseDead() {
	for pid, pr := range m.dead {
		busy := false
		for _, p := range m.copies {
			if p.pr == pr || p.pr == nil && int(p.c.Pid) == pid {
				busy = true
				break
			}
		}
		if !busy {
			delete(m.dead, pid)
			m.unref(pr.files)
		}
	}
}

// copyWalk is one walk of a copied stack.
type copyWalk struct {
	m      *Manager
	pr     *proc
	c      *StackCopy
	pc, sp uint64
	fp     uint64
	exact  bool
	words  []uint64
}

// read returns the 8 bytes at addr from the copy.
func (w *copyWalk) read(addr uint64) (uint64, bool) {
	if addr < w.c.SP || addr-w.c.SP > uint64(len(w.c.Stack)) || addr-w.c.SP+8 > uint64(len(w.c.Stack)) {
		return 0, false
	}
	off := addr - w.c.SP
	b := w.c.Stack[off : off+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56, true
}

// walkCopy walks c from its PC with pr's mappings and the loaded tables,
// as unwind_frame (bpf/unwind.h) does for x86-64, except that wherever the
// BPF walker would take a frame-pointer step nothing vouches for (a PC in
// no mapping, a file without a table), this walk stops with that reason:
// it may end short, never with a made-up caller. It returns the file whose
// table it waits for, if any.
func (m *Manager) walkCopy(pr *proc, c *StackCopy) (WalkedCopy, *file) {
	w := &copyWalk{
		m: m, pr: pr, c: c, pc: c.PC, sp: c.SP, fp: c.FP, exact: c.PCExact,
		words: append(make([]uint64, 0, m.cfg.MaxStackWords), c.Walked...),
	}
	out := WalkedCopy{Copy: c}
	for {
		reason, done, waiting := w.step()
		if waiting != nil {
			out.Words, out.Reason = w.words, stopNotReady
			return out, waiting
		}
		if done {
			out.Words, out.Reason = w.words, reason
			return out, nil
		}
		if w.pc == 0 {
			out.Words, out.Reason = w.words, stopOK
			return out, nil
		}
		if w.pc&^rtPtrMask != 0 {
			out.Words, out.Reason = w.words, stopBadFrame
			return out, nil
		}
		if len(w.words) >= m.cfg.MaxStackWords {
			out.Words, out.Reason = w.words, stopDepth
			return out, nil
		}
		if m.inRuntime(int(c.Pid), w.pc-1) {
			// The BPF side would hand it to the runtime's walker.
			out.Words, out.Reason = w.words, stopRuntime
			return out, nil
		}
		w.words = append(w.words, w.pc)
	}
}

func (m *Manager) inRuntime(pid int, pc uint64) bool {
	rt, ok := m.runtimes[pid]
	if !ok {
		return false
	}
	for _, r := range rt.Ranges {
		if pc >= r[0] && pc < r[1] {
			return true
		}
	}
	return false
}

// fpStep is fp_step: the frame record at FP.
func (w *copyWalk) fpStep() (reason uint32, done bool) {
	if w.fp == 0 {
		return stopOK, true
	}
	next, ok1 := w.read(w.fp)
	ra, ok2 := w.read(w.fp + 8)
	if !ok1 || !ok2 {
		return stopTruncated, true
	}
	if ra == 0 {
		return stopOK, true
	}
	if next == w.fp {
		return stopBadFrame, true
	}
	w.sp, w.fp, w.pc, w.exact = w.fp+16, next, ra, false
	return 0, false
}

// step finds the caller of w.pc: done with a reason, or the file whose
// table is not loaded yet.
func (w *copyWalk) step() (reason uint32, done bool, waiting *file) {
	pc := w.pc
	lookup := pc
	if !w.exact {
		lookup--
	}
	innermost := len(w.words) == 1 && w.exact
	ents := w.pr.ents
	i := sort.Search(len(ents), func(i int) bool { return ents[i].Start > lookup }) - 1
	if i < 0 || lookup >= ents[i].End {
		if w.m.procs[int(w.c.Pid)] == w.pr {
			return 0, false, waitMaps
		}
		return stopUnknown, true, nil
	}
	e := ents[i]
	if e.Table == tableFP || e.Table == tableVDSO {
		if r, d := w.fpStep(); d {
			if r == stopOK || r == stopTruncated {
				r = stopJIT // as the BPF walker: ended in code without a table
			}
			return r, true, nil
		}
		return 0, false, nil
	}
	f := w.pr.bySlot[e.Table]
	if f == nil || f.retired {
		return stopNoTable, true, nil
	}
	switch f.state {
	case stateReady:
	case statePending, stateLazy:
		return 0, false, f
	default:
		return stopNoTable, true, nil
	}
	off := lookup - e.Bias - f.base
	if off>>32 != 0 {
		return stopNoTable, true, nil
	}
	row, ok := w.m.findRow(f, uint32(off))
	if !ok {
		return stopNoTable, true, nil
	}
	kind := uint32(row.Info & 3)
	rule := uint32(row.Info>>2) & 3
	switch kind {
	case uint32(bpf.ProfileRowKindROW_END):
		return stopOK, true, nil
	case uint32(bpf.ProfileRowKindROW_FALLBACK):
		if r, d := w.fpStep(); d {
			return r, true, nil
		}
		return 0, false, nil
	case uint32(bpf.ProfileRowKindROW_SIGNAL):
		// The signal frame's registers: not walked here.
		return stopNotReady, true, nil
	}
	code := uint64(row.Info >> bpf.ProfileRowBitsROW_REG_SHIFT)
	var cfa uint64
	switch rule {
	case uint32(bpf.ProfileCfaRuleCFA_SP), uint32(bpf.ProfileCfaRuleCFA_FP):
		cfa = w.sp
		if rule == uint32(bpf.ProfileCfaRuleCFA_FP) {
			cfa = w.fp
		}
		if code != 0 {
			v, ok := w.read(cfa + uint64(int64(int16(row.CfaOff))))
			if !ok {
				return stopTruncated, true, nil
			}
			cfa = v + code*8
		} else {
			cfa += uint64(row.CfaOff)
		}
	case uint32(bpf.ProfileCfaRuleCFA_PLT):
		cfa = w.sp + 8
		if pc&15 >= 11 {
			cfa += 8
		}
	default:
		if code == 0 {
			if r, d := w.fpStep(); d {
				return r, true, nil
			}
			return 0, false, nil
		}
		if innermost {
			// CFA in a register the copy does not hold.
			return stopNotReady, true, nil
		}
		if r, d := w.fpStep(); d {
			return r, true, nil
		}
		return 0, false, nil
	}
	if cfa <= w.sp {
		return stopBadFrame, true, nil
	}
	ra, ok := w.read(cfa - 8)
	if !ok {
		return stopTruncated, true, nil
	}
	if row.Info&uint8(bpf.ProfileRowBitsROW_FP_SAVED) != 0 {
		fp, ok := w.read(cfa + uint64(int64(row.FpOff)*8))
		if !ok {
			return stopTruncated, true, nil
		}
		w.fp = fp
	}
	if ra == 0 {
		return stopOK, true, nil
	}
	w.sp, w.pc, w.exact = cfa, ra, false
	return 0, false, nil
}

// rowIndexStride rows make a block of the index (2 KiB): a file's index
// costs 0.2% of its rows' bytes, a lookup one block's read.
const rowIndexStride = 256

// rowIndex is the pc of every rowIndexStride-th row of rows.
func rowIndex(rows *rowBuf) []uint32 {
	out := make([]uint32, 0, (rows.len()+rowIndexStride-1)/rowIndexStride)
	for i := 0; i < rows.len(); i += rowIndexStride {
		out = append(out, rows.at(i).Pc)
	}
	return out
}

// findRow is find_row: the last row of f with pc <= off. The index gives
// the block that holds it (see rowBlock); without an index, a map lookup
// per step of a binary search. Called with m.mu held.
func (m *Manager) findRow(f *file, off uint32) (bpf.ProfileUnwindRow, bool) {
	if len(f.rowIndex) == 0 || uint64(len(f.rowIndex)) != (uint64(f.rows.n)+rowIndexStride-1)/rowIndexStride {
		return m.findRowByLookups(f, off)
	}
	b := sort.Search(len(f.rowIndex), func(i int) bool { return f.rowIndex[i] > off })
	if b == 0 {
		return bpf.ProfileUnwindRow{}, false // before the first row
	}
	rows, ok := m.rowBlock(f, uint32(b-1))
	if !ok {
		return m.findRowByLookups(f, off)
	}
	// The block's first row is <= off (the index says so): the last such.
	i := sort.Search(len(rows), func(i int) bool { return rows[i].Pc > off }) - 1
	if i < 0 {
		return bpf.ProfileUnwindRow{}, false
	}
	return rows[i], true
}

// blockKey names block b of a file's rows.
type blockKey struct {
	f *file
	b uint32
}

// maxRowBlocks bounds the blocks kept (2 KiB each): the copies of one
// drain walk the same few files (the binary, libc), block after block.
const maxRowBlocks = 256

// rowBlock reads block b of f's rows: from the blocks kept, or from the
// mmapable rows map, mapping its page or two and unmapping them at once
// (the rows stay out of the agent's RSS; an unmap per frame, with its
// TLB flush, cost as much as the map lookups it replaced). Called with
// m.mu held.
func (m *Manager) rowBlock(f *file, b uint32) ([]bpf.ProfileUnwindRow, bool) {
	k := blockKey{f, b}
	if rows, ok := m.blocks[k]; ok {
		return rows, true
	}
	first := uint64(f.rows.off) + uint64(b)*rowIndexStride
	n := min(uint64(rowIndexStride), uint64(f.rows.off)+uint64(f.rows.n)-first)
	page := uint64(unix.Getpagesize())
	lo, hi := first*RowBytes, (first+n)*RowBytes
	start := lo &^ (page - 1)
	mem, err := unix.Mmap(m.maps.Rows.FD(), int64(start), int((hi-start+page-1)&^(page-1)), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, false
	}
	rows := make([]bpf.ProfileUnwindRow, n)
	for i := range rows {
		rows[i] = getRow(mem[lo-start+uint64(i)*RowBytes:])
	}
	_ = unix.Munmap(mem)
	if len(m.blocks) >= maxRowBlocks {
		clear(m.blocks)
	}
	if m.blocks == nil {
		m.blocks = map[blockKey][]bpf.ProfileUnwindRow{}
	}
	m.blocks[k] = rows
	return rows, true
}

// findRowByLookups is findRow by a map lookup per step of the search.
func (m *Manager) findRowByLookups(f *file, off uint32) (bpf.ProfileUnwindRow, bool) {
	var r bpf.ProfileUnwindRow
	lo, hi := f.rows.off, f.rows.off+f.rows.n
	for lo < hi {
		mid := lo + (hi-lo)/2
		if err := m.maps.Rows.Lookup(mid, &r); err != nil {
			return r, false
		}
		if r.Pc <= off {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == f.rows.off {
		return r, false
	}
	if err := m.maps.Rows.Lookup(lo-1, &r); err != nil {
		return r, false
	}
	return r, true
}

// CopiesPending is how many stack copies of pid are not taken yet: those
// waiting for its tables and those walked since the last TakeWalked.
func (m *Manager) CopiesPending(pid int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, p := range m.copies {
		if int(p.c.Pid) == pid {
			n++
		}
	}
	for _, w := range m.walked {
		if int(w.Copy.Pid) == pid {
			n++
		}
	}
	return n
}

// Ignore says pid will not be loaded (outside the targets): its samples
// stop copying their stacks (its copy budget in the seen map is spent),
// and the copies already taken come at once as the walk without them
// gave. Without it a host's untargeted processes each copy 128 samples,
// which wait for nothing and crowd the targeted ones' out of maxCopies.
func (m *Manager) Ignore(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maps.Seen != nil {
		var v uint8
		if m.maps.Seen.Lookup(uint32(pid), &v) == nil {
			_ = m.maps.Seen.Update(uint32(pid), uint8(255), ebpf.UpdateExist)
		}
	}
	if m.procs[pid] != nil {
		return // loaded after all (an exec into a targeted program)
	}
	kept := m.copies[:0]
	for _, p := range m.copies {
		if int(p.c.Pid) == pid && p.pr == nil {
			m.stats.CopiesExpired++
			m.walked = append(m.walked, unwalked(p.c, nil, m.cfg.MaxStackWords))
			continue
		}
		kept = append(kept, p)
	}
	clear(m.copies[len(kept):])
	m.copies = kept
}
