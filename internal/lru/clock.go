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
	mu       sync.RWMutex
	index    map[K]int32
	slots    []clockSlot[K, V]
	hand     int
	cap      int
	maxBytes int64
	bytes    int64
	cost     func(V) int64
	free     []int32 // slots freed by the byte bound or Remove

	hits, misses, evictions atomic.Uint64
}

// clockSlot is kept small: a lookup touches one slot, and many slots
// touched per batch compete for the CPU's cache with everything else. A
// value's cost is not stored; cost must give the same answer for a value
// every time it is asked.
type clockSlot[K comparable, V any] struct {
	key  K
	val  V
	ref  atomic.Bool
	used bool // false for a slot freed to honour the byte bound
}

// NewClock makes a Clock holding at most capacity entries.
func NewClock[K comparable, V any](capacity int) *Clock[K, V] {
	if capacity < 1 {
		capacity = 1
	}
	return &Clock[K, V]{index: make(map[K]int32, min(capacity, 1<<16)), cap: capacity}
}

// NewClockBytes is NewClock with a second bound: the total cost of the
// values, as cost reports it (their bytes, the same for a value each time),
// stays at most maxBytes.
func NewClockBytes[K comparable, V any](capacity int, maxBytes int64, cost func(V) int64) *Clock[K, V] {
	c := NewClock[K, V](capacity)
	c.maxBytes, c.cost = maxBytes, cost
	return c
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

// GetMany looks keys up as Get does, for a batch: vals[i] and ok[i]
// answer keys[i] (vals and ok as long as keys). The read lock is taken once
// per few thousand keys and the counters moved once, so the lookups, free
// of atomic read-modify-writes, overlap their cache misses. It returns the
// hits.
func (c *Clock[K, V]) GetMany(keys []K, vals []V, ok []bool) int {
	const chunk = 4096 // keys per hold of the read lock: writers wait at most this long
	hits := 0
	for lo := 0; lo < len(keys); lo += chunk {
		hi := min(lo+chunk, len(keys))
		c.mu.RLock()
		for i := lo; i < hi; i++ {
			j, found := c.index[keys[i]]
			if !found {
				ok[i] = false
				continue
			}
			s := &c.slots[j]
			vals[i], ok[i] = s.val, true
			if !s.ref.Load() {
				s.ref.Store(true)
			}
			hits++
		}
		c.mu.RUnlock()
	}
	c.hits.Add(uint64(hits))
	c.misses.Add(uint64(len(keys) - hits))
	return hits
}

// Add inserts or replaces k, evicting entries not used since the hand last
// passed them when the cache is full (in entries or in bytes).
func (c *Clock[K, V]) Add(k K, v V) {
	cost := c.costOf(v)
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[k]; ok {
		s := &c.slots[i]
		c.bytes += cost - c.costOf(s.val)
		s.val = v
		s.ref.Store(true)
		c.shrink(int(i), 1)
		return
	}
	if c.maxBytes > 0 {
		c.bytes += cost
		c.shrink(-1, 0)
		c.bytes -= cost
	}
	var i int
	switch {
	case len(c.free) > 0:
		i = int(c.free[len(c.free)-1])
		c.free = c.free[:len(c.free)-1]
	case len(c.slots) < c.cap:
		c.slots = append(c.slots, clockSlot[K, V]{})
		i = len(c.slots) - 1
	default:
		i = c.victim(-1)
		s := &c.slots[i]
		delete(c.index, s.key)
		c.bytes -= c.costOf(s.val)
		c.evictions.Add(1)
	}
	s := &c.slots[i]
	s.key, s.val, s.used = k, v, true
	s.ref.Store(false)
	c.index[k] = int32(i)
	c.bytes += cost
}

// victim advances the hand to a used slot not referenced since the hand
// last passed it, other than keep.
func (c *Clock[K, V]) victim(keep int) int {
	for {
		i := c.hand
		c.hand = (c.hand + 1) % len(c.slots)
		s := &c.slots[i]
		if i == keep || !s.used {
			continue
		}
		if s.ref.Load() {
			s.ref.Store(false)
			continue
		}
		return i
	}
}

// shrink frees slots until the byte bound holds, keeping slot keep and at
// least floor entries.
func (c *Clock[K, V]) shrink(keep, floor int) {
	for c.maxBytes > 0 && c.bytes > c.maxBytes && len(c.index) > floor {
		c.release(c.victim(keep))
		c.evictions.Add(1)
	}
}

// release empties slot i and puts it on the free list.
func (c *Clock[K, V]) release(i int) {
	s := &c.slots[i]
	delete(c.index, s.key)
	c.bytes -= c.costOf(s.val)
	var zero V
	var zk K
	s.key, s.val, s.used = zk, zero, false
	c.free = append(c.free, int32(i))
}

func (c *Clock[K, V]) costOf(v V) int64 {
	if c.cost == nil {
		return 0
	}
	return c.cost(v)
}

// Stats returns the cache's counters (Bytes only with NewClockBytes).
func (c *Clock[K, V]) Stats() Stats {
	c.mu.RLock()
	n, b := len(c.index), c.bytes
	c.mu.RUnlock()
	return Stats{Entries: n, Bytes: b, Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}

// Remove drops k.
func (c *Clock[K, V]) Remove(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[k]; ok {
		c.release(int(i))
	}
}

// Purge drops every entry.
func (c *Clock[K, V]) Purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.index)
	clear(c.index)
	c.slots, c.free, c.hand, c.bytes = nil, nil, 0, 0
	c.evictions.Add(uint64(n))
}
