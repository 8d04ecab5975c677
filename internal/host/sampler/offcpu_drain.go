//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
)

// offcpuDrain is what a drain reads of the off-CPU rows: one quiescent
// buffer's counts and kernel stacks (their user stacks are in the same
// buffer's ustacks, with the CPU samples').
type offcpuDrain struct {
	counts, kstacks mapOps
	lost            uint64 // waits whose stacks could not be read back
}

func (s *Sampler) offCPUDrain(buf uint32) *offcpuDrain {
	if buf == 0 {
		return &offcpuDrain{counts: s.objs.OffcpuCounts0, kstacks: s.objs.OffcpuKstacks0}
	}
	return &offcpuDrain{counts: s.objs.OffcpuCounts1, kstacks: s.objs.OffcpuKstacks1}
}

// offCPURows appends the buffer's off-CPU rows to out, then frees their
// kernel stacks. User stacks are looked up with the CPU rows' walked, and
// freed with them.
func (d *drain) offCPURows(out []Sample, walked func(uint64) (userStack, error), off int64) []Sample {
	o := d.offcpu
	keys, vals := readRows[bpf.ProfileOffcpuKey, bpf.ProfileOffcpuValue](d, o.counts)
	kernel := map[uint64][]uint64{}
	var kbuf bpf.ProfileKernelStack
	lookupKernel := func(h uint64) ([]uint64, error) {
		if pcs, ok := kernel[h]; ok {
			return pcs, nil
		}
		if err := o.kstacks.Lookup(h, &kbuf); err != nil {
			return nil, fmt.Errorf("sampler: off-CPU kernel stack %x: %w", h, err)
		}
		n := min(int(kbuf.Len), len(kbuf.Pcs))
		skip := min(int(kbuf.Skip), n)
		pcs := append([]uint64(nil), kbuf.Pcs[skip:n]...)
		kernel[h] = pcs
		return pcs, nil
	}
	for i, k := range keys {
		v := vals[i]
		var (
			ks  []uint64
			w   userStack
			err error
		)
		if k.Khash != 0 {
			ks, err = lookupKernel(k.Khash)
		}
		if err == nil && k.Uhash != 0 {
			w, err = walked(k.Uhash)
		}
		if err != nil {
			o.lost += v.Waits
			d.fail(err)
			continue
		}
		stop := w.stop
		if k.Uhash == 0 {
			stop = StopOK
		}
		out = append(out, Sample{
			Origin: OriginOffCPU, OffCPUNs: v.Ns, OffCPUVar: float64(v.VarUs2) * 1e6,
			Runnable: k.Flags&uint32(bpf.ProfileOffcpuFlagsOFFCPU_RUNNABLE) != 0,
			Pid:      k.Pid, Tid: k.Tid, CPU: k.Cpu, Comm: commString(v.Comm),
			UserPCs: w.pcs, UserExact: w.exact, Runtime: w.runtime, KernelPCs: ks, Count: v.Waits, GoLabels: k.Labels,
			FirstNs: int64(v.FirstNs) + off, LastNs: int64(v.LastNs) + off,
			Truncated: stop == StopDepth, Stop: stop, // the walker says so (max_stack_words)
		})
	}
	for h := range kernel {
		if err := o.kstacks.Delete(h); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			d.fail(fmt.Errorf("sampler: clearing off-CPU kernel stacks: %w", err))
		}
	}
	sweep(d, o.kstacks, new(uint64))
	return out
}

// neverReturnedAfter is how long a wait goes on before the drain checks
// that its thread still exists.
const neverReturnedAfter = time.Minute

// maxThreadChecks bounds the /proc lookups of one collection.
const maxThreadChecks = 256

// carryOffCPU runs after a drain's flip and barrier, before it empties
// buffer old: the waits that began in the generation that buffer held and
// go on have their stacks copied to the stores, where they find them when
// they end (bpf/offcpu.h); stacks no wait from before the flip uses any
// more leave the stores, and the waits of threads that are gone (they will
// never run again to end them) are deleted.
func (s *Sampler) carryOffCPU(old uint32) {
	o := s.offcpu
	tids, waits, err := listMap[uint32, bpf.ProfileOffcpuWait](s.objs.OffcpuWaits)
	if err != nil {
		s.log.Warn("off-CPU: listing the waits in progress", zap.Error(err))
		return // keep every stack
	}
	var (
		used       [2]map[uint64]struct{} // user, kernel
		gone       []uint32
		check      int
		carryFails uint64
		ubuf       = make([]byte, s.cfg.userStackBytes())
		kbuf       bpf.ProfileKernelStack
	)
	used[0], used[1] = map[uint64]struct{}{}, map[uint64]struct{}{}
	ustacks, kstacks := s.objs.ustacks(old), s.objs.OffcpuKstacks0
	if old == 1 {
		kstacks = s.objs.OffcpuKstacks1
	}
	now := time.Duration(bootNow())
	if o.cursor >= len(tids) {
		o.cursor = 0
	}
	for i := range tids {
		tid, w := tids[i], &waits[i]
		if w.Gen >= o.gen {
			continue // began after the flip: its stacks are in the new buffer
		}
		// Old waits are checked a few at a time, from where the last
		// collection stopped.
		if i >= o.cursor && check < maxThreadChecks && now-time.Duration(w.Ts) > neverReturnedAfter {
			check++
			if !threadAlive(tid) {
				gone = append(gone, tid)
				continue
			}
		}
		for j, h := range []uint64{w.Uhash, w.Khash} {
			if h == 0 {
				continue
			}
			used[j][h] = struct{}{}
			if w.Gen+1 != o.gen {
				continue // carried by an earlier drain
			}
			var err error
			if j == 0 {
				if err = ustacks.Lookup(h, &ubuf); err == nil {
					err = s.objs.OffcpuUstore.Update(h, &ubuf, ebpf.UpdateNoExist)
				}
			} else if err = kstacks.Lookup(h, &kbuf); err == nil {
				err = s.objs.OffcpuKstore.Update(h, &kbuf, ebpf.UpdateNoExist)
			}
			if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
				carryFails++ // the wait will find nothing: counted stale then
			}
		}
	}
	o.cursor += check
	if check < maxThreadChecks {
		o.cursor = 0
	}
	var swept uint64
	for _, t := range gone {
		if err := s.objs.OffcpuWaits.Delete(t); err == nil {
			swept++
		}
	}
	for j, m := range []*ebpf.Map{s.objs.OffcpuUstore, s.objs.OffcpuKstore} {
		s.collectStacks(m, used[j])
	}
	o.mu.Lock()
	o.swept += swept
	o.mu.Unlock()
	if carryFails > 0 {
		s.log.Debug("off-CPU: stacks of waits across the drain not carried (store full?)", zap.Uint64("stacks", carryFails))
	}
}

// collectStacks deletes the stacks of store m that no wait from before
// the flip uses: only those read it, and the flip's barrier has passed.
func (s *Sampler) collectStacks(m *ebpf.Map, used map[uint64]struct{}) {
	var (
		drop []uint64
		h    uint64
		prev any
	)
	for i := uint32(0); i <= m.MaxEntries(); i++ {
		err := m.NextKey(prev, &h)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			s.log.Debug("off-CPU: listing stacks", zap.Error(err))
			return
		}
		if _, ok := used[h]; !ok {
			drop = append(drop, h)
		}
		k := h
		prev = &k
	}
	for _, k := range drop {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			s.log.Debug("off-CPU: deleting a stack", zap.Error(err))
		}
	}
}

// lostOffCPU counts the waits a drain could not read back.
func (s *Sampler) lostOffCPU(d *drain) {
	if s.offcpu == nil || d.offcpu == nil {
		return
	}
	s.offcpu.mu.Lock()
	s.offcpu.lostRd += d.offcpu.lost
	s.offcpu.mu.Unlock()
}

// threadAlive reports whether a thread of that id exists (any process:
// /proc/TID reaches threads too).
func threadAlive(tid uint32) bool {
	_, err := os.Stat("/proc/" + strconv.FormatUint(uint64(tid), 10))
	return err == nil
}

// listMap reads every entry of m: in batches where the kernel has them,
// one by one otherwise. Bounded by the map's size.
func listMap[K, V any](m *ebpf.Map) ([]K, []V, error) {
	var (
		keys []K
		vals []V
		kbuf = make([]K, countBatch)
		vbuf = make([]V, countBatch)
		cur  ebpf.MapBatchCursor
	)
	for {
		n, err := m.BatchLookup(&cur, kbuf, vbuf, nil)
		keys = append(keys, kbuf[:n]...)
		vals = append(vals, vbuf[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, vals, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
	}
	keys, vals = keys[:0], vals[:0]
	var (
		k K
		v V
	)
	it := m.Iterate()
	for n := uint32(0); n <= m.MaxEntries() && it.Next(&k, &v); n++ {
		keys = append(keys, k)
		vals = append(vals, v)
	}
	return keys, vals, it.Err()
}

// bootNow is CLOCK_BOOTTIME, the clock the eBPF side stamps waits with.
func bootNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
