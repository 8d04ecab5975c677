package gopclntab

// Whole-table walks, for building unwind tables: every function in address
// order, and the runs of its pcsp table (the SP delta at each pc).

// Function flags (internal/abi.FuncFlag), written by Go 1.17 and later;
// Go 1.16 tables leave them zero.
const (
	FuncFlagTopFrame = 1 << 0 // outermost frame: traceback stops here (goexit, mstart, rt0_go)
	FuncFlagSPWrite  = 1 << 1 // writes SP other than by adjusting it: SP deltas do not hold throughout
	FuncFlagAsm      = 1 << 2 // written in assembly
)

// Func is one function of the table as Funcs reports it.
type Func struct {
	Entry uint64 // first instruction
	End   uint64 // the next function's entry (padding included)
	Flag  uint8  // FuncFlag* bits
	pcsp  uint32
}

// Funcs calls fn for each function in address order, with its name (which
// aliases the table: copy it to keep it), until fn returns false. A
// malformed function record ends the walk with an error wrapping
// frame.ErrCorruptFile.
func (t *Table) Funcs(fn func(f *Func, name []byte) bool) error {
	var f Func
	for i := 0; i < t.nfunc; i++ {
		d, err := t.decodeFunc(i)
		if err != nil {
			return err
		}
		name, ok := cstring(t.funcnametab, uint64(d.nameOff))
		if !ok {
			return corrupt("function %d name offset %#x outside table", i, d.nameOff)
		}
		f = Func{Entry: d.entry, End: d.end, Flag: d.flag, pcsp: d.pcsp}
		if !fn(&f, name) {
			return nil
		}
	}
	return nil
}

// FuncAt returns function i (in address order, as Funcs reports them), so
// that a caller walking the table twice need not keep the functions.
func (t *Table) FuncAt(i int) (Func, error) {
	if i < 0 || i >= t.nfunc {
		return Func{}, corrupt("function %d of %d", i, t.nfunc)
	}
	// Only what Func holds: decodeFunc also reads the inline tree.
	f := Func{Entry: t.entry(i), End: t.entry(i + 1)}
	if f.End < f.Entry {
		return Func{}, corrupt("function table not sorted at %d", i)
	}
	off := t.funcOff(i)
	if off > uint64(len(t.pclntable)) || uint64(len(t.pclntable))-off < uint64(t.funcSize) {
		return Func{}, corrupt("function %d record at %#x outside table", i, off)
	}
	b := t.pclntable[off:]
	p := 4
	if t.version == ver116 {
		p = t.ptrSize
	}
	f.pcsp, f.Flag = t.u32(b[p+12:]), b[t.funcSize-3]
	return f, nil
}

// SPDeltas calls fn for each run of f's pcsp table, in order: from pc up to
// end the stack pointer is delta bytes below its value at entry. Runs stop
// at the end of the function's code, which may be before f.End. A function
// without a pcsp table (the linker's zero-size markers) has no runs. A
// malformed table returns an error wrapping frame.ErrCorruptFile after the
// runs decoded so far.
func (t *Table) SPDeltas(f *Func, fn func(pc, end uint64, delta int32)) error {
	if f.pcsp == 0 {
		return nil
	}
	if uint64(f.pcsp) >= uint64(len(t.pctab)) {
		return corrupt("pcsp table offset %#x outside table", f.pcsp)
	}
	p := t.pctab[f.pcsp:]
	val := int32(-1)
	cur := f.Entry
	for n := 0; n < maxPCSteps; n++ {
		uv, k := uvarint(p)
		if k <= 0 {
			return corrupt("truncated pcsp table at %#x", f.pcsp)
		}
		if uv == 0 && n > 0 {
			return nil
		}
		p = p[k:]
		val += int32(-(uv & 1) ^ (uv >> 1))
		pd, k := uvarint(p)
		if k <= 0 {
			return corrupt("truncated pcsp table at %#x", f.pcsp)
		}
		p = p[k:]
		next := cur + uint64(pd)*t.quantum
		if next > f.End || next < cur {
			return corrupt("pcsp table at %#x runs outside its function", f.pcsp)
		}
		if next > cur {
			fn(cur, next, val)
		}
		cur = next
		if cur == f.End {
			return nil
		}
	}
	return corrupt("pcsp table at %#x too long", f.pcsp)
}

// TableBytes is the size of the table the Table reads.
func (t *Table) TableBytes() int { return len(t.whole) }
