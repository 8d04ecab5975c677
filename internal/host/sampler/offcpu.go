//go:build linux && (amd64 || arm64)

package sampler

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/offcpu"
)

// Off-CPU samples (bpf/offcpu.h, docs/off-cpu.md): loaded, sized and
// attached only when Config.OffCPU.Enabled; the maps the CPU walker shares
// with them shrink to one entry otherwise.

type offcpuObjs struct {
	OffcpuSwitch     *ebpf.Program  `ebpf:"offcpu_switch"`
	OffcpuTake       *ebpf.Program  `ebpf:"offcpu_take"`
	OffcpuWalkNative *ebpf.Program  `ebpf:"offcpu_walk_native"`
	OffcpuProgs      *ebpf.Map      `ebpf:"offcpu_progs"`
	OffcpuStatsMap   *ebpf.Map      `ebpf:"offcpu_stats_map"`
	OffcpuWaits      *ebpf.Map      `ebpf:"offcpu_waits"`
	OffcpuUstore     *ebpf.Map      `ebpf:"offcpu_ustore"`
	OffcpuKstore     *ebpf.Map      `ebpf:"offcpu_kstore"`
	OffcpuCounts0    *ebpf.Map      `ebpf:"offcpu_counts0"`
	OffcpuCounts1    *ebpf.Map      `ebpf:"offcpu_counts1"`
	OffcpuKstacks0   *ebpf.Map      `ebpf:"offcpu_kstacks0"`
	OffcpuKstacks1   *ebpf.Map      `ebpf:"offcpu_kstacks1"`
	OffcpuProcs      *ebpf.Map      `ebpf:"offcpu_procs"`
	OffcpuSlots      *ebpf.Map      `ebpf:"offcpu_slots"`
	OffcpuAsked      *ebpf.Map      `ebpf:"offcpu_asked"`
	OffcpuForgets    *ebpf.Map      `ebpf:"offcpu_forgets"`
	OffcpuGen        *ebpf.Variable `ebpf:"offcpu_gen"`
}

func (o *offcpuObjs) close() []error {
	var errs []error
	for _, p := range []*ebpf.Program{o.OffcpuSwitch, o.OffcpuTake, o.OffcpuWalkNative} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	for _, m := range []*ebpf.Map{
		o.OffcpuProgs, o.OffcpuStatsMap, o.OffcpuWaits, o.OffcpuUstore, o.OffcpuKstore, o.OffcpuCounts0,
		o.OffcpuCounts1, o.OffcpuKstacks0, o.OffcpuKstacks1, o.OffcpuProcs, o.OffcpuSlots, o.OffcpuAsked,
		o.OffcpuForgets,
	} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errs
}

// The runtime walkers' instances for off-CPU walks, loaded with their
// runtime.
type offcpuHotspotObjs struct {
	OffcpuWalkHotspot *ebpf.Program `ebpf:"offcpu_walk_hotspot"`
}

type offcpuCpythonObjs struct {
	OffcpuWalkCpython *ebpf.Program `ebpf:"offcpu_walk_cpython"`
}

type offcpuPerlObjs struct {
	OffcpuWalkPerl *ebpf.Program `ebpf:"offcpu_walk_perl"`
}
type offcpuPhpObjs struct {
	OffcpuWalkPhp *ebpf.Program `ebpf:"offcpu_walk_php"`
}
type offcpuRubyObjs struct {
	OffcpuWalkRuby *ebpf.Program `ebpf:"offcpu_walk_ruby"`
}
type offcpuV8Objs struct {
	OffcpuWalkV8 *ebpf.Program `ebpf:"offcpu_walk_v8"`
}

// offCPUWalkers are the walker instances for off-CPU walks, by slot of
// offcpu_progs (enum walk_prog): the native one, and those of the runtimes
// walked. A runtime's walker adds its instance next to the native one in
// bpf/offcpu.h and here.
func (o *objects) offCPUWalkers() map[uint32]*ebpf.Program {
	w := map[uint32]*ebpf.Program{
		uint32(bpf.ProfileWalkProgWALK_NATIVE): o.OffcpuWalkNative,
		uint32(bpf.ProfileWalkProgWALK_PROGS):  o.OffcpuTake,
	} // OFFCPU_PROG_TAKE
	if o.OffcpuWalkHotspot != nil {
		w[uint32(bpf.ProfileWalkProgWALK_HOTSPOT)] = o.OffcpuWalkHotspot
	}
	if o.OffcpuWalkCpython != nil {
		w[uint32(bpf.ProfileWalkProgWALK_CPYTHON)] = o.OffcpuWalkCpython
	}
	if o.OffcpuWalkPerl != nil {
		w[uint32(bpf.ProfileWalkProgWALK_PERL)] = o.OffcpuWalkPerl
	}
	if o.OffcpuWalkPhp != nil {
		w[uint32(bpf.ProfileWalkProgWALK_PHP)] = o.OffcpuWalkPhp
	}
	if o.OffcpuWalkRuby != nil {
		w[uint32(bpf.ProfileWalkProgWALK_RUBY)] = o.OffcpuWalkRuby
	}
	if o.OffcpuWalkV8 != nil {
		w[uint32(bpf.ProfileWalkProgWALK_V8)] = o.OffcpuWalkV8
	}
	return w
}

// procWords is how many words of offcpu_procs cover every possible tgid
// (PID_MAX_LIMIT, 2^22) at two bits each.
const procWords = 1 << 22 / 32

// offcpuState is the host side of off-CPU sampling.
type offcpuState struct {
	cfg offcpu.Config

	mu      sync.Mutex // the counters below
	gen     uint64     // offcpu_gen: drains so far
	swept   uint64     // waits deleted by the drain: their thread is gone
	lostRd  uint64     // rows whose stacks the drain could not read
	cursor  int        // where the next check of old waits starts
	procs   []byte     // offcpu_procs, mapped; nil without Select
	forgets []byte     // offcpu_forgets, mapped; nil without Select
	started bool
}

func (c *Config) offCPUValidate() error {
	if !c.OffCPU.Enabled {
		return nil
	}
	c.OffCPU.SetDefaults()
	if err := c.OffCPU.Validate(); err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if !c.walking() {
		return errors.New("sampler: off-CPU samples need kernel aggregation and unwinding mode auto")
	}
	return nil
}

// offCPUSpec sizes the off-CPU maps and sets the program's constants.
func (s *Sampler) offCPUSpec(spec *ebpf.CollectionSpec) error {
	c := s.cfg.OffCPU
	sizes := map[string]uint32{
		bpf.ProfileMapOffcpuWaits: 1, bpf.ProfileMapOffcpuUstore: 1, bpf.ProfileMapOffcpuKstore: 1, bpf.ProfileMapOffcpuSlots: 1,
		bpf.ProfileMapOffcpuCounts0: 1, bpf.ProfileMapOffcpuCounts1: 1,
		bpf.ProfileMapOffcpuKstacks0: 1, bpf.ProfileMapOffcpuKstacks1: 1, bpf.ProfileMapOffcpuProcs: 1,
		bpf.ProfileMapOffcpuForgets: 1,
	}
	if c.Enabled {
		sizes[bpf.ProfileMapOffcpuWaits] = uint32(c.MaxWaits)
		sizes[bpf.ProfileMapOffcpuUstore] = uint32(c.MaxStacks)
		sizes[bpf.ProfileMapOffcpuKstore] = uint32(c.MaxStacks)
		sizes[bpf.ProfileMapOffcpuSlots] = uint32(bpf.ProfileOffcpuLimitsOFFCPU_SLOTS)
		for _, n := range []string{bpf.ProfileMapOffcpuCounts0, bpf.ProfileMapOffcpuCounts1} {
			sizes[n] = uint32(s.cfg.CountMapEntries)
		}
		for _, n := range []string{bpf.ProfileMapOffcpuKstacks0, bpf.ProfileMapOffcpuKstacks1} {
			sizes[n] = uint32(s.cfg.StackMapEntries)
		}
		if c.Select != nil {
			sizes[bpf.ProfileMapOffcpuProcs] = procWords
			sizes[bpf.ProfileMapOffcpuForgets] = uint32(bpf.ProfileOffcpuLimitsOFFCPU_FORGET_SLOTS)
		}
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = n
	}
	if !c.Enabled {
		return nil
	}
	lo, hi := schedText("/proc/kallsyms")
	if hi == 0 {
		s.log.Warn("off-CPU: no __sched_text_start/__sched_text_end in /proc/kallsyms (kptr_restrict?): kernel stacks keep the tracepoint's frames")
	}
	for name, v := range map[string]any{
		bpf.ProfileVarOffcpuMinNs: uint64(c.MinWait.Nanoseconds()), bpf.ProfileVarOffcpuFloor: c.FloorK(),
		bpf.ProfileVarOffcpuFloorD: c.FloorUninterruptibleK(), bpf.ProfileVarOffcpuFloorR: c.FloorPreemptedK(),
		bpf.ProfileVarOffcpuSelect: c.Select != nil, bpf.ProfileVarOffcpuSchedLo: lo, bpf.ProfileVarOffcpuSchedHi: hi,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("sampler: %s: %w", name, err)
		}
	}
	return nil
}

// schedText finds [__sched_text_start, __sched_text_end) in kallsyms:
// every scheduler function a blocked task's stack begins with is there.
func schedText(path string) (lo, hi uint64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() && (lo == 0 || hi == 0) {
		line := sc.Text()
		addr, rest, _ := strings.Cut(line, " ")
		switch {
		case strings.HasSuffix(rest, " __sched_text_start"):
			lo, _ = strconv.ParseUint(addr, 16, 64)
		case strings.HasSuffix(rest, " __sched_text_end"):
			hi, _ = strconv.ParseUint(addr, 16, 64)
		}
	}
	if lo == 0 || hi <= lo {
		return 0, 0
	}
	return lo, hi
}

// startOffCPU installs the off-CPU walkers and attaches the sched_switch
// program: waits are recorded from here on.
func (s *Sampler) startOffCPU() error {
	if s.offcpu == nil || s.offcpu.started {
		return nil
	}
	if err := s.mapProcs(); err != nil {
		return err
	}
	for slot, p := range s.objs.offCPUWalkers() {
		if err := s.objs.OffcpuProgs.Put(slot, p); err != nil {
			return fmt.Errorf("sampler: installing the off-CPU walker: %w", err)
		}
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: s.objs.OffcpuSwitch, AttachType: ebpf.AttachTraceRawTp})
	if err != nil {
		return fmt.Errorf("sampler: attaching the off-CPU program to sched_switch: %w", err)
	}
	s.tracing = append(s.tracing, l)
	s.offcpu.started = true
	return nil
}

// offCPUEvent applies Select to a process the kernel side asked about
// (offCPUAsk) or announced (new, exec): what it answers is what
// offcpu_switch then does with that process's waits (the kernel side clears
// the answer at exit and exec). It returns whether the event goes on to the
// caller: an ask does only when the process is targeted, then as a
// ProcessNew (its samples will need a snapshot), so that the processes
// off-CPU profiles leave out are not read.
func (s *Sampler) offCPUEvent(ev *Event) bool {
	o := s.offcpu
	if o == nil || o.cfg.Select == nil || ev.Pid >= 1<<22 {
		return ev.Kind != offCPUAsk
	}
	if ev.Kind != ProcessNew && ev.Kind != ProcessExec && ev.Kind != offCPUAsk {
		return true
	}
	if ev.Kind == offCPUAsk {
		// Asked again from here on, before the answer lands: a switch
		// that finds no answer while this ask is still marked asks
		// nothing, and a thread that then stops (or sleeps for good)
		// had no answer ever (CI: TestOffCPURetake's stopped fixture,
		// filter bits 0 after 10 s, its last switch after an exec had
		// cleared the answer and before the mark was taken off). A
		// second ask costs one more answer.
		_ = s.objs.OffcpuAsked.Delete(ev.Pid)
	}
	bits := o.answer(ev.Pid)
	if ev.Kind != offCPUAsk {
		return true
	}
	if bits != 3 {
		return false
	}
	// Announced from here on: its exit and exec are reported, and its CPU
	// samples do not announce it a second time.
	if err := s.objs.Seen.Update(ev.Pid, uint8(1), ebpf.UpdateNoExist); errors.Is(err, ebpf.ErrKeyExist) {
		return false // announced meanwhile: the caller has it
	}
	ev.Kind = ProcessNew
	return true
}

// answer applies Select to pid and writes what it says into offcpu_procs,
// returning the bits written. Select reads the process at one moment and
// the bits land later: if the process execs (or exits, and its pid is
// reused) in between, the kernel clears the bits first and the answer for
// the old image would stand for the new one, for good (issue 31: a fixture
// exec'd by its parent was left out of off-CPU profiles, in one CI run).
// The kernel counts each clearing in offcpu_forgets before it clears:
// when the count of pid's slot is the same after the write as before the
// read, no exec or exit came between, and an exec after that clears the
// bits after the write. When it moved, Select is applied again. (Before,
// Select was applied a second time after every write and the two answers
// compared: two reads of /proc per answer, a sixth of the agent's CPU in
// issue 32's mix, where most new processes fork, wait and exec.) A
// process gone by then gets no answer, so that the next one with its pid
// is asked.
func (o *offcpuState) answer(pid uint32) uint64 {
	bits := uint64(0)
	for range 3 {
		before := o.forgetCount(pid)
		bits = 1
		if o.cfg.Select(int(pid)) {
			bits = 3
		}
		o.setProcBits(pid, bits)
		if !threadAlive(pid) {
			bits = 0
			break
		}
		if o.forgetCount(pid) == before {
			return bits
		}
		bits = 0 // forgotten that often meanwhile: asked again on its next wait
	}
	o.setProcBits(pid, bits)
	return bits
}

// forgetCount reads pid's slot of offcpu_forgets, a word (always 0 when it
// is not mapped: tests that build an offcpuState of their own).
func (o *offcpuState) forgetCount(pid uint32) uint64 {
	i := int(pid&(uint32(bpf.ProfileOffcpuLimitsOFFCPU_FORGET_SLOTS)-1)) * 8
	if i+8 > len(o.forgets) {
		return 0
	}
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&o.forgets[i]))) //nolint:gosec // the map's memory, page-aligned: its words are aligned
}

// RetakeOffCPUAnswers makes each process Select answered no for ask again
// at its next wait, and returns how many: what Select reads has changed (a
// target's pods), so it may say yes now. A no (01) becomes undecided by
// adding one (10): should the kernel side clear it at the same time, after
// reading 01, what it takes off leaves 01 again, never a borrow from the
// next pid's bits. Yes answers stay: taking from them is not safe against
// that clear (the kernel side has only atomic add before Linux 5.12), and
// a process's leaving is the selection in the kernel's or the filter
// after sampling's to apply.
func (s *Sampler) RetakeOffCPUAnswers() int {
	o := s.offcpu
	if o == nil || o.procs == nil {
		return 0
	}
	n := 0
	for i := 0; i+8 <= len(o.procs); i += 8 {
		w := o.procWord(i / 8)
		for {
			old := atomic.LoadUint64(w)
			if old == 0 {
				break
			}
			upd, k := old, 0
			for sh := 0; sh < 64; sh += 2 {
				if old>>sh&3 == 1 {
					upd += 1 << sh
					k++
				}
			}
			if k == 0 {
				break
			}
			if atomic.CompareAndSwapUint64(w, old, upd) {
				n += k
				break
			}
		}
	}
	return n
}

// procWord is word i of offcpu_procs, shared with the kernel side.
func (o *offcpuState) procWord(i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&o.procs[i*8])) //nolint:gosec // the map's memory, page-aligned: its words are aligned
}

// setProcBits sets a tgid's two bits of offcpu_procs, atomically: the
// kernel side clears them at the same time on exit and exec.
func (o *offcpuState) setProcBits(pid uint32, bits uint64) {
	i := int(pid / 32)
	if (i+1)*8 > len(o.procs) {
		return
	}
	shift := (pid % 32) * 2
	w := o.procWord(i)
	for {
		old := atomic.LoadUint64(w)
		if atomic.CompareAndSwapUint64(w, old, old&^(3<<shift)|bits<<shift) {
			return
		}
	}
}

// releaseOffCPU unmaps offcpu_procs and offcpu_forgets (Close).
func (s *Sampler) releaseOffCPU() error {
	if s.offcpu == nil {
		return nil
	}
	var errs []error
	for _, m := range []*[]byte{&s.offcpu.procs, &s.offcpu.forgets} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	return errors.Join(errs...)
}

// mapProcs maps offcpu_procs for setProcBits and offcpu_forgets for
// forgetCount.
func (s *Sampler) mapProcs() error {
	if s.offcpu == nil || s.offcpu.cfg.Select == nil {
		return nil
	}
	page := os.Getpagesize()
	for _, m := range []struct {
		mem  *[]byte
		mp   *ebpf.Map
		size int
	}{
		{&s.offcpu.procs, s.objs.OffcpuProcs, procWords * 8},
		{&s.offcpu.forgets, s.objs.OffcpuForgets, int(bpf.ProfileOffcpuLimitsOFFCPU_FORGET_SLOTS) * 8},
	} {
		mem, err := unix.Mmap(m.mp.FD(), 0, (m.size+page-1)&^(page-1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("sampler: mapping the off-CPU process filter: %w", err)
		}
		*m.mem = mem
	}
	return nil
}

// offCPUStats sums the per-CPU counters.
func (s *Sampler) offCPUStats() (OffCPUStats, error) {
	var st OffCPUStats
	if s.offcpu == nil {
		return st, nil
	}
	var per []bpf.ProfileOffcpuStats
	if err := s.objs.OffcpuStatsMap.Lookup(uint32(0), &per); err != nil {
		return st, fmt.Errorf("sampler: reading off-CPU stats: %w", err)
	}
	for _, p := range per {
		st.Seen += p.Seen
		st.Chosen += p.Chosen
		st.Kept += p.Kept
		st.Short += p.ShortWaits
		st.Undecided += p.Undecided
		st.WaitsFull += p.WaitsFull
		st.StacksFull += p.StacksFull
		st.MapFull += p.LostMapFull
		st.Stack += p.LostStack
		st.Stale += p.Stale
		st.Selection.add(p.Selection)
	}
	s.offcpu.mu.Lock()
	st.NeverReturned = s.offcpu.swept
	st.Drain = s.offcpu.lostRd
	s.offcpu.mu.Unlock()
	return st, nil
}

// OffCPUProgramStats returns the cumulative run time and run count of the
// off-CPU program (sched_switch: every context switch, the walks of the
// waits it chose included), as ProgramStats; zeros when off-CPU samples
// are off.
func (s *Sampler) OffCPUProgramStats() (time.Duration, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, 0, ErrClosed
	}
	if s.objs.OffcpuSwitch == nil {
		return 0, 0, nil
	}
	ps, err := s.objs.OffcpuSwitch.Stats()
	if err != nil {
		return 0, 0, err
	}
	return ps.Runtime, ps.RunCount, nil
}

// offCPUFlip moves off-CPU samples to the buffer the drain just made
// active: the next generation (bpf/offcpu.h). Before the drain's barrier.
func (s *Sampler) offCPUFlip() error {
	if s.offcpu == nil {
		return nil
	}
	if err := s.objs.OffcpuGen.Set(s.offcpu.gen + 1); err != nil {
		return fmt.Errorf("sampler: switching off-CPU buffers: %w", err)
	}
	s.offcpu.gen++
	return nil
}
