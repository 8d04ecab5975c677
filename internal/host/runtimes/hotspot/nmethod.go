package hotspot

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// A compiled frame names the methods inlined at its PC from the nmethod's
// debug information (nmethod.hpp, pcDesc.hpp, scopeDesc.cpp):
//
//   scopes_pcs   PcDesc[]: pc offset -> offset of a scope in scopes_data
//   scopes_data  per scope, UNSIGNED5: offset of the caller's scope (0:
//                none), index of its Method* in the metadata (1-based),
//                bci + 1, then locals and monitors (not read)
//   metadata     Method* and other Metadata*, 8 bytes each
//
// Where these are depends on the JDK (layout.nmDebug): in the nmethod
// (8 to 22: metadata, scopes data, PcDescs, dependencies, in this order);
// in immutable data (23+: PcDescs, then scopes data), metadata in the
// blob's data (23, 24) or after the relocations in its mutable data (25+).

// Bounds: an nmethod's PcDescs (real ones: hundreds) and inlining depth
// (MaxInlineLevel is 15).
const (
	maxPCDescBytes = 1 << 20
	maxDebugBytes  = 16 << 20 // scopes data, metadata
	maxScopes      = 64
	scopeWindow    = 16 // bytes holding a scope's three leading values
)

// compiledSymbol names a compiled frame: nm is the nmethod, off the PC's
// offset from its code, leaf whether the PC was interrupted (rather than a
// return address), id the compile id the walker read.
func (r *Runtime) compiledSymbol(pr *proc, nm uint64, off uint32, leaf bool, id uint32) (runtimes.Symbol, error) {
	l := pr.l
	hdr := make([]byte, l.nmSize)
	if err := pr.mem.Read(nm, hdr); err != nil {
		return runtimes.Symbol{}, err
	}
	le := binary.LittleEndian
	if got := le.Uint32(hdr[l.nmCompileID:]); got != id {
		return runtimes.Symbol{}, fmt.Errorf("nmethod %#x is compile %d, the frame's was %d (flushed): %w", nm, got, id, runtimes.ErrBadFrame)
	}
	owner := le.Uint64(hdr[l.nmMethod:])
	code, _ := l.codeBounds(nm, hdr)
	d := l.debugInfo(nm, hdr)
	if d.meta > d.metaEnd || d.scopes > d.scopesEnd || d.pcs > d.pcsEnd || d.pcsEnd-d.pcs > maxPCDescBytes ||
		d.scopesEnd-d.scopes > maxDebugBytes || d.metaEnd-d.meta > maxDebugBytes || code < nm {
		return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: metadata [%#x, %#x), scopes [%#x, %#x), pcs [%#x, %#x): %w",
			nm, d.meta, d.metaEnd, d.scopes, d.scopesEnd, d.pcs, d.pcsEnd, runtimes.ErrBadFrame)
	}
	pc := code + uint64(off)
	decode, err := pr.scopeAt(d.pcs, d.pcsEnd, int64(pc-code), leaf)
	if err != nil {
		return runtimes.Symbol{}, err
	}
	if decode == 0 {
		// No debug information here (a native method's wrapper, a PC
		// outside every scope): the nmethod's own method.
		m, err := r.method(pr, owner)
		if err != nil {
			return runtimes.Symbol{}, err
		}
		return runtimes.Symbol{Frames: []frame.Frame{m.frame(l, -1)}, Type: frame.TypeJVM}, nil
	}
	var frames []frame.Frame
	x := l.u5x()
	for n := 0; decode != 0; n++ {
		if n == maxScopes || decode >= d.scopesEnd-d.scopes {
			return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: scope at %d: %w", nm, decode, runtimes.ErrBadFrame)
		}
		w := make([]byte, min(scopeWindow, d.scopesEnd-d.scopes-decode))
		if err := pr.mem.Read(d.scopes+decode, w); err != nil {
			return runtimes.Symbol{}, err
		}
		s := stream{b: w, x: x}
		sender, e1 := s.uint()
		idx, e2 := s.uint()
		bci, e3 := s.uint()
		if e1 != nil || e2 != nil || e3 != nil || idx == 0 || uint64(idx)*8 > d.metaEnd-d.meta {
			return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: scope at %d: %w", nm, decode, runtimes.ErrBadFrame)
		}
		mp, err := pr.mem.U64(d.meta + 8*uint64(idx-1))
		if err != nil {
			return runtimes.Symbol{}, err
		}
		m, err := r.method(pr, mp)
		if err != nil {
			return runtimes.Symbol{}, err
		}
		// Stored as bci - InvocationEntryBci (-1); the entry (-1) has
		// the line of bci 0, as Method::line_from_bci gives it.
		frames = append(frames, m.frame(l, max(int(bci)-1, 0)))
		// Callers are written before their callees: offsets only go
		// down along the chain, so it ends.
		if uint64(sender) >= decode {
			return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: scope at %d names %d as its caller: %w", nm, decode, sender, runtimes.ErrBadFrame)
		}
		decode = uint64(sender)
	}
	return runtimes.Symbol{Frames: frames, Type: frame.TypeJVM}, nil
}

// scopeAt finds the PcDesc for a PC offset and returns its scope's decode
// offset (0: none). A return address has a PcDesc of its own; for an
// interrupted PC, HotSpot's profiling (JFR, AsyncGetCallTrace) takes the
// first PcDesc after it, as PcDesc at the next safepoint describes the
// code that leads there: so does this.
func (pr *proc) scopeAt(pcs, end uint64, off int64, leaf bool) (uint64, error) {
	l := pr.l
	b := make([]byte, end-pcs)
	if err := pr.mem.Read(pcs, b); err != nil {
		return 0, err
	}
	size := int(l.pcDescSize)
	n := len(b) / size
	at := func(i int) int64 { return int64(int32(binary.LittleEndian.Uint32(b[i*size+int(l.pcDescPCOffset):]))) }
	scope := func(i int) uint64 { return uint64(binary.LittleEndian.Uint32(b[i*size+int(l.pcDescScope):])) }
	want := off
	if leaf {
		want++
	}
	// PcDescs are sorted by pc offset: the first at or after want with
	// a scope; past the last, the last before it with one.
	i := sort.Search(n, func(i int) bool { return at(i) >= want })
	for j := i; j < n; j++ {
		if sc := scope(j); sc != 0 {
			return sc, nil
		}
	}
	for j := i - 1; j >= 0; j-- {
		if sc := scope(j); sc != 0 {
			return sc, nil
		}
	}
	return 0, nil
}

// debugRanges are where an nmethod's metadata, scopes data and PcDescs
// are.
type debugRanges struct {
	meta, metaEnd, scopes, scopesEnd, pcs, pcsEnd uint64
}

// debugInfo finds the debug information of nmethod nm from its header.
func (l *layout) debugInfo(nm uint64, hdr []byte) debugRanges {
	le := binary.LittleEndian
	var d debugRanges
	if l.nmDebug == nmInBlob {
		d.meta = nm + leUint(hdr, l.nmMetadataOff, l.metaWidth)
		if l.scopesPointer {
			d.scopes = le.Uint64(hdr[l.nmScopesData:])
		} else {
			d.scopes = nm + uint64(le.Uint32(hdr[l.nmScopesData:]))
		}
		d.metaEnd = d.scopes
		d.pcs = nm + uint64(le.Uint32(hdr[l.nmScopesPCsOff:]))
		d.scopesEnd = d.pcs
		d.pcsEnd = nm + uint64(le.Uint32(hdr[l.nmDepsOff:]))
		return d
	}
	imm := le.Uint64(hdr[l.nmImmutableData:])
	d.pcs = imm + uint64(le.Uint32(hdr[l.nmScopesPCsOff:]))
	d.scopes = imm + uint64(le.Uint32(hdr[l.nmScopesData:]))
	d.pcsEnd = d.scopes
	// The speculations and a reference count may follow (JVMCI, 26+):
	// the immutable data's end bounds the scopes all the same.
	d.scopesEnd = imm + uint64(le.Uint32(hdr[l.nmImmutableSize:]))
	if l.mutableData {
		m := le.Uint64(hdr[l.blobMutable:])
		d.meta = m + uint64(le.Uint32(hdr[l.blobRelocSize:]))
		d.metaEnd = m + uint64(le.Uint32(hdr[l.blobMutableSize:]))
	} else {
		d.meta = nm + uint64(le.Uint32(hdr[l.blobDataOffset:])) + leUint(hdr, l.nmMetadataOff, l.metaWidth)
		d.metaEnd = nm + uint64(le.Uint32(hdr[l.blobSize:]))
	}
	return d
}

// codeBounds is a blob's code, [begin, end), from its header.
func (l *layout) codeBounds(blob uint64, hdr []byte) (uint64, uint64) {
	le := binary.LittleEndian
	if l.codeOffsets {
		return blob + uint64(le.Uint32(hdr[l.blobCodeBegin:])), blob + uint64(le.Uint32(hdr[l.blobCodeEnd:]))
	}
	return le.Uint64(hdr[l.blobCodeBegin:]), le.Uint64(hdr[l.blobCodeEnd:])
}

// leUint reads an unsigned field of w bytes (2 or 4).
func leUint(b []byte, off uint64, w uint8) uint64 {
	if w == 2 {
		return uint64(binary.LittleEndian.Uint16(b[off:]))
	}
	return uint64(binary.LittleEndian.Uint32(b[off:]))
}
