package dwarf

// DWARF constants used here (DWARF 5 §7, plus the GNU extensions GCC emits).
const (
	tagLexicalBlock      = 0x0b
	tagCompileUnit       = 0x11
	tagInlinedSubroutine = 0x1d
	tagSubprogram        = 0x2e
	tagPartialUnit       = 0x3c
	tagSkeletonUnit      = 0x4a

	atName             = 0x03
	atStmtList         = 0x10
	atLowPC            = 0x11
	atHighPC           = 0x12
	atCompDir          = 0x1b
	atAbstractOrigin   = 0x31
	atDeclFile         = 0x3a
	atDeclLine         = 0x3b
	atSpecification    = 0x47
	atRanges           = 0x55
	atCallColumn       = 0x57
	atCallFile         = 0x58
	atCallLine         = 0x59
	atLinkageName      = 0x6e
	atStrOffsetsBase   = 0x72
	atAddrBase         = 0x73
	atRnglistsBase     = 0x74
	atDWOName          = 0x76
	atMIPSLinkageName  = 0x2007
	atGNUDWOName       = 0x2130
	atGNUDWOID         = 0x2131
	atGNURangesBase    = 0x2132
	atGNUAddrBase      = 0x2133
	atGNUDiscriminator = 0x2136

	formAddr          = 0x01
	formBlock2        = 0x03
	formBlock4        = 0x04
	formData2         = 0x05
	formData4         = 0x06
	formData8         = 0x07
	formString        = 0x08
	formBlock         = 0x09
	formBlock1        = 0x0a
	formData1         = 0x0b
	formFlag          = 0x0c
	formSdata         = 0x0d
	formStrp          = 0x0e
	formUdata         = 0x0f
	formRefAddr       = 0x10
	formRef1          = 0x11
	formRef2          = 0x12
	formRef4          = 0x13
	formRef8          = 0x14
	formRefUdata      = 0x15
	formIndirect      = 0x16
	formSecOffset     = 0x17
	formExprloc       = 0x18
	formFlagPresent   = 0x19
	formStrx          = 0x1a
	formAddrx         = 0x1b
	formRefSup4       = 0x1c
	formStrpSup       = 0x1d
	formData16        = 0x1e
	formLineStrp      = 0x1f
	formRefSig8       = 0x20
	formImplicitConst = 0x21
	formLoclistx      = 0x22
	formRnglistx      = 0x23
	formRefSup8       = 0x24
	formStrx1         = 0x25
	formStrx2         = 0x26
	formStrx3         = 0x27
	formStrx4         = 0x28
	formAddrx1        = 0x29
	formAddrx2        = 0x2a
	formAddrx3        = 0x2b
	formAddrx4        = 0x2c
	formGNUAddrIndex  = 0x1f01
	formGNUStrIndex   = 0x1f02
	formGNURefAlt     = 0x1f20
	formGNUStrpAlt    = 0x1f21
)

// attrSpec is one (attribute, form) pair of an abbreviation.
type attrSpec struct {
	at       uint16
	form     uint16
	implicit int64 // DW_FORM_implicit_const value
}

// abbrev is one decoded abbreviation declaration.
type abbrev struct {
	tag      uint16
	children bool
	// wanted is set for tags whose attributes the DIE walk decodes; all
	// other DIEs are skipped, by fixed when every form has a fixed size.
	wanted bool
	fixed  int // total attribute size in bytes, or -1 if any form is variable
	attrs  []attrSpec
}

// abbrevTable maps codes to declarations. Producers number codes densely
// from 1, so a slice serves; sparse codes fall back to a map.
type abbrevTable struct {
	dense  []abbrev
	sparse map[uint64]*abbrev
	size   int // bytes of .debug_abbrev decoded into it
}

// heapBytes estimates the memory the table holds.
func (t *abbrevTable) heapBytes() int64 {
	// Each declaration is at least 4 bytes on disk and costs its struct and
	// a few attribute specs (16 bytes per 2 bytes on disk at most).
	return int64(len(t.dense))*abbrevCost + int64(len(t.sparse))*(abbrevCost+16) + int64(t.size)*8 + 64
}

// abbrevCost is the size of an abbrev struct.
const abbrevCost = 56

func (t *abbrevTable) get(code uint64) *abbrev {
	if code < uint64(len(t.dense)) {
		if a := &t.dense[code]; a.tag != 0 {
			return a
		}
		return nil
	}
	return t.sparse[code]
}

// maxAbbrevAttrs bounds one declaration's attribute list; real producers
// use a few dozen at most.
const maxAbbrevAttrs = 512

// parseAbbrevs decodes the table at off. Form sizes depend on the unit's
// address and offset size and version, so the table is per (offset, shape).
// The table's size is the section bytes it was decoded from.
func parseAbbrevs(sec []byte, off uint64, shape unitShape) (*abbrevTable, error) {
	// Two passes: the first sizes the table and the attribute specs, so
	// the second fills a few allocations rather than growing one slice per
	// declaration (tens of thousands of small appends on a cold libc).
	nAbbrevs, nAttrs, maxCode, err := scanAbbrevs(sec, off)
	if err != nil {
		return nil, err
	}
	type entry struct {
		code uint64
		a    abbrev
	}
	all := make([]entry, 0, nAbbrevs)
	specs := make([]attrSpec, 0, nAttrs)
	b := buf{data: sec}
	b.seek(off)
	for {
		code := b.uleb()
		if code == 0 {
			break
		}
		var a abbrev
		tag := b.uleb()
		a.tag = uint16(tag)
		a.children = b.u8() != 0
		a.wanted = tag == tagSubprogram || tag == tagInlinedSubroutine
		first := len(specs)
		for {
			at, form := b.uleb(), b.uleb()
			if at == 0 && form == 0 {
				break
			}
			s := attrSpec{at: uint16(at), form: uint16(form)}
			if form == formImplicitConst {
				s.implicit = b.sleb()
			}
			specs = append(specs, s)
			if a.fixed >= 0 {
				if n := shape.fixedSize(s.form); n >= 0 {
					a.fixed += n
				} else {
					a.fixed = -1
				}
			}
		}
		a.attrs = specs[first:len(specs):len(specs)]
		all = append(all, entry{code, a})
	}
	// Dense when codes are (nearly) 1..n, as producers number them, so a
	// forged code cannot make the slice huge.
	t := &abbrevTable{size: b.off - int(off)}
	if maxCode <= 2*uint64(len(all))+64 {
		t.dense = make([]abbrev, maxCode+1)
	} else {
		t.sparse = make(map[uint64]*abbrev, len(all))
	}
	for i := range all {
		e := &all[i]
		if t.get(e.code) != nil {
			return nil, corruptf("abbrev at %#x: duplicate code %d", off, e.code)
		}
		if t.dense != nil {
			t.dense[e.code] = e.a
		} else {
			t.sparse[e.code] = &e.a
		}
	}
	return t, nil
}

// scanAbbrevs validates the table at off and counts its declarations and
// attribute specs.
func scanAbbrevs(sec []byte, off uint64) (nAbbrevs, nAttrs int, maxCode uint64, err error) {
	b := buf{data: sec}
	b.seek(off)
	for b.err == nil {
		code := b.uleb()
		if code == 0 {
			break
		}
		tag := b.uleb()
		if tag == 0 || tag > 0xffff {
			return 0, 0, 0, corruptf("abbrev at %#x: tag %#x", off, tag)
		}
		b.u8()
		n := 0
		for b.err == nil {
			at, form := b.uleb(), b.uleb()
			if at == 0 && form == 0 {
				break
			}
			if at > 0xffff || form > 0xffff {
				return 0, 0, 0, corruptf("abbrev at %#x: attribute %#x form %#x", off, at, form)
			}
			if form == formImplicitConst {
				b.sleb()
			}
			if n++; n > maxAbbrevAttrs {
				return 0, 0, 0, corruptf("abbrev at %#x: too many attributes", off)
			}
		}
		nAbbrevs++
		nAttrs += n
		maxCode = max(maxCode, code)
	}
	if b.err != nil {
		return 0, 0, 0, corruptf("abbrev table at %#x runs off the section", off)
	}
	return nAbbrevs, nAttrs, maxCode, nil
}

// unitShape is what form sizes depend on.
type unitShape struct {
	version  uint8
	addrSize uint8
	offSize  uint8
}

// fixedSize is the encoded size of form, or -1 if it is variable.
func (s unitShape) fixedSize(form uint16) int {
	switch form {
	case formAddr:
		return int(s.addrSize)
	case formFlagPresent, formImplicitConst:
		return 0
	case formData1, formRef1, formFlag, formStrx1, formAddrx1:
		return 1
	case formData2, formRef2, formStrx2, formAddrx2:
		return 2
	case formStrx3, formAddrx3:
		return 3
	case formData4, formRef4, formRefSup4, formStrx4, formAddrx4:
		return 4
	case formData8, formRef8, formRefSig8, formRefSup8:
		return 8
	case formData16:
		return 16
	case formStrp, formLineStrp, formSecOffset, formStrpSup, formGNURefAlt, formGNUStrpAlt:
		return int(s.offSize)
	case formRefAddr:
		if s.version <= 2 {
			return int(s.addrSize)
		}
		return int(s.offSize)
	}
	return -1
}

// skipForm advances past one value of form. A form it does not know has no
// knowable size, so it fails the buffer and reports false.
func (s unitShape) skipForm(b *buf, form uint16) bool {
	if n := s.fixedSize(form); n >= 0 {
		b.skip(uint64(n))
		return true
	}
	switch form {
	case formString:
		b.cstr()
	case formUdata, formSdata, formRefUdata, formStrx, formAddrx, formLoclistx, formRnglistx, formGNUAddrIndex, formGNUStrIndex:
		b.skipLEB()
	case formBlock, formExprloc:
		b.skip(b.uleb())
	case formBlock1:
		b.skip(uint64(b.u8()))
	case formBlock2:
		b.skip(uint64(b.u16()))
	case formBlock4:
		b.skip(uint64(b.u32()))
	case formIndirect:
		f := b.uleb()
		if f == formIndirect || f > 0xffff {
			b.fail()
			return false
		}
		return s.skipForm(b, uint16(f))
	default:
		b.fail()
		return false
	}
	return true
}
