// Package lru is a least-recently-used cache bounded by the total cost
// (bytes) of its values and, optionally, by entry count. Costs may grow after
// insertion (objects parse lazily), so callers report growth with Touch.
package lru

import (
	"container/list"
	"sync"
)

// Cache is safe for concurrent use.
type Cache[K comparable, V any] struct {
	mu         sync.Mutex
	maxBytes   int64
	maxEntries int
	cost       func(K, V) int64
	onEvict    func(K, V)
	ll         *list.List
	items      map[K]*list.Element
	bytes      int64

	hits, misses, evictions uint64
}

type entry[K comparable, V any] struct {
	key  K
	val  V
	cost int64
}

// New makes a cache holding at most maxBytes of cost (0: no byte bound) and
// maxEntries entries (0: no count bound). onEvict, if set, runs for every
// value that leaves the cache, outside the cache's lock.
func New[K comparable, V any](maxBytes int64, maxEntries int, cost func(V) int64, onEvict func(K, V)) *Cache[K, V] {
	if cost == nil {
		cost = func(V) int64 { return 1 }
	}
	return NewKeyed(maxBytes, maxEntries, func(_ K, v V) int64 { return cost(v) }, onEvict)
}

// NewKeyed is New with a cost that also sees the key (for caches whose keys
// are as large as their values, such as names).
func NewKeyed[K comparable, V any](maxBytes int64, maxEntries int, cost func(K, V) int64, onEvict func(K, V)) *Cache[K, V] {
	return &Cache[K, V]{maxBytes: maxBytes, maxEntries: maxEntries, cost: cost, onEvict: onEvict,
		ll: list.New(), items: map[K]*list.Element{}}
}

// Get returns the value for k and marks it most recently used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		c.ll.MoveToFront(el)
		c.hits++
		return el.Value.(*entry[K, V]).val, true
	}
	c.misses++
	var zero V
	return zero, false
}

// Add inserts or replaces k. The newest entry is never evicted by its own
// insertion, so a single value larger than the bound still gets used once.
func (c *Cache[K, V]) Add(k K, v V) {
	c.mu.Lock()
	var evicted []*entry[K, V]
	if el, ok := c.items[k]; ok {
		old := el.Value.(*entry[K, V])
		c.bytes -= old.cost
		if c.onEvict != nil {
			evicted = append(evicted, &entry[K, V]{key: old.key, val: old.val})
		}
		old.val, old.cost = v, c.cost(k, v)
		c.bytes += old.cost
		c.ll.MoveToFront(el)
	} else {
		e := &entry[K, V]{key: k, val: v, cost: c.cost(k, v)}
		c.items[k] = c.ll.PushFront(e)
		c.bytes += e.cost
	}
	evicted = c.shrink(evicted)
	c.mu.Unlock()
	c.notify(evicted)
}

// Touch recomputes k's cost (after it grew) and evicts others if needed.
func (c *Cache[K, V]) Touch(k K) {
	c.mu.Lock()
	el, ok := c.items[k]
	if !ok {
		c.mu.Unlock()
		return
	}
	e := el.Value.(*entry[K, V])
	nc := c.cost(e.key, e.val)
	c.bytes += nc - e.cost
	e.cost = nc
	evicted := c.shrink(nil)
	c.mu.Unlock()
	c.notify(evicted)
}

// Remove drops k.
func (c *Cache[K, V]) Remove(k K) {
	c.mu.Lock()
	var evicted []*entry[K, V]
	if el, ok := c.items[k]; ok {
		evicted = append(evicted, c.removeLocked(el))
	}
	c.mu.Unlock()
	c.notify(evicted)
}

// EvictWhere evicts, least recently used first, the entries pick selects,
// one at a time (onEvict runs after each), until enough reports true or
// none is left. It returns how many it evicted. For a cache whose values
// hold a resource that something else ran short of.
func (c *Cache[K, V]) EvictWhere(pick func(K, V) bool, enough func() bool) int {
	c.mu.Lock()
	var keys []K
	for el := c.ll.Back(); el != nil; el = el.Prev() {
		if e := el.Value.(*entry[K, V]); pick(e.key, e.val) {
			keys = append(keys, e.key)
		}
	}
	c.mu.Unlock()
	n := 0
	for _, k := range keys {
		if enough() {
			break
		}
		c.mu.Lock()
		el, ok := c.items[k]
		if !ok || !pick(k, el.Value.(*entry[K, V]).val) {
			c.mu.Unlock()
			continue
		}
		evicted := []*entry[K, V]{c.removeLocked(el)}
		c.evictions++
		c.mu.Unlock()
		c.notify(evicted)
		n++
	}
	return n
}

// Purge empties the cache.
func (c *Cache[K, V]) Purge() {
	c.mu.Lock()
	var evicted []*entry[K, V]
	for c.ll.Len() > 0 {
		evicted = append(evicted, c.removeLocked(c.ll.Back()))
	}
	c.mu.Unlock()
	c.notify(evicted)
}

func (c *Cache[K, V]) shrink(evicted []*entry[K, V]) []*entry[K, V] {
	for c.ll.Len() > 1 && ((c.maxBytes > 0 && c.bytes > c.maxBytes) || (c.maxEntries > 0 && c.ll.Len() > c.maxEntries)) {
		evicted = append(evicted, c.removeLocked(c.ll.Back()))
		c.evictions++
	}
	return evicted
}

func (c *Cache[K, V]) removeLocked(el *list.Element) *entry[K, V] {
	e := el.Value.(*entry[K, V])
	c.ll.Remove(el)
	delete(c.items, e.key)
	c.bytes -= e.cost
	return e
}

func (c *Cache[K, V]) notify(evicted []*entry[K, V]) {
	if c.onEvict == nil {
		return
	}
	for _, e := range evicted {
		c.onEvict(e.key, e.val)
	}
}

// Stats is a snapshot of the cache's counters.
type Stats struct {
	Entries                 int
	Bytes                   int64
	Hits, Misses, Evictions uint64
}

// Stats returns the current counters.
func (c *Cache[K, V]) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Entries: c.ll.Len(), Bytes: c.bytes, Hits: c.hits, Misses: c.misses, Evictions: c.evictions}
}

// Peek returns the value for k without marking it used or counting a hit.
func (c *Cache[K, V]) Peek(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		return el.Value.(*entry[K, V]).val, true
	}
	var zero V
	return zero, false
}
