package table

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/gopclntab"
)

// Go code carries no CFI in .eh_frame, but its .gopclntab records, for
// every pc, how far SP is below its value at entry (pcsp). On amd64 the
// return address sits just above that: CFA = SP + delta + 8, RA at CFA-8.
// Functions with a frame save the caller's BP right below the return
// address, at CFA-16, once their prologue has pushed it.

// Functions where Go's traceback itself stops, by name (older tables have
// no TopFrame flag). mcall and morestack run their callee on g0 with the
// goroutine's frame pointer still in BP (newer Go clears it there): a
// walk past them would put g0's scheduler under the goroutine's frames,
// whose pprof labels g0 no longer has (m.curg is nil once schedule drops
// it), where Go's own profiler shows the scheduler alone.
var goTopFrames = [][]byte{
	[]byte("runtime.goexit"), []byte("runtime.rt0_go"), []byte("runtime.mstart"),
	[]byte("runtime.mcall"), []byte("runtime.morestack"),
}

// Go's signal return trampolines (the sa_restorer the runtime installs).
var goSigreturn = [][]byte{[]byte("runtime.sigreturn__sigaction"), []byte("runtime.sigreturn")}

func (b *builder) gopclntab() (*source, error) {
	if len(b.f.Sections) > 0 && b.f.Section(".gopclntab") == nil && b.f.Section(".go.buildinfo") == nil {
		// Not Go: spare the scan for a table that headers would name (Go PIE
		// binaries keep theirs in .data.rel.ro, but have .go.buildinfo).
		return nil, nil
	}
	t, err := gopclntab.New(b.f)
	if err != nil {
		if errors.Is(err, frame.ErrNoDebugInfo) {
			return nil, nil
		}
		return nil, err
	}
	out := b.newSource("gopclntab")
	n := min(t.NumFuncs(), b.max) // NumFuncs is checked against the table's size
	out.segs = make([]seg, 0, n)
	var ferr error
	i := -1 // the function's index: Funcs reports them in table order
	walkErr := t.Funcs(func(fn *gopclntab.Func, name []byte) bool {
		i++
		if !b.inText(fn.Entry, fn.End) {
			b.stats.DroppedFDEs++
			return true
		}
		if len(out.segs) >= b.max {
			ferr = errLimit
			return false
		}
		g := seg{start: fn.Entry, end: fn.End, ref: int32(i)}
		switch {
		case fn.Flag&gopclntab.FuncFlagTopFrame != 0 || oneOf(name, goTopFrames):
			g.kind = KindEnd
		case oneOf(name, goSigreturn):
			g.kind = KindSignal
		case fn.Flag&gopclntab.FuncFlagSPWrite != 0:
			// SP is switched (systemstack, mcall, asmcgocall, gogo): the deltas
			// stop holding partway; frame pointers survive the switch.
			g.kind = KindFallback
		}
		out.segs = append(out.segs, g)
		b.stats.GoFuncs++
		b.stats.FDEs++
		return true
	})
	if ferr != nil {
		return nil, ferr
	}
	b.stats.SourceBytes += t.TableBytes()
	if walkErr != nil {
		if len(out.segs) == 0 {
			return nil, walkErr
		}
		if b.stats.FirstError == "" {
			b.stats.FirstError = walkErr.Error()
		}
	}
	var runs []goRun
	out.gen = func(g *seg, em *emitter) error {
		// Read again rather than kept from the first pass: 32 bytes per
		// function less to hold.
		f, err := t.FuncAt(int(g.ref))
		if err != nil {
			return err
		}
		fn := &f
		runs = runs[:0]
		err = t.SPDeltas(fn, func(pc, end uint64, delta int32) {
			runs = append(runs, goRun{pc, end, delta})
		})
		if err != nil {
			return err
		}
		if len(runs) == 0 {
			return em.row(Row{PC: fn.Entry, Kind: KindFallback})
		}
		return b.goRows(em, runs)
	}
	return out, nil
}

type goRun struct {
	pc, end uint64
	delta   int32
}

func oneOf(name []byte, set [][]byte) bool {
	for _, s := range set {
		if bytes.Equal(name, s) {
			return true
		}
	}
	return false
}

// goRows writes the rows of one function from its SP delta runs.
func (b *builder) goRows(em *emitter, runs []goRun) error {
	if b.f.Machine == elf.EM_AARCH64 {
		return b.goRowsARM64(em, runs)
	}
	saved := b.goFPSavedFrom(runs)
	for _, run := range runs {
		if run.delta < 0 || int64(run.delta)+8 > 1<<31-1 {
			b.stats.Unencodable++
			if err := em.row(Row{PC: run.pc, Kind: KindFallback}); err != nil {
				return err
			}
			continue
		}
		r := Row{PC: run.pc, Kind: KindNormal, CFA: CFASP, CFAOffset: run.delta + 8, RAOffset: -8}
		fp := saved != 0 && run.delta >= 8
		if fp && run.pc < saved && saved < run.end {
			// The save happens inside this run (older prologues store BP
			// after allocating the frame): split it.
			if err := em.row(r); err != nil {
				return err
			}
			r.PC = saved
		} else if fp && run.pc < saved {
			fp = false
		}
		if fp {
			r.FPSaved, r.FPOffset = true, -16
		}
		if err := em.row(r); err != nil {
			return err
		}
		if em.done {
			return nil
		}
	}
	return nil
}

// goFPSavedFrom returns the pc from which the function holds the caller's
// BP at CFA-16, or 0 when it never saves it. The compiler and assembler
// emit one of two prologues, recognised by their bytes so that assembly
// without a frame is not mistaken for one:
//
//	PUSHQ BP; MOVQ SP, BP; SUBQ $n, SP        (Go 1.21+)
//	SUBQ $n, SP; MOVQ BP, n-8(SP); LEAQ ...   (earlier releases)
func (b *builder) goFPSavedFrom(runs []goRun) uint64 {
	for _, run := range runs {
		if run.delta == 0 {
			continue
		}
		// First run with a frame.
		if run.delta == 8 && run.pc > 0 {
			if code := b.code(run.pc-1, 4); code != nil && bytes.Equal(code, []byte{0x55, 0x48, 0x89, 0xe5}) {
				return run.pc
			}
		}
		if code := b.code(run.pc, 8); code != nil && code[0] == 0x48 && code[1] == 0x89 {
			want := run.delta - 8
			switch {
			case code[2] == 0x6c && code[3] == 0x24 && int32(int8(code[4])) == want:
				return run.pc + 5
			case code[2] == 0xac && code[3] == 0x24 &&
				int32(uint32(code[4])|uint32(code[5])<<8|uint32(code[6])<<16|uint32(code[7])<<24) == want:
				return run.pc + 8
			}
		}
		return 0
	}
	return 0
}

// On arm64 the return address is in x30 (LR) at entry, where SP is the
// CFA. A function with a frame stores LR at its new SP and the caller's
// x29 just below it, so with delta = the SP delta:
//
//	STR.W x30, [sp, #-n]!; STUR x29, [sp, #-8]; SUB x29, sp, #8  (small frames)
//	SUB x20, sp, #n; STP x29, x30, [x20, #-8]; MOV sp, x20         (large)
//
// CFA = SP + delta, RA at CFA-delta, FP at CFA-delta-8: a frame record at
// the row's FP offset with the RA above it, as the walker reads arm64 rows.
// With delta 0 the RA is still in LR.

// stur x29, [sp, #-8]
const arm64SturFP = 0xf81f83fd

func (b *builder) goRowsARM64(em *emitter, runs []goRun) error {
	for _, run := range runs {
		if run.delta < 0 || int64(run.delta)+8 > 1<<31-1 {
			b.stats.Unencodable++
			if err := em.row(Row{PC: run.pc, Kind: KindFallback}); err != nil {
				return err
			}
			continue
		}
		r := Row{PC: run.pc, Kind: KindNormal, CFA: CFASP, CFAOffset: run.delta}
		if run.delta > 0 {
			r.RAOffset = -run.delta
			fp := r
			fp.FPSaved, fp.FPOffset = true, -run.delta-8
			// The small-frame prologue saves x29 one instruction after LR.
			if code := b.code(run.pc, 4); code != nil && binary.LittleEndian.Uint32(code) == arm64SturFP && run.pc+4 < run.end {
				if err := em.row(r); err != nil {
					return err
				}
				fp.PC = run.pc + 4
			}
			r = fp
		}
		if err := em.row(r); err != nil {
			return err
		}
		if em.done {
			return nil
		}
	}
	return nil
}
