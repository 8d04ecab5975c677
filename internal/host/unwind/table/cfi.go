package table

import (
	"fmt"
	"math"
	"math/bits"
)

// Call frame information: the CIE/FDE records of .eh_frame and .debug_frame
// (DWARF 5 §6.4; the LSB's .eh_frame chapter for the GNU variant), turned
// into rows as the records are read. Nothing here allocates per FDE.

// DW_CFA_* opcodes.
const (
	cfaNop              = 0x00
	cfaSetLoc           = 0x01
	cfaAdvanceLoc1      = 0x02
	cfaAdvanceLoc2      = 0x03
	cfaAdvanceLoc4      = 0x04
	cfaOffsetExtended   = 0x05
	cfaRestoreExtended  = 0x06
	cfaUndefined        = 0x07
	cfaSameValue        = 0x08
	cfaRegister         = 0x09
	cfaRememberState    = 0x0a
	cfaRestoreState     = 0x0b
	cfaDefCFA           = 0x0c
	cfaDefCFARegister   = 0x0d
	cfaDefCFAOffset     = 0x0e
	cfaDefCFAExpression = 0x0f
	cfaExpression       = 0x10
	cfaOffsetExtendedSF = 0x11
	cfaDefCFASF         = 0x12
	cfaDefCFAOffsetSF   = 0x13
	cfaValOffset        = 0x14
	cfaValOffsetSF      = 0x15
	cfaValExpression    = 0x16
	cfaMIPSAdvanceLoc8  = 0x1d
	cfaGNUWindowSave    = 0x2d // AArch64: DW_CFA_AARCH64_negate_ra_state
	cfaGNUArgsSize      = 0x2e
	cfaGNUNegOffsetExt  = 0x2f
)

// Bounds for hostile input. Real CIEs have augmentation strings of a few
// letters and FDE programs remember a handful of states.
const (
	maxAugString = 16
	maxRemember  = 64
	maxCodeAlign = 1 << 16
	// maxCIEs bounds the CIEs kept: real files have one per object file
	// with a personality routine, a few thousand at most.
	maxCIEs = 1 << 16
)

var tooManyCIEs = &cie{err: fmt.Errorf("more than %d CIEs", maxCIEs)}

// Register rules, reduced to what the unwinder uses.
type ruleKind uint8

const (
	ruleSame      ruleKind = iota // unspecified or same value: unchanged in this frame
	ruleUndef                     // undefined
	ruleOffset                    // saved at CFA+off
	ruleValOffset                 // the value is CFA+off
	ruleRegister                  // held in another register
	ruleExpr                      // saved at an address an expression computes
	ruleValExpr                   // the value is an expression
)

type rule struct {
	kind ruleKind
	off  int64
}

type cfaKind uint8

const (
	cfaRegOff   cfaKind = iota // register + offset
	cfaPLT                     // the standard x86-64 PLT expression
	cfaDeref                   // *(SP or FP + exprOff) + exprAdd (OpenSSL, gcc's realigned stacks)
	cfaOtherExp                // any other expression
)

// state is the CFA program's register state for the registers that matter.
type state struct {
	cfa    cfaKind
	cfaReg uint64
	cfaOff int64
	// exprReg, exprOff, exprAdd: a cfaDeref rule's register and constants,
	// apart from cfaReg/cfaOff, which def_cfa_offset may still set.
	exprReg          uint64
	exprOff, exprAdd int64
	fp, ra           rule
}

// cie is a parsed Common Information Entry.
type cie struct {
	err       error
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	ptrEnc    uint8
	ptrSize   int
	hasAug    bool // 'z': FDEs carry augmentation data
	signal    bool // 'S'
	init      state
}

// archRegs names the DWARF registers of a machine that the rows speak of.
type archRegs struct {
	fp, sp uint64
	// lr: the return address may stay in its register (arm64's x30, the
	// link register): a "same value" rule for it is a row with RAOffset 0.
	lr bool
	// cfa reports whether a CFA rule may be based on register r (CFAReg):
	// the registers the sampler keeps for the innermost frame.
	cfa func(r uint64) bool
}

// cfiParser turns one CFI section into rows.
type cfiParser struct {
	sec   *section
	regs  archRegs
	out   *source
	cies  map[int]*cie
	stack [maxRemember]state
	// maxSegs bounds the FDEs read (fdes counts them).
	maxSegs, fdes int
	// sigreturn reports whether [start, end) holds a known rt_sigreturn
	// trampoline (for FDEs without the 'S' augmentation).
	sigreturn func(start, end uint64) bool
	// inText reports whether [start, end) lies in executable code.
	inText func(start, end uint64) bool
	// drop is File.DropPages, called every dropEvery FDEs.
	drop func()
}

// walk reads every entry in order. It returns the offset it stopped at and
// the framing error that stopped it (nil at the section end or terminator).
func (p *cfiParser) walk() (int, error) {
	off := 0
	for off < len(p.sec.data) {
		e, err := p.sec.entryAt(off)
		if err == errTerminator {
			return len(p.sec.data), nil
		}
		if err != nil {
			return off, err
		}
		if !e.isCIE {
			if err := p.fde(e); err != nil {
				return off, err
			}
		}
		off = e.end
	}
	return off, nil
}

// fdeAt reads the FDE at off (from .eh_frame_hdr's index).
func (p *cfiParser) fdeAt(off int) error {
	e, err := p.sec.entryAt(off)
	if err != nil {
		if err == errTerminator {
			return fmt.Errorf("%s+%#x: index points at the terminator", p.sec.name, off)
		}
		return err
	}
	if e.isCIE {
		return fmt.Errorf("%s+%#x: index points at a CIE", p.sec.name, off)
	}
	return p.fde(e)
}

func (p *cfiParser) note(err error) {
	if p.out.stats.FirstError == "" {
		p.out.stats.FirstError = err.Error()
	}
}

// cieAt parses (once) the CIE at off.
func (p *cfiParser) cieAt(off int) *cie {
	if c, ok := p.cies[off]; ok {
		return c
	}
	if len(p.cies) >= maxCIEs {
		return tooManyCIEs
	}
	c := p.parseCIE(off)
	p.cies[off] = c
	return c
}

func (p *cfiParser) parseCIE(off int) *cie {
	s := p.sec
	c := &cie{ptrEnc: peAbsptr, ptrSize: s.ptrSize}
	e, err := s.entryAt(off)
	if err != nil || !e.isCIE {
		if err == nil || err == errTerminator {
			err = fmt.Errorf("%s+%#x: FDE's CIE pointer does not lead to a CIE", s.name, off)
		}
		c.err = err
		return c
	}
	r := reader{b: s.data[:e.end], off: e.body, big: s.big}
	bad := func(format string, args ...any) *cie {
		c.err = fmt.Errorf("%s: CIE at %#x: "+format, append([]any{s.name, off}, args...)...)
		return c
	}
	version := r.u8()
	if version != 1 && version != 3 && version != 4 {
		return bad("version %d", version)
	}
	aug := r.cstring(maxAugString)
	if r.bad {
		return bad("augmentation string unterminated or too long")
	}
	if len(aug) >= 2 && aug[0] == 'e' && aug[1] == 'h' {
		// GCC 2 "eh": a pointer to exception data follows the string.
		r.take(s.ptrSize)
		aug = aug[2:]
	}
	if version == 4 {
		as, ss := r.u8(), r.u8()
		if (as != 4 && as != 8) || ss != 0 {
			return bad("address size %d, segment selector size %d", as, ss)
		}
		c.ptrSize = int(as)
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.raReg = uint64(r.u8())
	} else {
		c.raReg = r.uleb()
	}
	if r.bad {
		return bad("truncated header")
	}
	if c.codeAlign == 0 || c.codeAlign > maxCodeAlign {
		return bad("code alignment factor %d", c.codeAlign)
	}
	if c.dataAlign < -(1<<16) || c.dataAlign > 1<<16 {
		return bad("data alignment factor %d", c.dataAlign)
	}
	if len(aug) > 0 && aug[0] != 'z' {
		// Without 'z' there is no augmentation data, so only letters that
		// carry none can be understood (assemblers write a bare "S" for
		// signal frames in .debug_frame).
		for _, ch := range aug {
			switch ch {
			case 'S':
				c.signal = true
			case 'B', 'G':
			default:
				return bad("augmentation %q", aug)
			}
		}
		aug = nil
	}
	if len(aug) > 0 {
		n := r.uleb()
		if r.bad || n > uint64(r.left()) {
			return bad("augmentation data of %d bytes past the entry end", n)
		}
		ar := reader{b: r.take(int(n)), big: s.big}
		c.hasAug = true
		sub := *s
		sub.addr = s.addr + uint64(r.off-int(n)) // aligned/pcrel bases inside the data
		for _, ch := range aug[1:] {
			switch ch {
			case 'R':
				c.ptrEnc = ar.u8()
			case 'L':
				ar.u8()
			case 'P':
				enc := ar.u8()
				if err := sub.skipPtr(&ar, enc); err != nil {
					return bad("personality: %v", err)
				}
			case 'S':
				c.signal = true
			case 'B', 'G':
				// AArch64 pointer-authentication key B and MTE tagged frames:
				// no data.
			default:
				return bad("augmentation %q", aug)
			}
			if ar.bad {
				return bad("augmentation data truncated")
			}
		}
	}
	// The initial instructions give every FDE its starting state; DW_CFA_restore
	// inside them returns to "unspecified".
	c.init = state{cfa: cfaRegOff, cfaReg: p.regs.sp}
	if err := p.run(c, r.off, e.end, &c.init, 0, 0, nil); err != nil {
		return bad("initial instructions: %v", err)
	}
	return c
}

// fdeHdr is a decoded FDE header.
type fdeHdr struct {
	c          *cie
	start, end uint64
	prog, stop int // section offsets of the instructions
}

// header decodes an FDE's header. With count set (the indexing pass) it
// counts and notes what is wrong; errors here cost only the entry.
func (p *cfiParser) header(e entry, count bool) (fdeHdr, bool) {
	s := p.sec
	st := p.out.stats
	fail := func(err error) (fdeHdr, bool) {
		if count {
			st.BadFDEs++
			p.note(err)
		}
		return fdeHdr{}, false
	}
	c := p.cieAt(e.ciePtr)
	if c.err != nil {
		// Without the CIE the FDE's address cannot even be decoded.
		return fail(c.err)
	}
	r := reader{b: s.data[:e.end], off: e.body, big: s.big}
	sub := *s
	sub.ptrSize = c.ptrSize
	start, err := sub.readPtr(&r, c.ptrEnc)
	if err != nil {
		return fail(fmt.Errorf("%s: FDE at %#x: address: %v", s.name, e.off, err))
	}
	length, err := sub.readPtr(&r, c.ptrEnc&0x0f)
	if err != nil {
		return fail(fmt.Errorf("%s: FDE at %#x: range: %v", s.name, e.off, err))
	}
	if c.hasAug {
		n := r.uleb()
		if r.bad || n > uint64(r.left()) {
			return fail(fmt.Errorf("%s: FDE at %#x: augmentation data of %d bytes past the entry end", s.name, e.off, n))
		}
		r.take(int(n))
	}
	end := start + length
	if length == 0 || end < start || !p.inText(start, end) {
		// Zero-length entries, and entries the linker left for discarded
		// code (address 0 in .debug_frame), describe nothing we run.
		if count {
			st.DroppedFDEs++
		}
		return fdeHdr{}, false
	}
	return fdeHdr{c: c, start: start, end: end, prog: r.off, stop: e.end}, true
}

// fde indexes one FDE (pass 1): its range, and where to find it again
// when its rows are written (pass 2, rows). Signal frames need no program.
func (p *cfiParser) fde(e entry) error {
	// Every FDE, usable or not, counts: a table cannot have fewer rows
	// than FDEs, and a flood of broken ones must not cost unbounded time.
	if p.fdes++; p.fdes > p.maxSegs {
		return errLimit
	}
	if p.drop != nil && p.fdes%dropEvery == 0 {
		p.drop()
	}
	h, ok := p.header(e, true)
	if !ok {
		return nil
	}
	g := seg{start: h.start, end: h.end, ref: int32(e.off)}
	if h.c.signal || (p.sigreturn != nil && p.sigreturn(h.start, h.end)) {
		g.kind = KindSignal
	}
	p.out.segs = append(p.out.segs, g)
	p.out.stats.FDEs++
	return nil
}

// rows runs the program of the FDE at g.ref and writes its rows (pass 2).
func (p *cfiParser) rows(g *seg, em *emitter) error {
	e, err := p.sec.entryAt(int(g.ref))
	if err != nil {
		return err
	}
	h, ok := p.header(e, false)
	if !ok {
		return fmt.Errorf("%s: FDE at %#x changed", p.sec.name, g.ref)
	}
	st := h.c.init
	return p.run(h.c, h.prog, h.stop, &st, h.start, h.end, em)
}

// run executes the CFA program at section offsets [lo, hi). For an FDE it
// writes a row to em each time the location advances, starting at start
// and stopping at end or when em has all it needs; for a CIE's initial
// instructions (em nil) it only updates st.
func (p *cfiParser) run(c *cie, lo, hi int, st *state, start, end uint64, em *emitter) error {
	cieInit := em == nil
	r := reader{b: p.sec.data[:hi], off: lo, big: p.sec.big}
	loc := start
	depth := 0
	flush := func() error {
		row := p.row(st)
		row.PC = loc
		return em.row(row)
	}
	advance := func(delta uint64) (bool, error) {
		if cieInit {
			return false, fmt.Errorf("advance in CIE instructions")
		}
		hi, d := bits.Mul64(delta, c.codeAlign)
		next := loc + d
		if hi != 0 || next < loc {
			return false, fmt.Errorf("location overflows")
		}
		if next == loc {
			return false, nil
		}
		if err := flush(); err != nil {
			return false, err
		}
		loc = next
		return loc >= end || em.done, nil
	}
	setRule := func(reg uint64, ru rule) {
		switch reg {
		case p.regs.fp:
			st.fp = ru
		case c.raReg:
			st.ra = ru
		}
	}
	for r.left() > 0 {
		op := r.u8()
		var done bool
		var err error
		switch op >> 6 {
		case 1:
			done, err = advance(uint64(op & 0x3f))
		case 2:
			off := int64(r.uleb()) * c.dataAlign
			setRule(uint64(op&0x3f), rule{kind: ruleOffset, off: off})
		case 3:
			p.restore(c, st, uint64(op&0x3f), cieInit)
		default:
			switch op {
			case cfaNop:
			case cfaSetLoc:
				if cieInit {
					return fmt.Errorf("set_loc in CIE instructions")
				}
				sub := *p.sec
				sub.ptrSize = c.ptrSize
				v, perr := sub.readPtr(&r, c.ptrEnc)
				if perr != nil {
					return perr
				}
				if v < loc {
					return fmt.Errorf("set_loc moves backwards")
				}
				// set_loc is an advance in bytes, not code alignment units.
				if v > loc {
					if err := flush(); err != nil {
						return err
					}
					loc = v
					done = loc >= end || em.done
				}
			case cfaAdvanceLoc1:
				done, err = advance(uint64(r.u8()))
			case cfaAdvanceLoc2:
				done, err = advance(uint64(r.u16()))
			case cfaAdvanceLoc4:
				done, err = advance(uint64(r.u32()))
			case cfaMIPSAdvanceLoc8:
				done, err = advance(r.u64())
			case cfaOffsetExtended:
				reg := r.uleb()
				setRule(reg, rule{kind: ruleOffset, off: int64(r.uleb()) * c.dataAlign})
			case cfaOffsetExtendedSF:
				reg := r.uleb()
				setRule(reg, rule{kind: ruleOffset, off: r.sleb() * c.dataAlign})
			case cfaGNUNegOffsetExt:
				reg := r.uleb()
				setRule(reg, rule{kind: ruleOffset, off: -int64(r.uleb()) * c.dataAlign})
			case cfaValOffset:
				reg := r.uleb()
				setRule(reg, rule{kind: ruleValOffset, off: int64(r.uleb()) * c.dataAlign})
			case cfaValOffsetSF:
				reg := r.uleb()
				setRule(reg, rule{kind: ruleValOffset, off: r.sleb() * c.dataAlign})
			case cfaRestoreExtended:
				p.restore(c, st, r.uleb(), cieInit)
			case cfaUndefined:
				setRule(r.uleb(), rule{kind: ruleUndef})
			case cfaSameValue:
				setRule(r.uleb(), rule{kind: ruleSame})
			case cfaRegister:
				reg := r.uleb()
				r.uleb()
				setRule(reg, rule{kind: ruleRegister})
			case cfaRememberState:
				if depth == maxRemember {
					return fmt.Errorf("remember_state nested deeper than %d", maxRemember)
				}
				p.stack[depth] = *st
				depth++
			case cfaRestoreState:
				if depth == 0 {
					return fmt.Errorf("restore_state without remember_state")
				}
				depth--
				*st = p.stack[depth]
			case cfaDefCFA:
				st.cfa, st.cfaReg, st.cfaOff = cfaRegOff, r.uleb(), int64(r.uleb())
			case cfaDefCFASF:
				st.cfa, st.cfaReg = cfaRegOff, r.uleb()
				st.cfaOff = r.sleb() * c.dataAlign
			case cfaDefCFARegister:
				if st.cfa != cfaRegOff {
					st.cfa, st.cfaOff = cfaRegOff, 0
				}
				st.cfaReg = r.uleb()
			case cfaDefCFAOffset:
				st.cfaOff = int64(r.uleb())
			case cfaDefCFAOffsetSF:
				st.cfaOff = r.sleb() * c.dataAlign
			case cfaDefCFAExpression:
				st.cfa, st.exprReg, st.exprOff, st.exprAdd = classifyCFAExpr(p.block(&r), p.regs, c.raReg)
			case cfaExpression:
				reg := r.uleb()
				p.block(&r)
				setRule(reg, rule{kind: ruleExpr})
			case cfaValExpression:
				reg := r.uleb()
				p.block(&r)
				setRule(reg, rule{kind: ruleValExpr})
			case cfaGNUArgsSize:
				r.uleb()
			case cfaGNUWindowSave:
			default:
				return fmt.Errorf("unknown opcode %#x", op)
			}
		}
		if err != nil {
			return err
		}
		if r.bad {
			return errTruncated
		}
		if done {
			return nil
		}
	}
	if !cieInit && loc < end {
		return flush()
	}
	return nil
}

// block reads a DW_FORM_block (uleb length, then bytes).
func (p *cfiParser) block(r *reader) []byte {
	n := r.uleb()
	if n > uint64(r.left()) {
		r.fail()
		return nil
	}
	return r.take(int(n))
}

// restore resets reg to its rule in the CIE's initial state.
func (p *cfiParser) restore(c *cie, st *state, reg uint64, cieInit bool) {
	init := state{}
	if !cieInit {
		init = c.init
	}
	switch reg {
	case p.regs.fp:
		st.fp = init.fp
	case c.raReg:
		st.ra = init.ra
	}
}

// row converts a state to a row (PC unset). Rules the table cannot express
// become KindFallback.
func (p *cfiParser) row(st *state) Row {
	if st.ra.kind == ruleUndef {
		return Row{Kind: KindEnd}
	}
	fb := func() Row {
		p.out.stats.Unencodable++
		return Row{Kind: KindFallback}
	}
	r := Row{Kind: KindNormal}
	switch {
	case st.ra.kind == ruleOffset && fits32(st.ra.off) && st.ra.off != 0:
		r.RAOffset = int32(st.ra.off)
	case st.ra.kind == ruleSame && p.regs.lr:
		// RAOffset 0: still in the link register.
	default:
		return fb()
	}
	switch {
	case st.cfa == cfaPLT:
		r.CFA = CFAPLT
	case st.cfa == cfaDeref:
		if !fits32(st.exprOff) || !fits32(st.exprAdd) {
			return fb()
		}
		r.CFA, r.CFAOffset, r.CFAAdd = CFASPDeref, int32(st.exprOff), int32(st.exprAdd)
		if st.exprReg == p.regs.fp {
			r.CFA = CFAFPDeref
		}
	case st.cfa != cfaRegOff || !fits32(st.cfaOff):
		return fb()
	case st.cfaReg == p.regs.sp:
		r.CFA, r.CFAOffset = CFASP, int32(st.cfaOff)
	case st.cfaReg == p.regs.fp:
		r.CFA, r.CFAOffset = CFAFP, int32(st.cfaOff)
	case p.regs.cfa != nil && p.regs.cfa(st.cfaReg):
		r.CFA, r.CFAOffset, r.CFARegister = CFAReg, int32(st.cfaOff), uint8(st.cfaReg)
		p.out.stats.RegisterCFA++
	default:
		return fb()
	}
	switch st.fp.kind {
	case ruleSame, ruleUndef:
	case ruleOffset:
		if !fits32(st.fp.off) {
			return fb()
		}
		r.FPSaved, r.FPOffset = true, int32(st.fp.off)
	default:
		return fb()
	}
	return r
}

func fits32(v int64) bool { return v >= math.MinInt32 && v <= math.MaxInt32 }
