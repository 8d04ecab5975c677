package otlpsym

import (
	"context"
	"sync/atomic"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize"
)

// resolve answers every item of todo, for Profiles and Logs alike: fixed
// failures as they are, then the result cache, in a tight loop over the
// cache alone; only for the misses are the objects located and opened
// (MaxParallel at a time, see openAll) and asked. It counts every answer in
// st (cache hits and misses; resolved, unresolved and incomplete by
// reason). answers[i] answers todo[i] and is never nil.
func (s *Symbolizer) resolve(ctx context.Context, b *batch, todo []work, st *Stats) []*result {
	answers := make([]*result, len(todo))
	if len(todo) == 0 {
		return answers
	}
	for _, o := range b.objs {
		s.number(o)
	}
	at := s.stamp()
	// The caches, a share of todo per core: each share looks the keys of
	// what needs no translation up in one pass (lru.Clock.GetMany), then
	// the partial answers for its misses, and keeps the rest, in order,
	// for the lookups below.
	n := shares(len(todo))
	misses := make([][]int32, n)
	var hits atomic.Int64
	s.genMu.RLock()
	gen := s.gen
	parallel(len(todo), n, func(k, lo, hi int) {
		keys := make([]uint64, 0, hi-lo)
		which := make([]int32, 0, hi-lo)
		var miss []int32
		for i := lo; i < hi; i++ {
			w := &todo[i]
			if w.obj.fail != nil {
				answers[i] = w.obj.fail
				continue
			}
			key, ok := keyOf(w.obj.num, w.addr)
			if w.tr.kind != asIs || !ok || w.obj.gen != gen || w.obj.num == 0 {
				miss = append(miss, int32(i)) // a translation is only known once the object is open
				continue
			}
			keys = append(keys, key)
			which = append(which, int32(i))
		}
		vals, found := make([]*result, len(keys)), make([]bool, len(keys))
		h := int64(s.results.GetMany(keys, vals, found))
		for j, i := range which {
			if found[j] {
				answers[i] = vals[j]
				continue
			}
			if p, ok := s.partial.Get(keys[j]); ok && at.now < p.expires && p.gen == at.gen {
				answers[i] = p.r
				h++
				continue
			}
			miss = append(miss, i)
		}
		hits.Add(h)
		misses[k] = miss
	})
	s.genMu.RUnlock()
	st.CacheHits += hits.Load()
	var need map[*objRef]bool
	for _, miss := range misses {
		for _, i := range miss {
			if need == nil {
				need = map[*objRef]bool{}
			}
			need[todo[i].obj] = true
		}
	}
	if len(need) > 0 {
		b.hints(need)
		s.openAll(ctx, need)
		// Parse the units the misses fall in on every core, ahead of the
		// lookups below, which take them in the batch's order.
		ahead := map[*objRef][]uint64{}
		for i := range todo {
			if w := &todo[i]; answers[i] == nil && w.obj.h != nil && w.tr.kind == asIs {
				ahead[w.obj] = append(ahead[w.obj], w.addr)
			}
		}
		for o, addrs := range ahead {
			o.h.Prefetch(addrs, 0)
		}
		var buf []symbolize.Frame
		for i := range todo {
			if answers[i] == nil {
				w := &todo[i]
				answers[i] = s.lookup(w.obj, w.addr, w.tr, at, &buf, st)
			}
		}
		for o := range need {
			if o.h != nil {
				o.h.Close()
			}
		}
	}
	// Counted a share per core too: a failure's reason takes a walk of
	// its error chain.
	counts := make([]Stats, n)
	parallel(len(answers), n, func(k, lo, hi int) {
		c := &counts[k]
		for _, r := range answers[lo:hi] {
			switch {
			case r.err != nil:
				c.unresolved(frame.Reason(r.err))
			case r.missing != "":
				c.Resolved++
				c.incomplete(r.missing)
			default:
				c.Resolved++
			}
		}
	})
	for _, c := range counts {
		st.add(c)
	}
	return answers
}
