package lru

import (
	"sync"
	"sync/atomic"
)

// Clock is a fixed-capacity cache with CLOCK (second chance) eviction: a
// hit only sets a reference bit under a read lock, so concurrent readers do
// not serialize on list updates the way an exact LRU makes them. It suits
// caches of many small entries read far more often than written, such as
// resolved addresses.
type Clock[K comparable, V any] struct {
	mu    sync.RWMutex
	index map[K]int32
	slots []clockSlot[K, V]
	hand  int
	cap   int

	hits, misses, evictions atomic.Uint64
}

type clockSlot[K comparable, V any] struct {
	key K
	val V
	ref atomic.Bool
}

// NewClock makes a Clock holding at most capacity entries.
func NewClock[K comparable, V any](capacity int) *Clock[K, V] {
	if capacity < 1 {
		capacity = 1
	}
	return &Clock[K, V]{index: make(map[K]int32, min(capacity, 1<<16)), cap: capacity}
}

// Get returns the value for k.
func (c *Clock[K, V]) Get(k K) (V, bool) {
	c.mu.RLock()
	i, ok := c.index[k]
	if !ok {
		c.mu.RUnlock()
		c.misses.Add(1)
		var zero V
		return zero, false
	}
	s := &c.slots[i]
	v := s.val
	if !s.ref.Load() {
		s.ref.Store(true)
	}
	c.mu.RUnlock()
	c.hits.Add(1)
	return v, true
}

// Add inserts or replaces k, evicting an entry not used since the hand last
// passed it when the cache is full.
func (c *Clock[K, V]) Add(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[k]; ok {
		c.slots[i].val = v
		c.slots[i].ref.Store(true)
		return
	}
	if len(c.slots) < c.cap {
		c.slots = append(c.slots, clockSlot[K, V]{key: k, val: v})
		c.index[k] = int32(len(c.slots) - 1)
		return
	}
	for {
		s := &c.slots[c.hand]
		if s.ref.Load() {
			s.ref.Store(false)
			c.hand = (c.hand + 1) % len(c.slots)
			continue
		}
		delete(c.index, s.key)
		s.key, s.val = k, v
		c.index[k] = int32(c.hand)
		c.hand = (c.hand + 1) % len(c.slots)
		c.evictions.Add(1)
		return
	}
}

// Stats returns the cache's counters (Bytes is not tracked).
func (c *Clock[K, V]) Stats() Stats {
	c.mu.RLock()
	n := len(c.index)
	c.mu.RUnlock()
	return Stats{Entries: n, Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}
