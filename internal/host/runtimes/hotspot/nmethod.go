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
// In the nmethod (11 to 22): metadata at this + _metadata_offset up to
// _scopes_data_begin, scopes data up to this + _scopes_pcs_offset, PcDescs
// up to this + _dependencies_offset.

// Bounds: an nmethod's PcDescs (real ones: hundreds) and inlining depth
// (MaxInlineLevel is 15).
const (
	maxPCDescBytes = 1 << 20
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
	scopes := le.Uint64(hdr[l.nmScopesData:])
	meta := nm + uint64(le.Uint32(hdr[l.nmMetadataOff:]))
	pcs := nm + uint64(le.Uint32(hdr[l.nmScopesPCsOff:]))
	deps := nm + uint64(le.Uint32(hdr[l.nmDepsOff:]))
	code := le.Uint64(hdr[l.blobCodeBegin:])
	if !(meta <= scopes && scopes <= pcs && pcs <= deps) || deps-pcs > maxPCDescBytes || code < nm {
		return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: metadata %#x, scopes %#x, pcs %#x, end %#x: %w",
			nm, meta, scopes, pcs, deps, runtimes.ErrBadFrame)
	}
	pc := code + uint64(off)
	decode, err := pr.scopeAt(pcs, deps, int64(pc-code), leaf)
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
		if n == maxScopes || decode >= pcs-scopes {
			return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: scope at %d: %w", nm, decode, runtimes.ErrBadFrame)
		}
		w := make([]byte, min(scopeWindow, pcs-scopes-decode))
		if err := pr.mem.Read(scopes+decode, w); err != nil {
			return runtimes.Symbol{}, err
		}
		s := stream{b: w, x: x}
		sender, e1 := s.uint()
		idx, e2 := s.uint()
		bci, e3 := s.uint()
		if e1 != nil || e2 != nil || e3 != nil || idx == 0 || uint64(idx)*8 > scopes-meta {
			return runtimes.Symbol{}, fmt.Errorf("nmethod %#x: scope at %d: %w", nm, decode, runtimes.ErrBadFrame)
		}
		mp, err := pr.mem.U64(meta + 8*uint64(idx-1))
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
