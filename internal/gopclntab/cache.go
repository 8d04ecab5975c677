package gopclntab

import "sync/atomic"

// Decoding a pc-value table walks it from the function's entry, which for a
// large function costs microseconds, and one lookup needs several tables at
// several pcs. So recently used functions keep their tables decoded into
// runs that are binary-searched. The cache is set associative by function
// index with lock-free slots (a new entry goes in way 0 and pushes the others
// down, the last falls out), and the bytes it holds are capped: past the cap
// a miss decodes without keeping the result.
const (
	cacheSets       = 4096     // at most; small tables get fewer
	cacheWays       = 4        // so a working set of thousands of functions fits
	cacheBudget     = 32 << 20 // bytes of decoded runs kept per Table
	maxCachedRuns   = 4096     // larger tables are walked on every lookup instead
	cacheEntryBytes = 160      // fixed cost of one cached function, for SizeBytes
)

type cacheSet struct {
	way [cacheWays]atomic.Pointer[cachedFunc]
}

// run is one stretch of a pc-value table: val holds for pcs below end
// (an offset from the function entry) and at or above the previous run's end.
type run struct {
	end uint32
	val int32
}

// runs is a decoded table; ok is false when the table was not decoded
// (absent, too long or malformed) and lookups walk the raw bytes instead.
type runs struct {
	r  []run
	ok bool
}

type cachedFunc struct {
	f     fn
	name  string
	lines runs
	files runs
	inls  runs
	bytes int64
}

func (t *Table) cached(i int) (*cachedFunc, error) {
	t.cacheOnce.Do(func() {
		t.cache = make([]cacheSet, min(max(t.nfunc/cacheWays, 4), cacheSets))
		t.cacheBytes.Add(int64(len(t.cache)) * cacheWays * 8)
	})
	set := &t.cache[i%len(t.cache)]
	for w := range set.way {
		if c := set.way[w].Load(); c != nil && c.f.idx == i {
			return c, nil
		}
	}
	f, err := t.decodeFunc(i)
	if err != nil {
		return nil, err
	}
	name, err := t.funcName(f.nameOff)
	if err != nil {
		return nil, err
	}
	c := &cachedFunc{f: f, name: name}
	c.lines = t.decodeRuns(&f, f.pcln)
	c.files = t.decodeRuns(&f, f.pcfile)
	if f.inlPC != 0 {
		c.inls = t.decodeRuns(&f, f.inlPC)
	}
	c.bytes = cacheEntryBytes + 8*int64(len(c.lines.r)+len(c.files.r)+len(c.inls.r))
	if t.cacheBytes.Load()+c.bytes > cacheBudget {
		return c, nil
	}
	// Racing writers may both insert; the byte count stays right because
	// each accounts for exactly what it pushed out.
	t.cacheBytes.Add(c.bytes)
	x := c
	for w := range set.way {
		if x = set.way[w].Swap(x); x == nil {
			break
		}
	}
	if x != nil {
		t.cacheBytes.Add(-x.bytes)
	}
	return c, nil
}

// decodeRuns decodes a whole pc-value table, or reports !ok so that the
// streaming decoder handles (and reports errors for) the pcs asked about.
func (t *Table) decodeRuns(f *fn, tab uint32) runs {
	if tab == 0 || uint64(tab) >= uint64(len(t.pctab)) {
		return runs{}
	}
	p := t.pctab[tab:]
	val := int32(-1)
	cur := f.entry
	var out []run
	for n := 0; n <= maxCachedRuns; n++ {
		uv, k := uvarint(p)
		if k <= 0 {
			return runs{}
		}
		if uv == 0 && n > 0 {
			return runs{r: out, ok: true}
		}
		p = p[k:]
		val += int32(-(uv & 1) ^ (uv >> 1))
		pd, k := uvarint(p)
		if k <= 0 {
			return runs{}
		}
		p = p[k:]
		cur += uint64(pd) * t.quantum
		if cur > f.end || cur < f.entry {
			// Stop at the function's end, as the streaming decoder does.
			out = append(out, run{end: uint32(f.end - f.entry), val: val})
			return runs{r: out, ok: true}
		}
		out = append(out, run{end: uint32(cur - f.entry), val: val})
		if cur == f.end {
			return runs{r: out, ok: true}
		}
	}
	return runs{}
}

// value looks pc up in a decoded table, falling back to the streaming
// decoder when the table was not decoded.
func (t *Table) value(c *cachedFunc, rs *runs, tab uint32, pc uint64) (int32, error) {
	if !rs.ok {
		v, _, err := t.pcvalue(&c.f, tab, pc)
		return v, err
	}
	off := uint32(pc - c.f.entry)
	r := rs.r
	lo, hi := 0, len(r) // first run ending after off is in [lo, hi]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r[m].end > off {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == len(r) {
		return 0, errNotCovered
	}
	return r[lo].val, nil
}

func (c *cachedFunc) inl(t *Table, pc uint64) (int32, error) {
	return t.value(c, &c.inls, c.f.inlPC, pc)
}

func (c *cachedFunc) fileLine(t *Table, pc uint64) (string, uint32, error) {
	line, err := t.value(c, &c.lines, c.f.pcln, pc)
	if c.f.pcln == 0 {
		line, err = -1, nil
	}
	if err != nil {
		return "", 0, err
	}
	fileno := int32(-1)
	if c.f.pcfile != 0 {
		if fileno, err = t.value(c, &c.files, c.f.pcfile, pc); err != nil {
			return "", 0, err
		}
	}
	file, err := t.fileName(&c.f, fileno)
	if err != nil {
		return "", 0, err
	}
	if line < 0 {
		line = 0
	}
	return file, uint32(line), nil
}
