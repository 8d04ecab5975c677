package gopclntab

// Bounds calls fn with every address at which Lookup's answer may change:
// each function's entry and end, and each step of its line, file and
// inline tables (an inlined frame's caller line is fixed by the step it
// belongs to). A malformed function record fails it, since Lookup would
// then fail or answer differently within the function.
func (t *Table) Bounds(fn func(uint64)) error {
	if t.nfunc == 0 {
		return nil
	}
	for i := 0; i < t.nfunc; i++ {
		f, err := t.decodeFunc(i)
		if err != nil {
			return err
		}
		fn(f.entry)
		if f.pcln == 0 {
			fn(f.entry + 1) // a marker: named at its entry only
			continue
		}
		for _, tab := range [...]uint32{f.pcln, f.pcfile, f.inlPC} {
			if err := t.steps(&f, tab, fn); err != nil {
				return err
			}
		}
	}
	fn(t.entry(t.nfunc))
	return nil
}

// steps calls fn with the end of each run of the pc-value table tab of f,
// as far as pcvalue reads it.
func (t *Table) steps(f *fn, tab uint32, fn func(uint64)) error {
	if tab == 0 {
		return nil
	}
	if uint64(tab) >= uint64(len(t.pctab)) {
		return corrupt("pc-value table offset %#x outside table", tab)
	}
	p := t.pctab[tab:]
	cur := f.entry
	for n := 0; n < maxPCSteps; n++ {
		uv, k := uvarint(p)
		if k <= 0 {
			return corrupt("truncated pc-value table at %#x", tab)
		}
		if uv == 0 && n > 0 {
			return nil
		}
		p = p[k:]
		pd, k := uvarint(p)
		if k <= 0 {
			return corrupt("truncated pc-value table at %#x", tab)
		}
		p = p[k:]
		cur += uint64(pd) * t.quantum
		fn(cur)
		if cur >= f.end {
			return nil
		}
	}
	return corrupt("pc-value table at %#x too long", tab)
}
