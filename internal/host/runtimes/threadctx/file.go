package threadctx

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
)

// Symbol is the TLS variable OTEP 4947 has an SDK export in .dynsym: a
// pointer to the record of the span the thread runs.
const Symbol = "otel_thread_ctx_v1"

// ErrUnsupported: the file publishes the variable in a way this reader
// does not follow (another architecture, the general dynamic TLS model,
// TLS the loader put outside the static block).
var ErrUnsupported = errors.New("unsupported")

// How says how the variable's place relative to the thread pointer is
// found in a process.
type How uint8

const (
	// Static: the main executable's TLS block is the first next to the
	// thread pointer (x86-64: ending at it, the TCB above; arm64: after
	// the 16-byte TCB it points at), so the place follows from the PT_TLS
	// header alone (local-exec, or initial-exec relaxed to it).
	Static How = iota + 1
	// GOTOffset: a library's initial-exec access (R_X86_64_TPOFF64,
	// R_AARCH64_TLS_TPREL64): the loader writes the offset into the GOT
	// word at Slot.
	GOTOffset
	// GOTDescriptor: a library's TLSDESC access (R_X86_64_TLSDESC,
	// R_AARCH64_TLSDESC): the descriptor at Slot is a resolver and its
	// argument; glibc's static resolver returns the argument, the offset.
	GOTDescriptor
)

// Where is what a file says of its otel_thread_ctx_v1.
type Where struct {
	How How
	// Offset is the variable's offset from the thread pointer (Static).
	Offset int64
	// Slot is the link-time address of the GOT word (GOTOffset) or
	// descriptor (GOTDescriptor) the loader fills.
	Slot uint64
	// Above: the static TLS blocks lie above the thread pointer (arm64,
	// TLS variant I), not below it (x86-64, variant II).
	Above bool
}

// maxRelaBytes bounds the relocation sections read from one file.
const maxRelaBytes = 64 << 20

// The TLS relocation types of each architecture's psABI that matter here.
type tlsRelocs struct{ gd, ie, desc uint32 }

var relocsOf = map[elf.Machine]tlsRelocs{
	elf.EM_X86_64:  {gd: uint32(elf.R_X86_64_DTPMOD64), ie: uint32(elf.R_X86_64_TPOFF64), desc: uint32(elf.R_X86_64_TLSDESC)},
	elf.EM_AARCH64: {gd: uint32(elf.R_AARCH64_TLS_DTPMOD64), ie: uint32(elf.R_AARCH64_TLS_TPREL64), desc: uint32(elf.R_AARCH64_TLSDESC)},
}

// Inspect finds otel_thread_ctx_v1 in f, the main executable when exe.
// found is false when f does not export it.
func Inspect(f *elfx.File, exe bool) (w Where, found bool, err error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		if errors.Is(err, elf.ErrNoSymbols) {
			return w, false, nil
		}
		return w, false, fmt.Errorf("reading .dynsym: %w", err)
	}
	idx := -1
	for i, s := range syms {
		if s.Name == Symbol && elf.ST_TYPE(s.Info) == elf.STT_TLS && s.Section != elf.SHN_UNDEF {
			idx = i
			break
		}
	}
	if idx < 0 {
		return w, false, nil
	}
	rel, ok := relocsOf[f.Machine]
	if !ok || f.Class != elf.ELFCLASS64 {
		return w, true, fmt.Errorf("%s on %s: %w", Symbol, f.Machine, ErrUnsupported)
	}
	val := syms[idx].Value
	if exe {
		var tls *elf.Prog
		for _, p := range f.Progs {
			if p.Type == elf.PT_TLS {
				tls = p
			}
		}
		if tls == nil || val > tls.Memsz || tls.Memsz-val < 8 {
			return w, true, fmt.Errorf("%s at %#x outside the TLS segment", Symbol, val)
		}
		if f.Machine == elf.EM_AARCH64 {
			off, ok := staticOffsetAbove(tls.Align, tls.Vaddr)
			if !ok {
				return w, true, fmt.Errorf("TLS segment aligned %d: %w", tls.Align, ErrUnsupported)
			}
			return Where{How: Static, Offset: off + int64(val), Above: true}, true, nil
		}
		off, ok := staticOffset(tls.Memsz, tls.Align, tls.Vaddr)
		if !ok {
			return w, true, fmt.Errorf("TLS segment of %d bytes aligned %d: %w", tls.Memsz, tls.Align, ErrUnsupported)
		}
		return Where{How: Static, Offset: int64(val) - off}, true, nil
	}
	// debug/elf drops the null symbol: .dynsym index idx+1.
	w, err = relocated(f, rel, uint32(idx+1), val)
	w.Above = f.Machine == elf.EM_AARCH64
	return w, true, err
}

// tcbSize is what arm64's thread pointer points at before the first
// static TLS block: glibc's tcbhead_t (the DTV pointer and a private word).
const tcbSize = 16

// staticOffsetAbove is where the main executable's TLS block starts above
// the thread pointer on arm64 (TLS variant I): after the TCB, aligned,
// keeping the first byte's offset within the alignment as glibc does.
func staticOffsetAbove(align, vaddr uint64) (int64, bool) {
	align = max(align, 1)
	if align&(align-1) != 0 || align > 1<<20 {
		return 0, false
	}
	first := -(vaddr & (align - 1)) & (align - 1)
	off := (tcbSize + align - 1) &^ (align - 1)
	if off-tcbSize < first {
		off += align
	}
	return int64(off - first), true
}

// staticOffset is where the main executable's TLS block starts below the
// thread pointer: glibc places the first module (the executable) so that
// its block ends at the TCB, keeping the segment's alignment and its first
// byte's offset within it (x86-64, TLS variant II).
func staticOffset(memsz, align, vaddr uint64) (int64, bool) {
	align = max(align, 1)
	if align&(align-1) != 0 || memsz > 1<<30 || align > 1<<20 {
		return 0, false
	}
	a := int64(align)
	first := int64(-(vaddr & (align - 1)) & (align - 1))
	// first < align, so the sum below is never negative (glibc computes
	// it in size_t, where it wraps to the same value).
	return (int64(memsz)-first+a-1)/a*a + first, true
}

// relocated finds the dynamic relocation through which a library reaches
// symbol sym (value val), and the GOT place the loader fills.
func relocated(f *elfx.File, rel tlsRelocs, sym uint32, val uint64) (Where, error) {
	dynsym := -1
	for i, s := range f.Sections {
		if s.Type == elf.SHT_DYNSYM {
			dynsym = i
		}
	}
	sawGD := false
	var total uint64
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || int(s.Link) != dynsym { //nolint:misspell // elf.SHT_RELA, the ELF name
			continue
		}
		total += s.Size
		if total > maxRelaBytes {
			return Where{}, fmt.Errorf("relocations over %d bytes", maxRelaBytes)
		}
		data, err := f.SectionData(s.Name)
		if err != nil {
			return Where{}, fmt.Errorf("reading %s: %w", s.Name, err)
		}
		for i := 0; i+24 <= len(data); i += 24 {
			off := binary.LittleEndian.Uint64(data[i:])
			info := binary.LittleEndian.Uint64(data[i+8:])
			add := int64(binary.LittleEndian.Uint64(data[i+16:]))
			rs, typ := uint32(info>>32), uint32(info)
			// A reference to the symbol, or a local one to its value
			// (a library linked -Bsymbolic, or a protected variable).
			if rs != sym && (rs != 0 || uint64(add) != val) {
				continue
			}
			switch typ {
			case rel.desc:
				return Where{How: GOTDescriptor, Slot: off}, nil
			case rel.ie:
				return Where{How: GOTOffset, Slot: off}, nil
			case rel.gd:
				sawGD = rs == sym
			}
		}
	}
	if sawGD {
		return Where{}, fmt.Errorf("%s reached through the general dynamic model: %w", Symbol, ErrUnsupported)
	}
	return Where{}, fmt.Errorf("no relocation of %s: %w", Symbol, ErrUnsupported)
}

// maxStaticTLS bounds a plausible offset into the static TLS block: glibc
// sizes it from the startup modules' blocks plus a small surplus.
const maxStaticTLS = 16 << 20

// Resolve turns what the loader wrote at the file's GOT place (word0, and
// word1 for a descriptor) into the variable's offset from the thread
// pointer: below it on x86-64, above it (past the TCB) on arm64 (w.Above).
// A descriptor whose argument is no such offset was resolved to dynamic
// TLS (a module loaded past the static block's surplus).
func Resolve(w Where, word0, word1 uint64) (int64, error) {
	var off int64
	switch w.How {
	case Static:
		return w.Offset, nil
	case GOTOffset:
		off = int64(word0)
	case GOTDescriptor:
		off = int64(word1)
	default:
		return 0, fmt.Errorf("no place known")
	}
	in := off < 0 && off >= -maxStaticTLS
	if w.Above {
		in = off >= tcbSize && off < maxStaticTLS
	}
	if !in || off%8 != 0 {
		return 0, fmt.Errorf("thread pointer offset %d: not in the static TLS block: %w", off, ErrUnsupported)
	}
	return off, nil
}
