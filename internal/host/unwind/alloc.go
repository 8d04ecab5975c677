package unwind

import (
	"cmp"
	"slices"
)

// span is a run of slots [off, off+n) in one of the BPF arrays.
type span struct{ off, n uint32 }

// allocator hands out spans of a fixed-size BPF array, first fit. Freed
// spans are not reusable at once: a BPF program may still be reading them,
// so they wait in pending until the owner has waited for an RCU grace period
// (Manager.reclaim) and calls settle.
type allocator struct {
	size    uint32
	free    []span // sorted by off, coalesced
	pending []span
	used    uint32
}

func newAllocator(size uint32) *allocator {
	a := &allocator{size: size}
	if size > 0 {
		a.free = []span{{0, size}}
	}
	return a
}

func (a *allocator) alloc(n uint32) (span, bool) {
	if n == 0 {
		return span{}, true
	}
	for i, f := range a.free {
		if f.n < n {
			continue
		}
		s := span{f.off, n}
		if f.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{f.off + n, f.n - n}
		}
		a.used += n
		return s, true
	}
	return span{}, false
}

// release queues s for reuse after the next grace period.
func (a *allocator) release(s span) {
	if s.n == 0 {
		return
	}
	a.used -= s.n
	a.pending = append(a.pending, s)
}

// pendingRows is how much is waiting for a grace period.
func (a *allocator) pendingRows() uint32 {
	var n uint32
	for _, s := range a.pending {
		n += s.n
	}
	return n
}

// settle makes pending spans reusable; call only after a grace period.
func (a *allocator) settle() { a.addFree(a.takePending()) }

// takePending hands over the spans released so far, for a grace period
// waited without the owner's lock; addFree then makes them reusable.
func (a *allocator) takePending() []span {
	p := a.pending
	a.pending = nil
	return p
}

func (a *allocator) addFree(spans []span) {
	if len(spans) == 0 {
		return
	}
	a.free = append(a.free, spans...)
	slices.SortFunc(a.free, func(x, y span) int { return cmp.Compare(x.off, y.off) })
	out := a.free[:1]
	for _, s := range a.free[1:] {
		last := &out[len(out)-1]
		if last.off+last.n == s.off {
			last.n += s.n
			continue
		}
		out = append(out, s)
	}
	a.free = out
}
