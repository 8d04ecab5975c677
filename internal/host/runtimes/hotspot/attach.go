package hotspot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// errNotReady: the JVM has not set up its code cache or interpreter yet
// (it is starting); a later snapshot attaches it.
var errNotReady = errors.New("HotSpot not initialized yet")

// libjvm finds the mapping of libjvm.so in p.
func libjvm(p *normalize.Process) *normalize.Mapping {
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File != nil && filepath.Base(m.Path) == "libjvm.so" {
			return m
		}
	}
	return nil
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

// layoutKey identifies a libjvm build: the tables are the same in every
// process that maps the same file. The file's version keeps a hostile
// file that copies a real build id apart from the real one.
type layoutKey struct {
	file    normalize.FileID
	buildID string
}

// layoutFor reads libjvm's layout, once per file.
func (r *Runtime) layoutFor(pid int, m *normalize.Mapping, mem memory, bias uint64) (*layout, error) {
	r.mu.Lock()
	e, ok := r.layouts[layoutKeyOf(m)]
	r.mu.Unlock()
	if ok {
		return e.l, e.err
	}
	syms, err := r.symbols(pid, m)
	var l *layout
	if err == nil {
		var t *tables
		if t, err = readTables(mem, syms, bias, wantTypes); err == nil {
			l, err = newLayout(t, m.File.Loads, bias, mem)
		}
	}
	// A layout read whole is the file's. A failure may be the
	// process's (read before its loader relocated the tables): Attach
	// remembers it for the file only once it is final.
	if err == nil {
		r.rememberLayout(m, layoutEntry{l: l})
	}
	return l, err
}

// rememberLayout keeps e as the layout of m's file.
func (r *Runtime) rememberLayout(m *normalize.Mapping, e layoutEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.layouts) >= maxLayouts {
		clear(r.layouts)
	}
	r.layouts[layoutKeyOf(m)] = e
}

func layoutKeyOf(m *normalize.Mapping) layoutKey {
	return layoutKey{file: m.File.ID, buildID: m.File.GNUBuildID}
}

// maxLayouts bounds the libjvm builds remembered.
const maxLayouts = 64

type layoutEntry struct {
	l   *layout
	err error
}

// symbols finds the tables' variables in libjvm's dynamic symbols,
// opening the file the way the process sees it.
func (r *Runtime) symbols(pid int, m *normalize.Mapping) (tableSyms, error) {
	var last error = fmt.Errorf("%s: %w", m.Path, runtimes.ErrProcessGone)
	for _, path := range normalize.OpenPaths(filepath.Join(r.procRoot, strconv.Itoa(pid)), m.Start, m.End, m.Path) {
		f, err := elfx.Open(path)
		if err != nil {
			last = err
			continue
		}
		syms, err := dynamicSymbols(f, tableSymbols, optionalSymbols)
		f.Close()
		return syms, err
	}
	return nil, last
}

// codeCache reads where the process's code cache, code heaps and
// interpreter are, into the walker's per-process entry.
func (pr *proc) codeCache() (bpf.ProfileHotspotProc, error) {
	l, mem, bias := pr.l, pr.mem, pr.bias
	var v bpf.ProfileHotspotProc
	var lo, hi uint64
	var ptrs []byte // the CodeHeap*s
	if l.ccHeap != 0 {
		// JDK 8: one heap; the code cache is its memory.
		h, err := mem.U64(l.ccHeap + bias)
		if err != nil || h == 0 {
			return v, errors.Join(err, errNotReady)
		}
		ptrs = binary.LittleEndian.AppendUint64(nil, h)
		lo, hi = 0, runtimes.UserTop
	} else {
		var err error
		if lo, err = mem.U64(l.ccLow + bias); err != nil {
			return v, err
		}
		if hi, err = mem.U64(l.ccHigh + bias); err != nil {
			return v, err
		}
		if lo == 0 || hi == 0 {
			return v, errNotReady
		}
		if lo >= hi || hi-lo > maxCodeCache || lo%pageSize != 0 || hi > runtimes.UserTop {
			return v, layoutErr("code cache [%#x, %#x)", lo, hi)
		}
		heaps, err := mem.U64(l.ccHeaps + bias)
		if err != nil || heaps == 0 {
			return v, errors.Join(err, errNotReady)
		}
		n, err := mem.U32(heaps + l.gaLen)
		if err != nil {
			return v, err
		}
		data, err := mem.U64(heaps + l.gaData)
		if err != nil {
			return v, err
		}
		if n == 0 || data == 0 {
			return v, errNotReady
		}
		if n > uint32(len(v.Heaps)) {
			return v, layoutErr("%d code heaps (at most %d)", n, len(v.Heaps))
		}
		ptrs = make([]byte, 8*n)
		if err := mem.Read(data, ptrs); err != nil {
			return v, err
		}
	}
	n := uint32(len(ptrs) / 8)
	heap := make([]byte, max(l.heapMemory, l.heapSegmap)+l.vsHighBoundary+8)
	if int(l.heapLog2Seg)+4 > len(heap) {
		heap = make([]byte, l.heapLog2Seg+4)
	}
	for i := range n {
		h := binary.LittleEndian.Uint64(ptrs[8*i:])
		if h == 0 {
			return v, errNotReady
		}
		if err := mem.Read(h, heap); err != nil {
			return v, err
		}
		u64 := func(off uint64) uint64 { return binary.LittleEndian.Uint64(heap[off:]) }
		memLo, memHi := u64(l.heapMemory+l.vsLowBoundary), u64(l.heapMemory+l.vsHighBoundary)
		segmap := u64(l.heapSegmap + l.vsLowBoundary)
		shift := binary.LittleEndian.Uint32(heap[l.heapLog2Seg:])
		if memLo == 0 || memHi == 0 || segmap == 0 || shift == 0 {
			return v, errNotReady // the heap is being set up
		}
		if l.ccHeap != 0 {
			lo, hi = memLo, memHi
			if lo%pageSize != 0 || hi-lo > maxCodeCache || hi > runtimes.UserTop {
				return v, layoutErr("code cache [%#x, %#x)", lo, hi)
			}
		}
		if memLo < lo || memHi > hi || memLo >= memHi || shift < 4 || shift > 12 {
			return v, layoutErr("code heap %d: [%#x, %#x), segment map %#x, segments of 2^%d", i, memLo, memHi, segmap, shift)
		}
		if i > 0 && shift != v.SegShift {
			return v, layoutErr("code heaps with segments of 2^%d and 2^%d", v.SegShift, shift)
		}
		v.Heaps[i].Lo, v.Heaps[i].Hi, v.Heaps[i].Segmap = memLo, memHi, segmap
		v.SegShift = shift
	}
	v.Nheaps = n
	pr.codeLo, pr.codeHi = lo, hi
	v.CodeLo, v.CodeHi = lo, hi

	// The interpreter: AbstractInterpreter::_code is its StubQueue.
	q, err := mem.U64(l.interpCode + bias)
	if err != nil || q == 0 {
		return v, errors.Join(err, errNotReady)
	}
	buf, err := mem.U64(q + l.sqBuffer)
	if err != nil {
		return v, err
	}
	size, err := mem.U32(q + l.sqLimit)
	if err != nil {
		return v, err
	}
	if buf < lo || buf >= hi || uint64(size) > hi-buf || size == 0 {
		return v, layoutErr("interpreter at [%#x, +%d)", buf, size)
	}
	v.InterpLo, v.InterpHi = buf, buf+uint64(size)

	ret, err := mem.U64(l.callStubRet + bias)
	if err != nil || ret == 0 {
		return v, errors.Join(err, errNotReady)
	}
	if ret < lo || ret >= hi {
		return v, layoutErr("call stub return address %#x outside the code cache", ret)
	}
	pr.callStubRet, v.CallStubRet = ret, ret

	v.HeapBlock = uint16(l.heapBlockSize)
	v.BlobBytes = uint16(l.blobReadBytes())
	v.BlobName, v.BlobSize, v.BlobCodeBegin = uint16(l.blobName), uint16(l.blobSize), uint16(l.blobCodeBegin)
	v.BlobFrameComplete, v.BlobFrameSize = uint16(l.blobFrameComplete), uint16(l.blobFrameSize)
	v.NmCompileId, v.NmOrigPc, v.NmDeopt = uint16(l.nmCompileID), uint16(l.nmOrigPCOffset), uint16(l.nmDeoptHandler)
	v.MethodConst, v.CmSize, v.CmCodeSize = uint16(l.methodConst), uint16(l.constMethodSize), uint16(l.cmCodeSize)
	if l.codeOffsets {
		v.Flags |= uint16(bpf.ProfileHotspotFlagsHS_CODE_OFFSETS)
	}
	if l.completeWidth == 2 {
		v.Flags |= uint16(bpf.ProfileHotspotFlagsHS_COMPLETE_16)
	}
	v.IfSenderSp, v.IfMethod, v.IfBcp = int16(8*l.ifSenderSP), int16(8*l.ifMethod), int16(8*l.ifBCP)
	return v, nil
}

// maxCodeCache bounds the code cache (ReservedCodeCacheSize is at most
// 2 GB).
const maxCodeCache = 2 << 30
