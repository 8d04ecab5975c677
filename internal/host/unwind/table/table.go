// Package table builds the unwind tables that the eBPF sampler walks to
// unwind native stacks without frame pointers. Build turns the call frame
// information of one ELF file (.eh_frame, located through .eh_frame_hdr when
// section headers are gone; .debug_frame; and Go's .gopclntab pcsp tables)
// into one sorted list of rows. Each row says, for the addresses from its PC
// up to the next row's PC, how to find the canonical frame address (CFA),
// where the return address and the caller's frame pointer were saved, or that
// the frame ends the stack, is a signal frame, or must be unwound with frame
// pointers.
//
// The package only reads bytes: it runs on any OS, and it treats every byte
// of the file as hostile. Lengths, offsets and counts are checked against
// the bytes really present before anything is allocated, rows are capped
// (Options.MaxRows), and a malformed entry costs its own address range (it
// falls back to frame pointers), not the table. See docs/unwinding.md.
package table // import "github.com/profsym/profsym/internal/host/unwind/table"

import (
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// CFARule says how the canonical frame address is computed.
type CFARule uint8

const (
	CFAUndefined CFARule = iota // no encodable rule: unwind this frame with frame pointers
	CFASP                       // CFA = SP + CFAOffset
	CFAFP                       // CFA = FP + CFAOffset (rbp on x86-64, x29 on arm64)
	CFAPLT                      // x86-64 PLT entries: CFA = SP + 8 + ((PC & 15) >= 11 ? 8 : 0)
	// CFAReg: CFA = register CFARegister (DWARF number) + CFAOffset, as in
	// OpenSSL's assembly (rax, rsi, r11 hold the entry SP while the stack is
	// realigned). Only the innermost frame has that register (the sampler
	// reads every register there); further out the frame falls back to
	// frame pointers.
	CFAReg
	// CFASPDeref, CFAFPDeref: CFA = *(SP or FP + CFAOffset) + CFAAdd, the
	// entry SP saved in a realigned frame (OpenSSL's assembly, gcc's
	// stack realignment).
	CFASPDeref
	CFAFPDeref
)

// Kind classifies a row.
type Kind uint8

const (
	KindNormal   Kind = iota
	KindEnd           // outermost frame (RA undefined: _start, clone/thread_start): stack ends cleanly here
	KindSignal        // signal trampoline (__restore_rt): caller regs come from the sigframe's ucontext at SP
	KindFallback      // no CFI covers the address, or its CFI cannot be encoded: use frame pointers
)

// Row is the unwind rule for the addresses from PC up to the next row's PC.
// Only KindNormal rows use the other fields; the rest leave them zero so
// that neighbouring rows of the same kind merge.
type Row struct {
	PC        uint64 // first ELF virtual address covered; a row covers [PC, next row's PC)
	Kind      Kind
	CFA       CFARule
	CFAOffset int32
	// CFARegister is the DWARF register of a CFAReg rule.
	CFARegister uint8
	// CFAAdd is what a CFASPDeref or CFAFPDeref rule adds after the load.
	CFAAdd   int32
	FPSaved  bool // the caller's FP is saved at CFA+FPOffset; false: FP unchanged in this frame
	FPOffset int32
	// RAOffset: the return address is saved at CFA+RAOffset (always -8 on
	// x86-64); 0 says it is still in the link register (arm64's x30: at a
	// function's entry, in leaf functions), known for the innermost frame
	// only.
	RAOffset int32
}

// sameRule reports whether two rows unwind alike (their PCs aside).
func (r *Row) sameRule(o *Row) bool {
	return r.Kind == o.Kind && r.CFA == o.CFA && r.CFAOffset == o.CFAOffset && r.CFARegister == o.CFARegister && r.CFAAdd == o.CFAAdd &&
		r.FPSaved == o.FPSaved && r.FPOffset == o.FPOffset && r.RAOffset == o.RAOffset
}

// Table is the unwind table of one ELF file.
type Table struct {
	Arch   elf.Machine // EM_X86_64 or EM_AARCH64
	Source string      // "eh_frame", "debug_frame", "gopclntab", or a "+"-joined combination
	// Rows are sorted by PC; adjacent identical rows are merged; gaps between
	// covered ranges are KindFallback rows, and a KindFallback row ends the
	// last range. Addresses below Rows[0].PC are not covered either.
	Rows  []Row
	Stats Stats
}

// Stats counts what went into a table and what fell back, for telemetry and
// for the docs' figures.
type Stats struct {
	FDEs        int // FDEs (and Go functions) that produced rows
	BadFDEs     int // FDEs whose instructions or CIE were malformed: their range falls back
	DroppedFDEs int // FDEs outside the executable segments, empty, or overlapping an earlier one
	GoFuncs     int // Go functions that produced rows
	// Unencodable counts rows whose rules the table cannot express (CFA from
	// an expression or a register the sampler does not keep, RA in a
	// register): they became KindFallback.
	Unencodable int
	// RegisterCFA counts rows with a CFAReg rule.
	RegisterCFA int
	// SourceBytes is the size of the CFI sections and Go tables read.
	SourceBytes int
	// FirstError describes the first malformed entry, empty when none.
	FirstError string
}

// Options bound a build.
type Options struct {
	MaxRows int // refuse (error wrapping frame.ErrLimitExceeded) tables larger than this; 0 = default (e.g. 4M)
}

// DefaultMaxRows bounds a table when Options.MaxRows is zero: 4M rows is
// 128 MiB of Rows in Go, several times what the largest shared libraries
// produce.
const DefaultMaxRows = 4 << 20

var (
	// ErrUnsupportedArch is returned for machines the unwinder does not know.
	ErrUnsupportedArch = errors.New("unwind table: unsupported architecture")
	// ErrNoUnwindInfo: the file has no CFI and no Go tables; unwind it with
	// frame pointers. It wraps frame.ErrNoDebugInfo.
	ErrNoUnwindInfo = fmt.Errorf("unwind table: no .eh_frame, .debug_frame or .gopclntab: %w", frame.ErrNoDebugInfo)
)

// Build reads the unwind information of f and returns its table. A file
// with none returns ErrNoUnwindInfo; a table that would exceed
// opt.MaxRows returns an error wrapping frame.ErrLimitExceeded. Malformed
// entries do not fail the build: their addresses fall back to frame
// pointers and Stats counts them. Only when every source is unusable does
// Build return an error wrapping frame.ErrCorruptFile.
func Build(f *elfx.File, opt Options) (*Table, error) {
	var rows []Row
	info, err := Stream(f, opt, func(batch []Row) error {
		rows = append(rows, batch...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Table{Arch: info.Arch, Source: info.Source, Rows: slices.Clip(rows), Stats: info.Stats}, nil
}

// Sink takes a table's rows in address order, a batch at a time (the
// slice is the builder's: it is valid only during the call), each row final
// when it is handed over (Table.Rows says what they mean). An error stops
// the build, and Stream returns it.
type Sink func([]Row) error

// Info describes a streamed table: what Table holds besides its rows.
type Info struct {
	Arch   elf.Machine
	Source string
	Rows   int // rows handed to the sink
	Stats  Stats
}

// Stream builds f's table as Build does, but hands each row to sink as soon
// as it is final instead of collecting them: the build then holds only the
// index of its sources' entries (about 24 bytes per FDE or Go function,
// twice while sources are merged) and the rows of the entry being read.
// On error the sink may have been given part of the table.
func Stream(f *elfx.File, opt Options, sink Sink) (Info, error) {
	b, err := newBuilder(f, opt)
	if err != nil {
		return Info{}, err
	}
	return b.build(sink)
}

// Lookup returns the row covering pc, and false when pc lies below the
// first row (uncovered, like a KindFallback row).
func (t *Table) Lookup(pc uint64) (Row, bool) {
	i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].PC > pc })
	if i == 0 {
		return Row{}, false
	}
	return t.Rows[i-1], true
}

// SizeBytes is the heap the table's rows hold.
func (t *Table) SizeBytes() int64 { return int64(cap(t.Rows)) * rowBytes }

const rowBytes = 32 // unsafe.Sizeof(Row{})

// x86CFARegs are the x86-64 DWARF registers a CFAReg rule may use, by
// their code in the BPF row (bits 5-7 of its info; 0 is none): rax, rdx,
// rsi, rdi, r9, r10, r11, the ones OpenSSL's and glibc's assembly and gcc's
// stack realignment base their CFA on. bpf/unwind.h reads the same
// registers, in the same order, into unwind_state.regs.
var x86CFARegs = [8]uint8{0xff, 0, 1, 4, 5, 9, 10, 11}

// X86CFARegCode returns the BPF code of x86-64 DWARF register r, or 0 when
// a CFAReg rule cannot use it.
func X86CFARegCode(r uint64) uint8 {
	for c := uint8(1); c < uint8(len(x86CFARegs)); c++ {
		if uint64(x86CFARegs[c]) == r {
			return c
		}
	}
	return 0
}

// X86CFARegister reports whether a CFAReg rule may use x86-64 DWARF
// register r.
func X86CFARegister(r uint64) bool { return X86CFARegCode(r) != 0 }
