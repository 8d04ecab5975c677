//go:build linux

package sampler

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
)

// bootToUnix returns the offset that turns CLOCK_BOOTTIME (what the BPF side
// stamps) into Unix time. Recomputed per use: the wall clock may be stepped.
func bootToUnix() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Now().UnixNano() - ts.Nano()
}

func commString(c [16]int8) string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c))
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// drainKernel flips the program to the other buffer, waits until no program
// can still be writing the old one, and empties it.
func (s *Sampler) drainKernel() (Batch, error) {
	old := s.active
	next := old ^ 1
	if err := s.objs.ActiveBuf.Set(next); err != nil {
		return Batch{}, fmt.Errorf("sampler: switching buffers: %w", err)
	}
	s.active = next
	// An ARRAY_OF_MAPS update returns only after an RCU grace period, i.e.
	// after every program that read the old active_buf has finished.
	if err := s.objs.Barrier.Put(uint32(0), s.objs.BarrierInner); err != nil {
		return Batch{}, fmt.Errorf("sampler: buffer barrier: %w", err)
	}

	counts, stacks := s.objs.counts(old), s.objs.stacks(old)
	var (
		key   bpf.ProfileSampleKey
		val   bpf.ProfileSampleValue
		keys  []bpf.ProfileSampleKey
		vals  []bpf.ProfileSampleValue
		iter  = counts.Iterate()
		depth = s.cfg.MaxStackDepth
	)
	for iter.Next(&key, &val) {
		keys = append(keys, key)
		vals = append(vals, val)
	}
	if err := iter.Err(); err != nil {
		return Batch{}, fmt.Errorf("sampler: reading counts: %w", err)
	}
	for i := range keys {
		if err := counts.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return Batch{}, fmt.Errorf("sampler: clearing counts: %w", err)
		}
	}

	ustacks := s.objs.ustacks(old)
	walked := map[uint64]userStack{}
	var ubuf bpf.ProfileUserStack
	lookupWalked := func(h uint64) (userStack, error) {
		if w, ok := walked[h]; ok {
			return w, nil
		}
		if err := ustacks.Lookup(h, &ubuf); err != nil {
			return userStack{}, fmt.Errorf("sampler: user stack %x: %w", h, err)
		}
		n := min(int(ubuf.Len), len(ubuf.Pcs))
		w := userStack{pcs: append([]uint64(nil), ubuf.Pcs[:n]...), stop: StopReason(ubuf.Reason)}
		for i, pc := range w.pcs {
			if pc&pcExact != 0 {
				w.pcs[i] = pc &^ pcExact
				w.exact = append(w.exact, uint8(i))
			}
		}
		walked[h] = w
		return w, nil
	}

	// Stacks are shared by rows; look each id up once and free it.
	cache := map[int32][]uint64{}
	buf := make([]uint64, depth)
	lookup := func(id int32) ([]uint64, error) {
		if id < 0 {
			return nil, nil
		}
		if pcs, ok := cache[id]; ok {
			return pcs, nil
		}
		if err := stacks.Lookup(uint32(id), buf); err != nil {
			return nil, fmt.Errorf("sampler: stack %d: %w", id, err)
		}
		n := 0
		for n < len(buf) && buf[n] != 0 {
			n++
		}
		pcs := append([]uint64(nil), buf[:n]...)
		cache[id] = pcs
		return pcs, nil
	}

	off := bootToUnix()
	b := Batch{Samples: make([]Sample, 0, len(keys))}
	var truncated uint64
	for i, k := range keys {
		ks, err := lookup(k.Kstack)
		if err != nil {
			return Batch{}, err
		}
		var us []uint64
		var exact []uint8
		stop := StopFramePointers
		if k.Ustack == -2 {
			w, err := lookupWalked(k.Uhash)
			if err != nil {
				return Batch{}, err
			}
			us, stop, exact = w.pcs, w.stop, w.exact
		} else if us, err = lookup(k.Ustack); err != nil {
			return Batch{}, err
		} else if s.cfg.walking() {
			stop = StopOK // no user stack (kernel thread)
		}
		v := vals[i]
		smp := Sample{
			Pid: k.Pid, Tid: k.Tid, CPU: k.Cpu, Comm: commString(v.Comm),
			UserPCs: us, UserExact: exact, KernelPCs: ks, Count: v.Count,
			FirstNs: int64(v.FirstNs) + off, LastNs: int64(v.LastNs) + off,
			Truncated: len(us) >= depth || len(ks) == depth || stop == StopDepth,
			Stop:      stop,
		}
		if smp.Truncated {
			truncated += v.Count
		}
		b.Samples = append(b.Samples, smp)
	}
	s.truncatedUser.Add(truncated)

	for id := range cache {
		if err := stacks.Delete(uint32(id)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return Batch{}, fmt.Errorf("sampler: clearing stacks: %w", err)
		}
	}
	if s.cfg.walking() {
		for h := range walked {
			if err := ustacks.Delete(h); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return Batch{}, fmt.Errorf("sampler: clearing user stacks: %w", err)
			}
		}
		if err := sweep(ustacks, new(uint64)); err != nil {
			return Batch{}, err
		}
	}
	// Stacks whose sample was then dropped (count map full, or the other
	// stack of the sample collided) are referenced by no row; sweep them.
	for {
		var next uint32
		err := stacks.NextKey(nil, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return Batch{}, fmt.Errorf("sampler: sweeping stacks: %w", err)
		}
		if err := stacks.Delete(next); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return Batch{}, fmt.Errorf("sampler: sweeping stacks: %w", err)
		}
	}
	return b, nil
}

type userStack struct {
	pcs   []uint64
	stop  StopReason
	exact []uint8 // see Sample.UserExact
}

// pcExact marks, in a walked stack, a PC that is not a return address
// (bpf/unwind.h: the interrupted PC after a signal frame). User addresses
// never have the top bit.
const pcExact = 1 << 63

// sweep deletes every key of m (entries no row referenced).
func sweep[K any](m *ebpf.Map, k *K) error {
	for {
		err := m.NextKey(nil, k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("sampler: sweeping %v: %w", m, err)
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("sampler: sweeping %v: %w", m, err)
		}
	}
}

// rbKey identifies an aggregation row in ring buffer mode; the stacks are
// their raw bytes.
type rbKey struct {
	pid, tid, cpu uint32
	kstack        string
	ustack        string
}

type rbRow struct {
	count       uint64
	first, last uint64
	comm        string
	truncated   bool
}

// rbAggregator aggregates ring buffer samples between two Drains.
type rbAggregator struct {
	mu    sync.Mutex
	depth int
	rows  map[rbKey]*rbRow
}

func newRBAggregator(depth int) *rbAggregator {
	return &rbAggregator{depth: depth, rows: map[rbKey]*rbRow{}}
}

func (a *rbAggregator) add(raw []byte) error {
	var rec bpf.ProfileRbSample
	hdr := int(unsafe.Offsetof(rec.Frames))
	if len(raw) < hdr {
		return fmt.Errorf("short sample record: %d bytes", len(raw))
	}
	// Host byte order, layout of struct rb_sample up to the used frames.
	ne := binary.NativeEndian
	pid := ne.Uint32(raw[unsafe.Offsetof(rec.Pid):])
	tid := ne.Uint32(raw[unsafe.Offsetof(rec.Tid):])
	cpu := ne.Uint32(raw[unsafe.Offsetof(rec.Cpu):])
	kn := int(ne.Uint32(raw[unsafe.Offsetof(rec.KstackLen):]))
	un := int(ne.Uint32(raw[unsafe.Offsetof(rec.UstackLen):]))
	ts := ne.Uint64(raw[unsafe.Offsetof(rec.TsNs):])
	comm := raw[unsafe.Offsetof(rec.Comm):][:len(rec.Comm)]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	if len(raw) < hdr+8*(kn+un) {
		return fmt.Errorf("sample record of %d bytes holds no %d+%d frames", len(raw), kn, un)
	}
	k := rbKey{
		pid: pid, tid: tid, cpu: cpu,
		kstack: string(raw[hdr : hdr+8*kn]),
		ustack: string(raw[hdr+8*kn : hdr+8*(kn+un)]),
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rows[k]
	if r == nil {
		r = &rbRow{first: ts, comm: string(comm)}
		a.rows[k] = r
	}
	r.count++
	r.last = ts
	r.truncated = kn == a.depth || un == a.depth
	return nil
}

func pcsOf(s string) []uint64 {
	pcs := make([]uint64, len(s)/8)
	for i := range pcs {
		pcs[i] = binary.NativeEndian.Uint64([]byte(s[8*i:]))
	}
	return pcs
}

func (a *rbAggregator) swap() Batch {
	a.mu.Lock()
	rows := a.rows
	a.rows = map[rbKey]*rbRow{}
	a.mu.Unlock()
	off := bootToUnix()
	b := Batch{Samples: make([]Sample, 0, len(rows))}
	for k, r := range rows {
		b.Samples = append(b.Samples, Sample{
			Pid: k.pid, Tid: k.tid, CPU: k.cpu, Comm: r.comm,
			UserPCs: pcsOf(k.ustack), KernelPCs: pcsOf(k.kstack),
			Count: r.count, FirstNs: int64(r.first) + off, LastNs: int64(r.last) + off,
			Truncated: r.truncated, Stop: StopFramePointers,
		})
	}
	return b
}

func (s *Sampler) readSamples() {
	defer s.wg.Done()
	var rec ringbuf.Record
	for {
		if err := s.samplesRd.ReadInto(&rec); err != nil {
			if !errors.Is(err, os.ErrClosed) {
				s.log.Error("reading samples", zap.Error(err))
			}
			return
		}
		if err := s.agg.add(rec.RawSample); err != nil {
			s.log.Warn("bad sample record", zap.Error(err))
		}
	}
}

// eventPoll bounds how long an exit event waits to be read: exits wake no
// reader (bpf/profile.c), they are read with the next event or by then.
const eventPoll = time.Second

func (s *Sampler) readEvents() {
	defer s.wg.Done()
	var rec ringbuf.Record
	s.eventsRd.SetDeadline(time.Now().Add(eventPoll))
	for {
		if err := s.eventsRd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.eventsRd.SetDeadline(time.Now().Add(eventPoll))
				continue
			}
			if !errors.Is(err, os.ErrClosed) {
				s.log.Error("reading process events", zap.Error(err))
			}
			return
		}
		var pe bpf.ProfileProcEvent
		raw := rec.RawSample
		if len(raw) < int(unsafe.Sizeof(pe)) {
			continue
		}
		ne := binary.NativeEndian
		ev := Event{
			Pid:     ne.Uint32(raw[unsafe.Offsetof(pe.Pid):]),
			Kind:    EventKind(ne.Uint32(raw[unsafe.Offsetof(pe.Kind):])),
			TimeNs:  int64(ne.Uint64(raw[unsafe.Offsetof(pe.TsNs):])) + bootToUnix(),
			MMAlive: ne.Uint32(raw[unsafe.Offsetof(pe.HasMm):]) != 0,
		}
		if ev.Kind == tableWanted {
			if s.unwinder != nil {
				s.unwinder.Request(ev.Pid) // the pid field holds the table slot
			}
			continue
		}
		if s.cfg.OnEvent != nil {
			s.cfg.OnEvent(ev)
			continue
		}
		select {
		case s.events <- ev:
		default:
			s.lostEventsUser.Add(1)
		}
	}
}
