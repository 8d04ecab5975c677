//go:build linux && (amd64 || arm64)

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
	"github.com/profsym/profsym/internal/host/runtimes"
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
// can still be writing the old one, and empties it. Only the flip and the
// barrier fail the drain: a row whose stack cannot be read is counted
// (Stats.LostDrain) and the rest of the interval is delivered.
func (s *Sampler) drainKernel() (Batch, error) {
	old := s.active
	next := old ^ 1
	if err := s.objs.ActiveBuf.Set(next); err != nil {
		return Batch{}, fmt.Errorf("sampler: switching buffers: %w", err)
	}
	s.active = next
	if err := s.offCPUFlip(); err != nil {
		return Batch{}, err
	}
	// An ARRAY_OF_MAPS update returns only after an RCU grace period, i.e.
	// after every program that read the old active_buf has finished.
	if err := s.objs.Barrier.Put(uint32(0), s.objs.BarrierInner); err != nil {
		return Batch{}, fmt.Errorf("sampler: buffer barrier: %w", err)
	}
	d := drain{
		counts: s.objs.counts(old), stacks: s.objs.stacks(old),
		depth: s.cfg.MaxStackDepth, walking: s.cfg.walking(),
	}
	if d.walking {
		d.ustacks, d.ustackBytes = s.objs.ustacks(old), s.cfg.userStackBytes()
	}
	if s.offcpu != nil {
		d.offcpu = s.offCPUDrain(old)
		s.carryOffCPU(old)
	}
	if s.drainHook != nil {
		s.drainHook(&d)
	}
	b := d.run()
	s.lostOffCPU(&d)
	s.truncatedUser.Add(d.truncated)
	s.lostDrain.Add(d.lost)
	s.drainErrors.Add(d.errors)
	if d.firstErr != nil {
		s.log.Warn("sampler: drain could not read everything", zap.Uint64("samples_lost", d.lost),
			zap.Uint64("errors", d.errors), zap.Error(d.firstErr))
	}
	return b, nil
}

// mapOps is what a drain needs of a map: *ebpf.Map has it; tests wrap one
// to make lookups fail.
type mapOps interface {
	Lookup(key, valueOut any) error
	Delete(key any) error
	NextKey(key, nextKeyOut any) error
	BatchLookupAndDelete(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error)
	MaxEntries() uint32
}

// drain empties one quiescent aggregation buffer.
type drain struct {
	counts, stacks, ustacks mapOps // ustacks nil unless walking
	depth                   int
	ustackBytes             int // the size of ustacks' values
	walking                 bool
	offcpu                  *offcpuDrain // nil unless off-CPU samples are on

	truncated uint64 // samples with a stack at the depth limit
	lost      uint64 // samples whose stack could not be read
	errors    uint64 // map operations that failed
	firstErr  error
}

func (d *drain) fail(err error) {
	d.errors++
	if d.firstErr == nil {
		d.firstErr = err
	}
}

// countBatch is how many rows one batch call reads.
const countBatch = 1024

// readCounts takes every row out of the counts map.
func (d *drain) readCounts() ([]bpf.ProfileSampleKey, []bpf.ProfileSampleValue) {
	return readRows[bpf.ProfileSampleKey, bpf.ProfileSampleValue](d, d.counts)
}

// readRows takes every row out of a counts map: in batches where the
// kernel has them (5.6+), key by key otherwise.
func readRows[K, V any](d *drain, counts mapOps) ([]K, []V) {
	var (
		keys  []K
		vals  []V
		kbuf  = make([]K, countBatch)
		vbuf  = make([]V, countBatch)
		cur   ebpf.MapBatchCursor
		batch = true
	)
	for {
		n, err := counts.BatchLookupAndDelete(&cur, kbuf, vbuf, nil)
		keys = append(keys, kbuf[:n]...)
		vals = append(vals, vbuf[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			// Unsupported, or failed part way: what it returned is
			// already deleted and kept; the rest goes key by key.
			if !errors.Is(err, ebpf.ErrNotSupported) {
				d.fail(fmt.Errorf("sampler: reading counts in batches: %w", err))
			}
			batch = false
			break
		}
	}
	if batch {
		return keys, vals
	}
	var (
		key, next K
		val       V
		pending   []K
		prev      any // nil: from the first key
	)
	// Collect the keys first: deleting while walking NextKey restarts the
	// walk in a hash map.
	for i := uint32(0); i <= counts.MaxEntries(); i++ {
		err := counts.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			d.fail(fmt.Errorf("sampler: listing counts: %w", err))
			break
		}
		pending = append(pending, next)
		key = next
		prev = &key
	}
	for i := range pending {
		if err := counts.Lookup(&pending[i], &val); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				d.fail(fmt.Errorf("sampler: reading counts: %w", err))
			}
		} else {
			keys = append(keys, pending[i])
			vals = append(vals, val)
		}
		if err := counts.Delete(&pending[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			d.fail(fmt.Errorf("sampler: clearing counts: %w", err))
		}
	}
	sweep(d, counts, new(K))
	return keys, vals
}

func (d *drain) run() Batch {
	keys, vals := d.readCounts()

	walked := map[uint64]userStack{}
	var (
		raw  = make([]byte, d.ustackBytes)
		ubuf bpf.ProfileUserStack
	)
	lookupWalked := func(h uint64) (userStack, error) {
		if w, ok := walked[h]; ok {
			return w, nil
		}
		if err := d.ustacks.Lookup(h, raw); err != nil {
			return userStack{}, fmt.Errorf("sampler: user stack %x: %w", h, err)
		}
		readUserStack(raw, &ubuf)
		w := decodeWalked(&ubuf)
		walked[h] = w
		return w, nil
	}

	// Stacks are shared by rows; look each id up once.
	cache := map[int32][]uint64{}
	buf := make([]uint64, d.depth)
	lookup := func(id int32) ([]uint64, error) {
		if id < 0 {
			return nil, nil
		}
		if pcs, ok := cache[id]; ok {
			return pcs, nil
		}
		if err := d.stacks.Lookup(uint32(id), buf); err != nil {
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
	for i, k := range keys {
		v := vals[i]
		ks, err := lookup(k.Kstack)
		var us []uint64
		var exact []uint8
		var rt []runtimes.Frame
		stop := StopFramePointers
		switch {
		case err != nil:
		case k.Ustack == -2:
			var w userStack
			if w, err = lookupWalked(k.Uhash); err == nil {
				us, stop, exact, rt = w.pcs, w.stop, w.exact, w.runtime
			}
		default:
			if us, err = lookup(k.Ustack); err == nil && d.walking {
				stop = StopOK // no user stack (kernel thread)
			}
		}
		if err != nil {
			d.lost += v.Count
			d.fail(err)
			continue
		}
		smp := Sample{
			Pid: k.Pid, Tid: k.Tid, CPU: k.Cpu, Comm: commString(v.Comm), GoLabels: k.Labels,
			TraceID: k.TraceId, SpanID: k.SpanId,
			UserPCs: us, UserExact: exact, Runtime: rt, KernelPCs: ks, Count: v.Count,
			FirstNs: int64(v.FirstNs) + off, LastNs: int64(v.LastNs) + off,
			// A walked stack says so (StopDepth: max_stack_words
			// reached); one of frame pointers fills the stack map.
			Truncated: k.Ustack != -2 && len(us) >= d.depth || len(ks) == d.depth || stop == StopDepth,
			Stop:      stop,
		}
		if smp.Truncated {
			d.truncated += v.Count
		}
		b.Samples = append(b.Samples, smp)
	}

	if d.offcpu != nil {
		b.Samples = d.offCPURows(b.Samples, lookupWalked, off)
	}

	// Free what was read, then sweep what no row referenced (stacks whose
	// sample was dropped: count map full, the other stack collided) and
	// what could not be read.
	for id := range cache {
		if err := d.stacks.Delete(uint32(id)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			d.fail(fmt.Errorf("sampler: clearing stacks: %w", err))
		}
	}
	sweep(d, d.stacks, new(uint32))
	if d.ustacks != nil {
		for h := range walked {
			if err := d.ustacks.Delete(h); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				d.fail(fmt.Errorf("sampler: clearing user stacks: %w", err))
			}
		}
		sweep(d, d.ustacks, new(uint64))
	}
	return b
}

type userStack struct {
	pcs     []uint64
	stop    StopReason
	exact   []uint8 // see Sample.UserExact
	runtime []runtimes.Frame
}

// Bits of a walked stack's words (bpf/runtime.h).
const (
	pcExact    = 1 << bpf.ProfileStackWordBitsPC_EXACT_BIT
	rtFrame    = 1 << bpf.ProfileStackWordBitsRT_FRAME_BIT
	rtKindMask = 1<<bpf.ProfileStackWordBitsRT_KIND_BITS - 1
	rtPtrMask  = 1<<bpf.ProfileStackWordBitsRT_KIND_SHIFT - 1
)

// readUserStack reads a value of the ustacks maps, struct user_stack cut
// after the configured words (userStackBytes), into u.
func readUserStack(b []byte, u *bpf.ProfileUserStack) {
	ne := binary.NativeEndian
	u.Len, u.Reason = ne.Uint32(b), ne.Uint32(b[4:])
	n := min(len(u.Pcs), (len(b)-8)/8)
	for i := range n {
		u.Pcs[i] = ne.Uint64(b[8+8*i:])
	}
	clear(u.Pcs[n:])
}

// decodeWalked turns the walker's words into a userStack: native PCs
// (marked exact where they are no return address) and runtime frames,
// which take two words each and one entry of pcs.
func decodeWalked(u *bpf.ProfileUserStack) userStack {
	n := min(int(u.Len), len(u.Pcs))
	w := userStack{pcs: make([]uint64, 0, n), stop: StopReason(u.Reason)}
	for i := 0; i < n; i++ {
		word := u.Pcs[i]
		switch {
		case word&pcExact != 0:
			w.exact = append(w.exact, uint8(len(w.pcs)))
			w.pcs = append(w.pcs, word&^pcExact)
		case word&rtFrame != 0:
			if i+1 == n {
				return w // cut between its two words: no frame
			}
			w.pcs = append(w.pcs, RuntimeMark|uint64(len(w.runtime)))
			w.runtime = append(w.runtime, runtimes.Frame{
				Kind: uint8(word >> bpf.ProfileStackWordBitsRT_KIND_SHIFT & rtKindMask),
				Ptr:  word & rtPtrMask, Aux: u.Pcs[i+1],
			})
			i++
		default:
			w.pcs = append(w.pcs, word)
		}
	}
	return w
}

// sweep deletes every key left in m. A key that cannot be deleted is
// counted once and ends the sweep, which is bounded by the map's size
// either way.
func sweep[K any](d *drain, m mapOps, k *K) {
	for i := uint32(0); i <= m.MaxEntries(); i++ {
		err := m.NextKey(nil, k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return
		}
		if err == nil {
			err = m.Delete(k)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			d.fail(fmt.Errorf("sampler: sweeping %v: %w", m, err))
			return
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

// flushWait bounds how long Drain waits for the samples reader to catch up.
const flushWait = time.Second

// flushSamples has the samples reader consume every record already in the
// ring before Drain takes what it aggregated: a reader starved of CPU
// left the last 1.6 s of a fixture's samples in the ring, for the next
// drain (CI, under -race: 139 of 297 samples). Called with s.mu held.
func (s *Sampler) flushSamples() {
	if s.samplesRd == nil || !s.started {
		return
	}
	select {
	case <-s.samplesFlushed: // an answer to a flush that timed out
	default:
	}
	if err := s.samplesRd.Flush(); err != nil {
		s.log.Warn("flushing the samples ring", zap.Error(err))
		return
	}
	t := time.NewTimer(flushWait)
	defer t.Stop()
	select {
	case <-s.samplesFlushed:
	case <-t.C:
		s.log.Warn("the samples reader did not catch up before the drain", zap.Duration("waited", flushWait))
	}
}

// ExecTime says when pid last replaced its image by exec, in Unix ns,
// for a process the sampler had sampled before: the BPF side records it
// at the exec itself, so it holds when the exec's event was lost or is
// still queued (profbuild.Options.ExecTimes).
//
// Not under s.mu: the receiver handles events on the events reader's
// goroutine, which Close waits for holding s.mu.
func (s *Sampler) ExecTime(pid int) (int64, bool) {
	s.mapsMu.RLock()
	defer s.mapsMu.RUnlock()
	if s.mapsClosed {
		return 0, false
	}
	var at uint64
	if err := s.objs.ExecTimes.Lookup(uint32(pid), &at); err != nil {
		return 0, false
	}
	return int64(at) + bootToUnix(), true
}

// beforeSampleRead, set by tests, runs before each read of the samples
// ring: it can hold the reader back.
var beforeSampleRead func()

func (s *Sampler) readSamples() {
	defer s.wg.Done()
	var rec ringbuf.Record
	for {
		if beforeSampleRead != nil {
			beforeSampleRead()
		}
		if err := s.samplesRd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrFlushed) {
				// Every record written before Drain's Flush is in agg.
				select {
				case s.samplesFlushed <- struct{}{}:
				default:
				}
				continue
			}
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
		if !s.offCPUEvent(&ev) {
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
