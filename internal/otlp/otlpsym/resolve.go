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
	var need map[*objRef]bool
	miss := func(w *work) {
		if need == nil {
			need = map[*objRef]bool{}
		}
		need[w.obj] = true
	}
	at := s.stamp()
	// The cache's keys for what needs no translation, looked up in one
	// pass (lru.Clock.GetMany), then the partial answers for the misses.
	keys := make([]uint64, 0, len(todo))
	which := make([]int32, 0, len(todo))
	s.genMu.RLock()
	for i := range todo {
		w := &todo[i]
		if w.obj.fail != nil {
			answers[i] = w.obj.fail
			continue
		}
		k, ok := keyOf(w.obj.num, w.addr)
		if w.tr.kind != asIs || !ok || w.obj.gen != s.gen || w.obj.num == 0 {
			miss(w) // a translation is only known once the object is open
			continue
		}
		keys = append(keys, k)
		which = append(which, int32(i))
	}
	vals, found := make([]*result, len(keys)), make([]bool, len(keys))
	var hits atomic.Int64
	parallel(len(keys), func(lo, hi int) {
		hits.Add(int64(s.results.GetMany(keys[lo:hi], vals[lo:hi], found[lo:hi])))
	})
	st.CacheHits += hits.Load()
	for j, i := range which {
		if found[j] {
			answers[i] = vals[j]
			continue
		}
		if p, ok := s.partial.Get(keys[j]); ok && at.now < p.expires && p.gen == at.gen {
			answers[i] = p.r
			st.CacheHits++
			continue
		}
		miss(&todo[i])
	}
	s.genMu.RUnlock()
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
	for _, r := range answers {
		switch {
		case r.err != nil:
			st.unresolved(frame.Reason(r.err))
		case r.missing != "":
			st.Resolved++
			st.incomplete(r.missing)
		default:
			st.Resolved++
		}
	}
	return answers
}
