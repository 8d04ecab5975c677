//go:build linux && (amd64 || arm64)

package sampler

// Stack copies: a sample whose process's unwind tables were not loaded yet
// sends its user stack (stack_copies ring buffer) instead of counting a
// stack cut at the leaf; the unwind Manager walks it once the tables are,
// and the next Drain holds it as a sample of its own (docs/unwinding.md).

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/unwind"
)

// copyRing holds the copies in flight: about 100 of 8 KiB (2 KiB of
// header each). The reader takes them as they come, but a loaded host
// delays it: with 256 KiB, 27 of 313 copies found the ring full while
// other engineers' builds kept the load average at 12 on 2 cores
// (TestShortLivedWhole), and those samples end not_ready.
const copyRing = 1 << 20

// stackCopyBytes is what the BPF side copies: 0 where the host walk does
// not know the architecture (it follows x86-64's rows and frame records)
// or where copies are off.
func (c *Config) stackCopyBytes() uint32 {
	if !c.walking() || runtime.GOARCH != "amd64" || c.Unwinding.StackCopyBytes < 0 {
		return 0
	}
	n := c.Unwinding.StackCopyBytes
	if n == 0 {
		n = unwind.DefaultStackCopyBytes
	}
	return uint32(min(n, unwind.MaxStackCopyBytes))
}

// copyQueue is how many decoded copies wait for the unwind Manager (about
// 10 KiB each). The Manager walks a copy under its lock, with rows-map
// lookups per frame, and loading a table walks the copies that waited for
// it; the queue keeps the ring's reader off that lock, so that a slow walk
// (qemu's TCG) holds up no copy in the ring. When it is full the reader
// waits, and the ring counts what it cannot take (StackCopyLost).
const copyQueue = 256

// readCopies decodes every stack copy for feedCopies.
func (s *Sampler) readCopies(q chan<- *unwind.StackCopy) {
	defer s.wg.Done()
	defer close(q)
	var rec ringbuf.Record
	for {
		if err := s.copiesRd.ReadInto(&rec); err != nil {
			if !errors.Is(err, os.ErrClosed) {
				s.log.Error("reading stack copies", zap.Error(err))
			}
			return
		}
		if c, ok := decodeCopy(rec.RawSample); ok {
			q <- c
		}
	}
}

// feedCopies hands the decoded copies to the unwind Manager.
func (s *Sampler) feedCopies(q <-chan *unwind.StackCopy) {
	defer s.wg.Done()
	for c := range q {
		s.unwinder.AddCopy(c)
	}
}

// decodeCopy parses a struct stack_copy record, sent up to its stack's
// copied size.
func decodeCopy(raw []byte) (*unwind.StackCopy, bool) {
	var sc bpf.ProfileStackCopy
	head := int(unsafe.Offsetof(sc.Stack))
	if len(raw) < head {
		return nil, false
	}
	ne := binary.NativeEndian
	u32 := func(off uintptr) uint32 { return ne.Uint32(raw[off:]) }
	u64 := func(off uintptr) uint64 { return ne.Uint64(raw[off:]) }
	words := func(off uintptr, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = ne.Uint64(raw[off+uintptr(8*i):])
		}
		return out
	}
	size := int(u32(unsafe.Offsetof(sc.Size)))
	ulen := int(u32(unsafe.Offsetof(sc.Ulen)))
	kn := int(u32(unsafe.Offsetof(sc.Kbytes))) / 8
	fn := int(u32(unsafe.Offsetof(sc.Fplen)))
	if size > len(raw)-head || ulen > len(sc.Upcs) || kn > len(sc.Kpcs) || fn > len(sc.Fpcs) {
		return nil, false
	}
	var comm [16]int8
	for i := range comm {
		comm[i] = int8(raw[unsafe.Offsetof(sc.Comm)+uintptr(i)])
	}
	return &unwind.StackCopy{
		Pid: u32(unsafe.Offsetof(sc.Pid)), Tid: u32(unsafe.Offsetof(sc.Tid)), CPU: u32(unsafe.Offsetof(sc.Cpu)),
		Comm: commString(comm), BootNs: u64(unsafe.Offsetof(sc.TsNs)),
		PC: u64(unsafe.Offsetof(sc.Pc)), SP: u64(unsafe.Offsetof(sc.Sp)), FP: u64(unsafe.Offsetof(sc.Fp)),
		PCExact:   u32(unsafe.Offsetof(sc.PcExact)) != 0,
		Walked:    words(unsafe.Offsetof(sc.Upcs), ulen),
		Kernel:    words(unsafe.Offsetof(sc.Kpcs), kn),
		FPCallers: words(unsafe.Offsetof(sc.Fpcs), fn),
		Stack:     append([]byte(nil), raw[head:head+size]...),
	}, true
}

// walkedCopies turns the copies the Manager walked since the last Drain
// into samples of one count each.
func (s *Sampler) walkedCopies(b *Batch) {
	if s.unwinder == nil || s.copiesRd == nil {
		return
	}
	off := bootToUnix()
	for _, w := range s.unwinder.TakeWalked() {
		c := w.Copy
		var u bpf.ProfileUserStack
		n := copy(u.Pcs[:], w.Words)
		u.Len, u.Reason = uint32(n), w.Reason
		us := decodeWalked(&u)
		stop := us.stop // the Manager keeps to MaxStackWords
		ks := c.Kernel
		if len(ks) > s.cfg.MaxStackDepth {
			ks = ks[:s.cfg.MaxStackDepth]
		}
		if !s.cfg.KernelStacks {
			ks = nil
		}
		t := int64(c.BootNs) + off
		smp := Sample{
			Pid: c.Pid, Tid: c.Tid, CPU: c.CPU, Comm: c.Comm,
			UserPCs: us.pcs, UserExact: us.exact, Runtime: us.runtime, KernelPCs: ks, Count: 1,
			FirstNs: t, LastNs: t, Stop: stop,
			Truncated: stop == StopDepth || len(ks) == s.cfg.MaxStackDepth,
		}
		if smp.Truncated {
			s.truncatedUser.Add(1)
		}
		if stop < NumStopReasons {
			s.copyStops[stop].Add(1)
		}
		b.Samples = append(b.Samples, smp)
	}
}
