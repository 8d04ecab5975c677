package hotspot

import (
	"encoding/binary"
	"errors"
	"sort"
	"strings"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// Stub frames are named as the upstream profiler names them: the
// CodeBlob's name ("StubRoutines (1)", "I2C/C2I adapters", "vtable
// chunks", a runtime stub's "_new_array_Java"), and in brackets the
// StubRoutines routine the PC is in when the tables say so. The tables
// export the entry of many routines (StubRoutines::_jint_arraycopy, ...)
// but not their ends, and not every routine: a PC is put in the routine
// with the nearest entry at or below it, within the blob. The call stub's
// return address, where every Java call from native code comes back to,
// is exported itself and is named exactly.

// maxBlobName bounds a CodeBlob name read (real ones are under 64 bytes).
const maxBlobName = 128

type stubEntry struct {
	addr uint64
	name string
}

func (r *Runtime) stubSymbol(pr *proc, blob uint64, off uint32) (runtimes.Symbol, error) {
	l := pr.l
	hdr := make([]byte, l.blobHeader)
	if err := pr.mem.Read(blob, hdr); err != nil {
		return runtimes.Symbol{}, err
	}
	le := binary.LittleEndian
	name, err := pr.mem.CString(le.Uint64(hdr[l.blobName:]), min(maxBlobName, r.cfg.MaxNameBytes))
	if errors.Is(err, frame.ErrLimitExceeded) {
		name, err = cut(name, min(maxBlobName, r.cfg.MaxNameBytes)), nil
	}
	if err != nil {
		return runtimes.Symbol{}, err
	}
	name = strings.ToValidUTF8(name, "\uFFFD")
	code, end := l.codeBounds(blob, hdr)
	pc := code + uint64(off)
	if routine := pr.routine(pc, code, end); routine != "" {
		name += " [" + routine + "]"
	}
	return runtimes.Symbol{Frames: []frame.Frame{{Name: name}}, Type: frame.TypeJVM}, nil
}

// routine names the StubRoutines routine holding pc in the blob's code
// [code, end), or "".
func (pr *proc) routine(pc, code, end uint64) string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stubs == nil {
		pr.stubs = pr.readStubs()
	}
	if pr.callStubRet != 0 && pc == pr.callStubRet {
		return "call_stub"
	}
	i := sort.Search(len(pr.stubs), func(i int) bool { return pr.stubs[i].addr > pc }) - 1
	if i < 0 || pr.stubs[i].addr < code || pc >= end {
		return ""
	}
	return pr.stubs[i].name
}

// readStubs reads the entries of the routines the tables list, sorted.
func (pr *proc) readStubs() []stubEntry {
	out := make([]stubEntry, 0, len(pr.l.stubs))
	for name, addr := range pr.l.stubs {
		if name == "call_stub_return_address" {
			continue
		}
		entry, err := pr.mem.U64(addr + pr.bias)
		if err != nil || entry < pr.codeLo || entry >= pr.codeHi {
			continue
		}
		out = append(out, stubEntry{addr: entry, name: name})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].addr != out[j].addr {
			return out[i].addr < out[j].addr
		}
		return out[i].name < out[j].name
	})
	return out
}
