package dwarf

// dieAttrs holds the attributes of one DIE that symbolization needs.
// Strings alias section bytes; they are copied only when kept.
type dieAttrs struct {
	tag uint16

	name, linkage       []byte
	hasName, hasLinkage bool
	mipsLinkage         bool // DW_AT_MIPS_linkage_name wins over DW_AT_linkage_name, as in llvm

	low, high       uint64
	hasLow, hasHigh bool
	highIsAddr      bool
	ranges          uint64
	rangesForm      uint16
	hasRanges       bool

	ao, spec       uint64 // absolute .debug_info offsets
	hasAO, hasSpec bool

	declFile, declLine       uint64
	hasDeclFile, hasDeclLine bool
	callFile, callLine       uint64
	callCol, disc            uint64

	compDir    []byte
	hasCompDir bool
	dwoName    []byte
	hasDWOName bool
	stmtList   uint64
	hasStmt    bool
}

// decodeAttrs reads the attributes of one DIE whose abbreviation is a,
// with b positioned just after the abbreviation code.
func (t *Table) decodeAttrs(b *buf, a *abbrev, u *unit, h *unitHead, d *dieAttrs) error {
	*d = dieAttrs{tag: a.tag}
	for i := range a.attrs {
		s := &a.attrs[i]
		form := s.form
		if form == formIndirect {
			f := b.uleb()
			if f > 0xffff || f == formIndirect {
				b.fail()
				break
			}
			form = uint16(f)
		}
		switch s.at {
		case atName:
			d.name, d.hasName = t.readString(b, u.shape, h, form)
		case atLinkageName:
			if !d.mipsLinkage {
				d.linkage, d.hasLinkage = t.readString(b, u.shape, h, form)
			} else {
				u.shape.skipForm(b, form)
			}
		case atMIPSLinkageName:
			if l, ok := t.readString(b, u.shape, h, form); ok {
				d.linkage, d.hasLinkage, d.mipsLinkage = l, true, true
			}
		case atLowPC:
			d.low, d.hasLow = t.readAddress(b, u, h, form)
		case atHighPC:
			switch form {
			case formAddr, formAddrx, formAddrx1, formAddrx2, formAddrx3, formAddrx4, formGNUAddrIndex:
				d.high, d.hasHigh = t.readAddress(b, u, h, form)
				d.highIsAddr = true
			default:
				d.high, d.hasHigh = t.readUnsigned(b, u.shape, form, s.implicit), true
			}
		case atRanges:
			if form == formRnglistx {
				d.ranges = b.uleb()
			} else {
				d.ranges = t.readUnsigned(b, u.shape, form, s.implicit)
			}
			d.rangesForm, d.hasRanges = form, true
		case atAbstractOrigin:
			d.ao, d.hasAO = t.readRef(b, u, form)
		case atSpecification:
			d.spec, d.hasSpec = t.readRef(b, u, form)
		case atDeclFile:
			d.declFile, d.hasDeclFile = t.readUnsigned(b, u.shape, form, s.implicit), true
		case atDeclLine:
			d.declLine, d.hasDeclLine = t.readUnsigned(b, u.shape, form, s.implicit), true
		case atCallFile:
			d.callFile = t.readUnsigned(b, u.shape, form, s.implicit)
		case atCallLine:
			d.callLine = t.readUnsigned(b, u.shape, form, s.implicit)
		case atCallColumn:
			d.callCol = t.readUnsigned(b, u.shape, form, s.implicit)
		case atGNUDiscriminator:
			d.disc = t.readUnsigned(b, u.shape, form, s.implicit)
		case atCompDir:
			d.compDir, d.hasCompDir = t.readString(b, u.shape, h, form)
		case atDWOName, atGNUDWOName:
			d.dwoName, d.hasDWOName = t.readString(b, u.shape, h, form)
		case atStmtList:
			d.stmtList, d.hasStmt = t.readUnsigned(b, u.shape, form, s.implicit), true
		default:
			u.shape.skipForm(b, form)
		}
	}
	if b.err != nil {
		return corruptf("unit at %#x: DIE attributes run off the unit", u.off)
	}
	return nil
}

// readString decodes a string-class form. Strings that cannot be found
// (supplementary files, bad offsets) read as absent, as in llvm.
func (t *Table) readString(b *buf, shape unitShape, h *unitHead, form uint16) ([]byte, bool) {
	var off uint64
	switch form {
	case formString:
		s := b.cstr()
		return s, b.err == nil
	case formStrp:
		return cstrAt(t.sec.str, b.uN(int(shape.offSize)))
	case formLineStrp:
		return cstrAt(t.sec.lineStr, b.uN(int(shape.offSize)))
	case formGNUStrpAlt, formStrpSup:
		// In the supplementary (dwz common) file; absent without it.
		off := b.uN(int(shape.offSize))
		if t.sup == nil {
			return nil, false
		}
		return cstrAt(t.sup.sec.str, off)
	case formStrx, formGNUStrIndex:
		off = b.uleb()
	case formStrx1:
		off = uint64(b.u8())
	case formStrx2:
		off = uint64(b.u16())
	case formStrx3:
		off = uint64(b.u24())
	case formStrx4:
		off = uint64(b.u32())
	default:
		shape.skipForm(b, form)
		return nil, false
	}
	if h == nil {
		return nil, false
	}
	sz := uint64(shape.offSize)
	p := h.strOffBase + off*sz
	if off > 1<<40 || p < h.strOffBase || p+sz > uint64(len(t.sec.strOffsets)) {
		return nil, false
	}
	sb := buf{data: t.sec.strOffsets, off: int(p)}
	return cstrAt(t.sec.str, sb.uN(int(sz)))
}

// readAddress decodes an address-class form.
func (t *Table) readAddress(b *buf, u *unit, h *unitHead, form uint16) (uint64, bool) {
	var idx uint64
	switch form {
	case formAddr:
		return b.uN(int(u.shape.addrSize)), true
	case formAddrx, formGNUAddrIndex:
		idx = b.uleb()
	case formAddrx1:
		idx = uint64(b.u8())
	case formAddrx2:
		idx = uint64(b.u16())
	case formAddrx3:
		idx = uint64(b.u24())
	case formAddrx4:
		idx = uint64(b.u32())
	default:
		u.shape.skipForm(b, form)
		return 0, false
	}
	if h == nil {
		return 0, false
	}
	return t.addrIndex(u, h, idx)
}

// addrIndex reads entry idx of the unit's .debug_addr table.
func (t *Table) addrIndex(u *unit, h *unitHead, idx uint64) (uint64, bool) {
	sz := uint64(u.shape.addrSize)
	p := h.addrBase + idx*sz
	if idx > 1<<40 || p < h.addrBase || p+sz > uint64(len(t.sec.addr)) {
		return 0, false
	}
	ab := buf{data: t.sec.addr, off: int(p)}
	return ab.uN(int(sz)), true
}

// supRef marks a reference into the supplementary file's .debug_info.
const supRef = 1 << 63

// readRef decodes a reference form to an absolute .debug_info offset, with
// supRef set for one into the supplementary (dwz common) file. Type
// signatures, and supplementary references without that file, read as
// absent.
func (t *Table) readRef(b *buf, u *unit, form uint16) (uint64, bool) {
	var v uint64
	switch form {
	case formGNURefAlt, formRefSup4, formRefSup8:
		switch form {
		case formRefSup4:
			v = uint64(b.u32())
		case formRefSup8:
			v = b.u64()
		default:
			v = b.uN(int(u.shape.offSize))
		}
		if t.sup == nil || v >= supRef {
			return 0, false
		}
		return v | supRef, true
	case formRef1:
		v = uint64(b.u8())
	case formRef2:
		v = uint64(b.u16())
	case formRef4:
		v = uint64(b.u32())
	case formRef8:
		v = b.u64()
	case formRefUdata:
		v = b.uleb()
	case formRefAddr:
		n := int(u.shape.offSize)
		if u.shape.version <= 2 {
			n = int(u.shape.addrSize)
		}
		v = b.uN(n)
		return v, v < supRef
	default:
		u.shape.skipForm(b, form)
		return 0, false
	}
	if u.off+v < u.off || u.off+v >= supRef {
		return 0, false
	}
	return u.off + v, true
}

// readDIE decodes the DIE at absolute offset off, in whichever unit holds it.
func (t *Table) readDIE(off uint64, d *dieAttrs) (*unit, error) {
	u := t.unitAt(off)
	if u == nil || off < u.dieOff {
		return nil, corruptf("reference to %#x outside any unit", off)
	}
	h, err := t.headOf(u)
	if err != nil {
		return nil, err
	}
	b := buf{data: t.sec.info[:u.end]}
	b.seek(off)
	code := b.uleb()
	if b.err != nil || code == 0 {
		return nil, corruptf("reference to %#x: no DIE there", off)
	}
	a := h.abbrevs.get(code)
	if a == nil {
		return nil, corruptf("DIE at %#x: unknown abbreviation %d", off, code)
	}
	return u, t.decodeAttrs(&b, a, u, h, d)
}

// origin is what a DIE inherits through DW_AT_specification and
// DW_AT_abstract_origin: each field is the first found in the order llvm's
// DWARFDie::findRecursively visits the chain (the DIE itself, then the
// specification's chain, then the abstract origin's).
type origin struct {
	linkage, name        string
	declFile             string
	declLine             uint32
	hasLinkage, hasName  bool
	hasDeclFile, hasDecl bool
	resolving            bool
}

// maxOriginDepth bounds specification/abstract_origin chains; real ones
// are two or three links long.
const maxOriginDepth = 16

// originKey is a DIE: its table (the unit's file, or the supplementary
// file) and offset.
type originKey struct {
	t   *Table
	off uint64
}

// inherit fills o with d's own fields, then with those of the DIEs d refers
// to. memo is per unit parse and keyed by DIE; it also marks the DIEs
// being resolved so a reference cycle ends instead of looping. A reference
// that leads nowhere readable only loses the name, as in llvm.
func (t *Table) inherit(o *origin, u *unit, d *dieAttrs, memo map[originKey]*origin, depth int) {
	if d.hasLinkage && !o.hasLinkage {
		o.linkage, o.hasLinkage = string(d.linkage), true
	}
	if d.hasName && !o.hasName {
		o.name, o.hasName = string(d.name), true
	}
	if d.hasDeclFile && !o.hasDeclFile {
		if f, err := t.fileName(u, d.declFile); err == nil {
			o.declFile, o.hasDeclFile = f, true
		}
	}
	if d.hasDeclLine && !o.hasDecl {
		o.declLine, o.hasDecl = uint32(d.declLine), true
	}
	for _, ref := range [2]struct {
		ok  bool
		off uint64
	}{{d.hasSpec, d.spec}, {d.hasAO, d.ao}} {
		if !ref.ok || (o.hasLinkage && o.hasName && o.hasDeclFile && o.hasDecl) {
			continue
		}
		tb, off := t, ref.off
		if off&supRef != 0 {
			tb, off = t.sup, off&^supRef
		}
		r := tb.resolveOrigin(off, memo, depth+1)
		if r == nil {
			continue
		}
		if r.hasLinkage && !o.hasLinkage {
			o.linkage, o.hasLinkage = r.linkage, true
		}
		if r.hasName && !o.hasName {
			o.name, o.hasName = r.name, true
		}
		if r.hasDeclFile && !o.hasDeclFile {
			o.declFile, o.hasDeclFile = r.declFile, true
		}
		if r.hasDecl && !o.hasDecl {
			o.declLine, o.hasDecl = r.declLine, true
		}
	}
}

// resolveOrigin returns the inherited fields of the DIE at off, or nil on
// a cycle, an over-long chain or an unreadable DIE.
func (t *Table) resolveOrigin(off uint64, memo map[originKey]*origin, depth int) *origin {
	if depth > maxOriginDepth || t == nil {
		return nil
	}
	k := originKey{t, off}
	if o, ok := memo[k]; ok {
		if o.resolving {
			return nil
		}
		return o
	}
	o := &origin{resolving: true}
	memo[k] = o
	var d dieAttrs
	u, err := t.readDIE(off, &d)
	if err != nil {
		o.resolving = false
		return o
	}
	t.inherit(o, u, &d, memo, depth)
	o.resolving = false
	return o
}
