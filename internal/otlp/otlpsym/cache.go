package otlpsym

import (
	"fmt"
	"time"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize"
)

// objNum is an identity's number and the generation it belongs to.
type objNum struct {
	num, gen uint64
}

// maxObjNum is the largest object number: a key keeps 16 bits for it.
const maxObjNum = 1<<16 - 1

// keyOf packs an object number and an address into one word, so the big
// result maps take their fast path. Addresses above 48 bits (kernel ones)
// are not cached.
func keyOf(num, addr uint64) (uint64, bool) {
	if addr>>48 != 0 {
		return 0, false
	}
	return num<<48 | addr, true
}

// result is a resolved address, independent of any batch's dictionary:
// lines point at interned functions so that a batch maps them to its
// dictionary with one pointer-keyed lookup, and a cached result is small.
type result struct {
	lines []rline // innermost first
	err   error
	// missing is why lines are missing from a named answer (a reason, see
	// symbolize.Handle.Missing), or "".
	missing string
}

// partialResult is a failure, or an answer from files short of DWARF,
// until expires (unix nanoseconds): better files found later then reach
// addresses already seen.
type partialResult struct {
	r       *result
	expires int64
	gen     uint64 // the chain's Generation() when found
}

// stamp is when a batch runs: the time, and the generation of the chain's
// growing sources (a symbol store), which ends partial answers when it
// moves.
type stamp struct {
	now int64
	gen uint64
}

func (s *Symbolizer) stamp() stamp {
	return stamp{now: time.Now().UnixNano(), gen: s.chain.Generation()}
}

type rline struct {
	fn        *function
	line, col uint32
}

// funcTuple is a function as the dictionary records it.
type funcTuple struct {
	name, system, file string
	startLine          int64
}

// function is an interned funcTuple and its number: numbers are never
// reused (the table starts over with new ones), so a batch maps the
// functions of its answers to its dictionary through a slice by number
// rather than a map (funcIndex).
type function struct {
	funcTuple
	id uint64
}

func (f *funcTuple) bytes() int64 { return int64(len(f.name)+len(f.system)+len(f.file)) + 88 }

// resultCost is what a cached result holds: the slot and index entry, the
// result and its lines. The functions its lines point at are counted once,
// in the interning table.
func resultCost(r *result) int64 { return 160 + 16*int64(len(r.lines)) }

// number interns o's identity key, ending the generation when numbers run
// out.
func (s *Symbolizer) number(o *objRef) {
	if n, ok := s.objNums.Get(o.key); ok {
		o.num, o.gen = n.num, n.gen
		return
	}
	s.numMu.Lock()
	defer s.numMu.Unlock()
	if n, ok := s.objNums.Peek(o.key); ok { // numbered meanwhile
		o.num, o.gen = n.num, n.gen
		return
	}
	if s.nextNum == maxObjNum {
		s.genMu.Lock()
		s.gen++
		s.objNums.Purge()
		s.results.Purge()
		s.partial.Purge()
		s.genMu.Unlock()
		s.nextNum = 0
	}
	s.nextNum++
	s.genMu.RLock()
	n := objNum{s.nextNum, s.gen}
	s.genMu.RUnlock()
	s.objNums.Add(o.key, n)
	o.num, o.gen = n.num, n.gen
}

func (s *Symbolizer) intern(f funcTuple) *function {
	f.name = frame.Truncate(f.name, s.opt.Limits.MaxNameBytes)
	f.system = frame.Truncate(f.system, s.opt.Limits.MaxNameBytes)
	f.file = frame.Truncate(f.file, s.opt.Limits.MaxNameBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.funcs[f]; ok {
		return p
	}
	if s.funcs == nil || s.internBytes > s.opt.internBytes() {
		// Start over, and drop the results with it: no cached result may
		// hold a function the table no longer counts.
		if s.funcs != nil {
			s.results.Purge()
			s.partial.Purge()
		}
		s.funcs = map[funcTuple]*function{}
		s.internBytes = 0
		s.funcBase = s.nextFunc
	}
	p := &function{funcTuple: f, id: s.nextFunc}
	s.nextFunc++
	s.funcs[f] = p
	s.internBytes += p.bytes() + 64
	return p
}

// funcIndex maps a batch's interned functions to its dictionary's
// function indexes: a slice by function number from the table's first
// (base), each entry stamped with the batch's epoch, reused across batches
// (no clearing: an entry of another batch carries another epoch). Numbers
// below base (a table started over during the batch) go to a map.
type funcIndex struct {
	epoch uint64
	base  uint64
	slots []uint64 // epoch<<32 | index
	other map[*function]int32
}

// maxFuncSlots bounds a funcIndex's slice; the interning table's byte
// bound keeps it far below.
const maxFuncSlots = 1 << 22

// funcIndexFor returns a funcIndex for one batch; put it back with
// putFuncIndex.
func (s *Symbolizer) funcIndexFor() *funcIndex {
	fi, _ := s.funcIdx.Get().(*funcIndex)
	if fi == nil {
		fi = &funcIndex{}
	}
	fi.epoch++
	if fi.epoch == 1<<32 { // stamps wrap: start clean
		fi.epoch = 1
		clear(fi.slots)
	}
	s.mu.Lock()
	fi.base = s.funcBase
	s.mu.Unlock()
	fi.other = nil
	return fi
}

func (s *Symbolizer) putFuncIndex(fi *funcIndex) { s.funcIdx.Put(fi) }

// get returns fn's index, adding it to the batch's dictionary through add
// the first time. With add nil (lines written in parallel, after every
// function was added) it only reads.
func (fi *funcIndex) get(fn *function, add func(*function) int32) int32 {
	if fn.id >= fi.base && fn.id-fi.base < maxFuncSlots {
		off := fn.id - fi.base
		if off < uint64(len(fi.slots)) {
			if v := fi.slots[off]; v>>32 == fi.epoch {
				return int32(uint32(v))
			}
		} else {
			fi.slots = append(fi.slots, make([]uint64, off+1-uint64(len(fi.slots)))...)
		}
		idx := add(fn)
		fi.slots[off] = fi.epoch<<32 | uint64(uint32(idx))
		return idx
	}
	if idx, ok := fi.other[fn]; ok {
		return idx
	}
	if fi.other == nil {
		fi.other = map[*function]int32{}
	}
	idx := add(fn)
	fi.other[fn] = idx
	return idx
}

// lookup asks the engine (the result cache missed) and caches the answer.
// Transient failures (fetch, timeout) are not cached, so the next batch
// retries once the object is available; other failures, and answers from
// files short of DWARF, are cached until NegativeTTL.
func (s *Symbolizer) lookup(o *objRef, addr uint64, tr translation, at stamp, buf *[]symbolize.Frame, st *Stats) *result {
	key := addr
	st.CacheMisses++
	r := &result{err: o.err}
	var terr error
	busy := false // named without DWARF only because memory was busy
	if o.h != nil {
		addr, terr = tr.apply(o, addr)
	}
	if terr != nil {
		r.err = terr
	} else if o.h != nil {
		var err error
		*buf, err = o.h.Lookup(addr, (*buf)[:0])
		if len(*buf) > 0 {
			r.lines = make([]rline, len(*buf))
			for i, f := range *buf {
				line, col := f.Line, f.Column
				if !s.opt.Lines {
					line, col = 0, 0
				}
				r.lines[i] = rline{fn: s.intern(funcTuple{f.Function, f.Name, f.File, int64(f.StartLine)}), line: line, col: col}
			}
			if m := o.h.Missing(); m != nil {
				r.missing = frame.Reason(m)
				busy = frame.Transient(m) // the DWARF may be readable next time
			} else if o.pending {
				r.missing = frame.ErrPending.Error()
			}
		} else {
			r.err = err
			if r.err == nil || symbolize.IsUnresolved(r.err) {
				r.err = fmt.Errorf("address %#x: %w", addr, frame.ErrNoDebugInfo)
			}
		}
	}
	// Only addresses that need no translation are cached: the others are
	// looked up through an object opened anyway. Nothing is cached while a
	// better file is on its way: the batch after it arrives must not find
	// this answer.
	k, ok := keyOf(o.num, key)
	if !ok || tr.kind != asIs || r.err != nil && frame.Transient(r.err) || busy || o.pending {
		return r
	}
	s.genMu.RLock()
	if o.gen == s.gen && o.num != 0 {
		if r.err != nil || !o.complete {
			s.partial.Add(k, partialResult{r: r, expires: at.now + int64(s.opt.NegativeTTL), gen: at.gen})
		} else {
			s.results.Add(k, r)
		}
	}
	s.genMu.RUnlock()
	return r
}
