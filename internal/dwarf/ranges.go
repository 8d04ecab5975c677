package dwarf

import (
	"cmp"
	"slices"
)

type addrRange struct{ lo, hi uint64 }

const (
	rleEndOfList    = 0
	rleBaseAddressx = 1
	rleStartxEndx   = 2
	rleStartxLength = 3
	rleOffsetPair   = 4
	rleBaseAddress  = 5
	rleStartEnd     = 6
	rleStartLength  = 7
)

// maxRangeEntries bounds one range list; every entry consumes input, so
// this only caps memory on forged lists.
const maxRangeEntries = 1 << 22

func tombstone(addrSize uint8) uint64 {
	if addrSize >= 8 {
		return ^uint64(0)
	}
	return uint64(1)<<(8*uint(addrSize)) - 1
}

// dieRanges appends the address ranges of a DIE: low_pc/high_pc when both
// are present (llvm checks those first), else DW_AT_ranges. Empty ranges
// and ranges of discarded code (tombstone addresses) are left out.
func (t *Table) dieRanges(u *unit, h *unitHead, d *dieAttrs, out []addrRange) ([]addrRange, error) {
	if d.hasLow && d.hasHigh {
		hi := d.high
		if !d.highIsAddr {
			hi = d.low + d.high
		}
		if d.low < hi && d.low != tombstone(u.shape.addrSize) {
			out = append(out, addrRange{d.low, hi})
		}
		return out, nil
	}
	if !d.hasRanges {
		return out, nil
	}
	if u.shape.version >= 5 {
		off := d.ranges
		if d.rangesForm == formRnglistx {
			base := h.rnglistsBase
			if !h.hasRngBase {
				base = 12
				if u.shape.offSize == 8 {
					base = 20
				}
			}
			sz := uint64(u.shape.offSize)
			p := base + d.ranges*sz
			if d.ranges > 1<<40 || p < base || p+sz > uint64(len(t.sec.rnglists)) {
				return out, corruptf("rnglistx %d outside .debug_rnglists", d.ranges)
			}
			b := buf{data: t.sec.rnglists, off: int(p)}
			off = base + b.uN(int(sz))
		}
		return t.rnglist(u, h, off, out)
	}
	return t.rangeList(u, h, d.ranges+h.rangesBase, out)
}

// rangeList reads a DWARF 2-4 .debug_ranges list.
func (t *Table) rangeList(u *unit, h *unitHead, off uint64, out []addrRange) ([]addrRange, error) {
	b := buf{data: t.sec.ranges}
	b.seek(off)
	n := int(u.shape.addrSize)
	maxAddr := tombstone(u.shape.addrSize)
	base := h.base
	for i := 0; b.err == nil && i < maxRangeEntries; i++ {
		lo, hi := b.uN(n), b.uN(n)
		if b.err != nil {
			break
		}
		if lo == 0 && hi == 0 {
			return out, nil
		}
		if lo == maxAddr {
			base = hi
			continue
		}
		if base == maxAddr {
			continue
		}
		lo, hi = lo+base, hi+base
		if lo < hi {
			out = append(out, addrRange{lo, hi})
		}
	}
	return out, corruptf("range list at %#x runs off .debug_ranges", off)
}

// rnglist reads a DWARF 5 .debug_rnglists list.
func (t *Table) rnglist(u *unit, h *unitHead, off uint64, out []addrRange) ([]addrRange, error) {
	b := buf{data: t.sec.rnglists}
	b.seek(off)
	n := int(u.shape.addrSize)
	tomb := tombstone(u.shape.addrSize)
	base := h.base
	addrx := func(i uint64) uint64 {
		a, ok := t.addrIndex(u, h, i)
		if !ok {
			b.fail()
		}
		return a
	}
	for i := 0; b.err == nil && i < maxRangeEntries; i++ {
		var lo, hi uint64
		switch b.u8() {
		case rleEndOfList:
			if b.err == nil {
				return out, nil
			}
			continue
		case rleBaseAddressx:
			base = addrx(b.uleb())
			continue
		case rleBaseAddress:
			base = b.uN(n)
			continue
		case rleStartxEndx:
			lo = addrx(b.uleb())
			hi = addrx(b.uleb())
		case rleStartxLength:
			lo = addrx(b.uleb())
			hi = lo + b.uleb()
		case rleOffsetPair:
			if base == tomb {
				b.skipLEB()
				b.skipLEB()
				continue
			}
			lo = base + b.uleb()
			hi = base + b.uleb()
		case rleStartEnd:
			lo, hi = b.uN(n), b.uN(n)
		case rleStartLength:
			lo = b.uN(n)
			hi = lo + b.uleb()
		default:
			b.fail()
			continue
		}
		if lo < hi && lo != tomb {
			out = append(out, addrRange{lo, hi})
		}
	}
	return out, corruptf("range list at %#x runs off .debug_rnglists", off)
}

// cuRange maps [lo,hi) to units[u].
type cuRange struct {
	lo, hi uint64
	u      int32
}

// parseAranges reads .debug_aranges. It returns the ranges and the set of
// unit offsets that have a set, even an empty one: like llvm, units without
// a set are indexed from their DIEs instead.
func parseAranges(sec []byte, unitIdx func(off uint64) int32) ([]cuRange, map[uint64]bool, error) {
	var out []cuRange
	seen := map[uint64]bool{}
	b := buf{data: sec}
	for b.off < len(sec) {
		start := b.off
		length, offSize := b.unitLength()
		if b.err != nil || length > uint64(b.left()) {
			return out, seen, corruptf("aranges set at %#x: bad length", start)
		}
		end := b.off + int(length)
		sb := buf{data: sec[:end], off: b.off}
		sb.u16() // version
		cuOff := sb.uN(offSize)
		addrSize := int(sb.u8())
		segSize := int(sb.u8())
		if sb.err != nil || (addrSize != 4 && addrSize != 8) || segSize > 8 {
			return out, seen, corruptf("aranges set at %#x: bad header", start)
		}
		tuple := 2*addrSize + segSize
		if pad := (sb.off - start) % tuple; pad != 0 {
			sb.skip(uint64(tuple - pad))
		}
		ui := unitIdx(cuOff)
		for sb.err == nil && sb.left() >= tuple {
			sb.skip(uint64(segSize))
			lo, n := sb.uN(addrSize), sb.uN(addrSize)
			if lo == 0 && n == 0 {
				break
			}
			if ui >= 0 && n > 0 && lo+n > lo {
				out = append(out, cuRange{lo, lo + n, ui})
			}
		}
		seen[cuOff] = true
		b.off = end
	}
	return out, seen, nil
}

// buildIndex turns possibly overlapping unit ranges into sorted disjoint
// ones, following llvm's DWARFDebugAranges::construct: where units
// overlap, a run keeps the unit it started with while that unit still
// covers it, and otherwise goes to the unit with the lowest offset.
func buildIndex(rs []cuRange) []cuRange {
	type endpoint struct {
		addr  uint64
		u     int32
		start bool
	}
	eps := make([]endpoint, 0, 2*len(rs))
	for _, r := range rs {
		if r.lo < r.hi {
			eps = append(eps, endpoint{r.lo, r.u, true}, endpoint{r.hi, r.u, false})
		}
	}
	slices.SortFunc(eps, func(a, b endpoint) int { return cmp.Compare(a.addr, b.addr) })
	active := map[int32]int{}
	var heap minHeap // lowest active unit, with lazy deletion
	var out []cuRange
	prev := ^uint64(0)
	for _, e := range eps {
		if prev < e.addr && len(active) > 0 {
			if n := len(out); n > 0 && out[n-1].hi == prev && active[out[n-1].u] > 0 {
				out[n-1].hi = e.addr
			} else {
				for active[heap.top()] == 0 {
					heap.pop()
				}
				out = append(out, cuRange{prev, e.addr, heap.top()})
			}
		}
		if e.start {
			if active[e.u] == 0 {
				heap.push(e.u)
			}
			active[e.u]++
		} else if c := active[e.u]; c > 1 {
			active[e.u] = c - 1
		} else {
			delete(active, e.u)
		}
		prev = e.addr
	}
	return out
}

// minHeap is a binary min-heap of unit indexes.
type minHeap []int32

func (h minHeap) top() int32 { return h[0] }

func (h *minHeap) push(v int32) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p] <= s[i] {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *minHeap) pop() {
	s := *h
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s[l] < s[m] {
			m = l
		}
		if l+1 < n && s[l+1] < s[m] {
			m = l + 1
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
}
