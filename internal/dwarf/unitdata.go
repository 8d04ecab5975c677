package dwarf

import (
	"fmt"
	"slices"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/frame"
)

// node is a subprogram or inlined_subroutine instance of a parsed unit.
type node struct {
	name     string // linkage name if any, else DW_AT_name (inherited)
	declFile string
	low      uint64 // start address: DW_AT_low_pc, else the lowest range
	parent   int32  // enclosing node, or -1; always < own index
	declLine uint32
	// Where this instance was inlined: the location its caller's frame
	// reports. callFile indexes the unit's line-table files.
	callFile, callLine, callCol, callDisc uint32
	sub                                   bool // DW_TAG_subprogram: ends a chain
}

// span maps [lo,hi) to the deepest node covering it.
type span struct {
	lo, hi uint64
	node   int32
}

// unitData is one unit, fully parsed.
type unitData struct {
	// missing says why the unit answers without its functions: the split
	// unit of a skeleton could not be read.
	missing error
	files   []string
	rows    []row
	seqs    []sequence // sorted by hi, as llvm searches them
	nodes   []node
	spans   []span
}

func (d *unitData) size() int64 {
	n := int64(len(d.rows))*24 + int64(len(d.seqs))*24 + int64(len(d.nodes))*80 + int64(len(d.spans))*24
	for _, f := range d.files {
		n += int64(len(f)) + 16
	}
	for i := range d.nodes {
		// Names are shared between instances of one function; count each
		// node's once anyway as an upper bound.
		n += int64(len(d.nodes[i].name))
	}
	return n + 256
}

// fullOf parses u's line program and DIE tree once.
func (t *Table) fullOf(u *unit) (*unitData, error) {
	s := u.state()
	if !s.fullDone.Load() {
		s.fullMu.Lock()
		t.parseFullLocked(u, s)
		s.fullMu.Unlock()
	}
	return s.full, s.fullErr
}

// parseFullLocked parses u unless that is done; s (u's state) fullMu is
// held.
func (t *Table) parseFullLocked(u *unit, s *unitState) {
	if s.fullDone.Load() {
		return
	}
	defer s.fullDone.Store(true)
	// Belt and braces: the parser bounds-checks every read, but a bug
	// must cost one unit's answers, not the process.
	defer contain.Panic(func(r any) { s.full, s.fullErr = nil, corruptf("unit at %#x: %v", u.off, r) })
	s.full, s.fullErr = t.parseFull(u)
	if s.fullErr == nil {
		t.parsed.Add(s.full.size())
	}
}

type nodeRange struct {
	lo, hi uint64
	node   int32
}

func (t *Table) parseFull(u *unit) (*unitData, error) {
	h, err := t.headOf(u)
	if err != nil {
		return nil, err
	}
	lh, err := t.linesOf(u)
	if err != nil {
		return nil, err
	}
	d := &unitData{files: lh.files}
	d.rows, d.seqs, err = t.runLineProgram(lh, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("unit at %#x: %w", u.off, err)
	}
	slices.SortStableFunc(d.seqs, func(a, b sequence) int {
		switch {
		case a.hi < b.hi:
			return -1
		case a.hi > b.hi:
			return 1
		}
		return 0
	})

	// A skeleton's functions are in its split unit (.dwo, .dwp); its
	// lines are here.
	wt, wu, wh := t, u, h
	if h.hasDWO {
		st, su, sh, release, err := t.splitUnit(u, h)
		defer release()
		if err == nil {
			wt, wu, wh = st, su, sh
		} else {
			d.missing = err
		}
	}
	var nrs []nodeRange
	d.nodes, nrs, err = wt.walkDIEs(wu, wh)
	if err != nil {
		return nil, err
	}
	d.spans = buildSpans(nrs)
	return d, nil
}

// walkDIEs reads u's subprogram and inlined_subroutine tree into nodes
// (parents before children) and the address ranges of each.
func (t *Table) walkDIEs(u *unit, h *unitHead) ([]node, []nodeRange, error) {
	var (
		b       = buf{data: t.sec.info[:u.end]}
		stack   = make([]int32, 1, 64) // nearest enclosing node per open DIE
		memo    = map[originKey]*origin{}
		attrs   dieAttrs
		ranges  []addrRange
		nodes   []node
		nrs     []nodeRange
		abbrevs = h.abbrevs
		err     error
	)
	stack[0] = -1
	b.seek(u.dieOff)
	for b.off < len(b.data) {
		code := b.uleb()
		if code == 0 {
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		a := abbrevs.get(code)
		if a == nil {
			return nil, nil, corruptf("unit at %#x: unknown abbreviation %d at %#x", u.off, code, b.off)
		}
		cur := stack[len(stack)-1]
		if !a.wanted {
			if a.fixed >= 0 {
				b.skip(uint64(a.fixed))
			} else {
				for i := range a.attrs {
					if !u.shape.skipForm(&b, a.attrs[i].form) {
						break
					}
				}
			}
			if b.err != nil {
				return nil, nil, corruptf("unit at %#x: DIE runs off the unit", u.off)
			}
		} else {
			if err := t.decodeAttrs(&b, a, u, h, &attrs); err != nil {
				return nil, nil, err
			}
			ranges, err = t.dieRanges(u, h, &attrs, ranges[:0])
			if err != nil {
				return nil, nil, err
			}
			if a.tag == tagInlinedSubroutine || len(ranges) > 0 {
				n := t.makeNode(u, &attrs, ranges, cur, memo)
				cur = int32(len(nodes))
				nodes = append(nodes, n)
				for _, r := range ranges {
					nrs = append(nrs, nodeRange{r.lo, r.hi, cur})
				}
			}
		}
		if a.children {
			stack = append(stack, cur)
		}
	}
	if b.err != nil {
		return nil, nil, corruptf("unit at %#x: DIE tree runs off the unit", u.off)
	}
	return nodes, nrs, nil
}

func (t *Table) makeNode(u *unit, a *dieAttrs, ranges []addrRange, parent int32, memo map[originKey]*origin) node {
	var o origin
	t.inherit(&o, u, a, memo, 0)
	n := node{
		name:     o.name,
		declFile: o.declFile,
		declLine: o.declLine,
		parent:   parent,
		sub:      a.tag == tagSubprogram,
		callFile: uint32(a.callFile),
		callLine: uint32(a.callLine),
		callCol:  uint32(a.callCol),
		callDisc: uint32(a.disc),
	}
	if o.hasLinkage {
		n.name = o.linkage
	}
	// StartAddress is the DIE's own DW_AT_low_pc, not inherited and not
	// taken from DW_AT_ranges, as llvm-symbolizer reports it: an instance
	// described by ranges alone (a function split into hot and cold parts)
	// has none.
	if a.hasLow {
		n.low = a.low
	}
	return n
}

// buildSpans flattens node ranges into disjoint spans, each owned by the
// covering node that comes last in DIE order. That is the deepest one, and
// among overlapping siblings the later, which is what llvm's
// DWARFUnit::updateAddressDieMap computes.
func buildSpans(rs []nodeRange) []span {
	slices.SortFunc(rs, func(a, b nodeRange) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return int(a.node - b.node)
	})
	var h []int32 // max-heap of indexes into rs, by node
	less := func(i, j int32) bool { return rs[i].node < rs[j].node }
	push := func(v int32) {
		h = append(h, v)
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if !less(h[p], h[i]) {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
	}
	pop := func() {
		n := len(h) - 1
		h[0] = h[n]
		h = h[:n]
		for i := 0; ; {
			l, m := 2*i+1, i
			if l < n && less(h[m], h[l]) {
				m = l
			}
			if l+1 < n && less(h[m], h[l+1]) {
				m = l + 1
			}
			if m == i {
				break
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	out := make([]span, 0, len(rs))
	var pos uint64
	i := 0
	for i < len(rs) || len(h) > 0 {
		if len(h) == 0 {
			pos = rs[i].lo
		}
		for i < len(rs) && rs[i].lo <= pos {
			push(int32(i))
			i++
		}
		for len(h) > 0 && rs[h[0]].hi <= pos {
			pop()
		}
		if len(h) == 0 {
			continue
		}
		top := rs[h[0]]
		next := top.hi
		if i < len(rs) && rs[i].lo < next {
			next = rs[i].lo
		}
		if n := len(out); n > 0 && out[n-1].hi == pos && out[n-1].node == top.node {
			out[n-1].hi = next
		} else {
			out = append(out, span{pos, next, top.node})
		}
		pos = next
	}
	return slices.Clip(out)
}

// findRow is llvm's LineTable::lookupAddress: the first sequence (by end)
// ending after pc must start at or before it; within it, the last row whose
// address is <= pc.
func (d *unitData) findRow(pc uint64) *row {
	ss := d.seqs
	lo, hi := 0, len(ss)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ss[m].hi <= pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(ss) || ss[lo].lo > pc {
		return nil
	}
	rows := d.rows[ss[lo].first:ss[lo].last]
	lo, hi = 0, len(rows)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rows[m].addr <= pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return nil
	}
	return &rows[lo-1]
}

func (d *unitData) findNode(pc uint64) int32 {
	sp := d.spans
	lo, hi := 0, len(sp)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if sp[m].lo <= pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 || pc >= sp[lo-1].hi {
		return -1
	}
	return sp[lo-1].node
}

func (d *unitData) file(i uint32) string {
	if int(i) < len(d.files) {
		return d.files[i]
	}
	return ""
}

func (d *unitData) frame(n int32) frame.Frame {
	nd := &d.nodes[n]
	return frame.Frame{Name: nd.name, StartFile: nd.declFile, StartLine: nd.declLine, StartAddress: nd.low}
}

func (d *unitData) lookup(pc uint64, inlines bool, dst []frame.Frame) []frame.Frame {
	r := d.findRow(pc)
	n := d.findNode(pc)
	var f frame.Frame
	switch {
	case n < 0 && r == nil:
		return dst
	case n < 0:
		// No function DIE covers pc (llvm does the same for units whose
		// DIEs are elsewhere): a nameless frame from the line table.
	case inlines:
		f = d.frame(n)
	default:
		for !d.nodes[n].sub && d.nodes[n].parent >= 0 {
			n = d.nodes[n].parent
		}
		f = d.frame(n)
	}
	if r != nil {
		f.File, f.Line, f.Column, f.Discriminator = d.file(r.file), r.line, r.col, r.disc
	}
	dst = append(dst, f)
	if n < 0 || !inlines {
		return dst
	}
	// Parents have lower indexes than children, so this walk ends.
	for !d.nodes[n].sub && d.nodes[n].parent >= 0 {
		c := &d.nodes[n]
		n = c.parent
		f := d.frame(n)
		f.File, f.Line, f.Column, f.Discriminator = d.file(c.callFile), c.callLine, c.callCol, c.callDisc
		dst = append(dst, f)
	}
	return dst
}
