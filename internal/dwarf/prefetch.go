package dwarf

import (
	"sync"
	"sync/atomic"
)

// Prefetch parses the units holding addrs, in the order the addresses
// first name them, on up to workers goroutines, and returns at once; done
// is called when they have finished. A unit already parsed, or being
// parsed by another goroutine (a lookup that got there first), is skipped,
// so lookups following the same addresses find their units ready or wait
// only for the one in progress. Unit parsing is most of a cold lookup's
// work and units are independent: this spreads it over the cores.
func (t *Table) Prefetch(addrs []uint64, workers int, done func()) {
	var todo []*unit
	var last *unit
	seen := map[*unit]bool{}
	for _, a := range addrs {
		u := t.unitFor(a)
		if u == nil || u == last || u.parsed() {
			continue
		}
		last = u
		if !seen[u] {
			seen[u] = true
			todo = append(todo, u)
		}
	}
	workers = min(workers, len(todo))
	if workers <= 0 {
		if done != nil {
			done()
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(workers)
	for range workers {
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(todo)) {
					return
				}
				u := todo[i]
				s := u.state()
				if s.fullDone.Load() || !s.fullMu.TryLock() {
					continue
				}
				t.parseFullLocked(u, s)
				s.fullMu.Unlock()
			}
		}()
	}
	if done != nil {
		go func() {
			wg.Wait()
			done()
		}()
	}
}
