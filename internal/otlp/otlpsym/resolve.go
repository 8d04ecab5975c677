package otlpsym

import (
	"context"

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
	at := s.stamp()
	s.genMu.RLock()
	for i := range todo {
		w := &todo[i]
		if w.obj.fail != nil {
			answers[i] = w.obj.fail
			continue
		}
		if w.tr.kind == asIs {
			if r, ok := s.cachedLocked(w.obj, w.addr, at); ok {
				answers[i] = r
				st.CacheHits++
				continue
			}
		} // else the translation is only known once the object is open
		if need == nil {
			need = map[*objRef]bool{}
		}
		need[w.obj] = true
	}
	s.genMu.RUnlock()
	if len(need) > 0 {
		b.hints(need)
		s.openAll(ctx, need)
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
