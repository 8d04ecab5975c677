// Package sharedcomponent keeps one instance per component configuration,
// shared by every pipeline made from it: one eBPF sampler for a receiver in
// a profiles and a logs pipeline, one set of symbolizer caches for a
// processor in both, so what the configuration bounds is bounded once.
package sharedcomponent

import "sync"

// Map holds the instances by key (a component's *Config), each with the
// number of pipelines using it. The zero Map is not usable; call NewMap.
type Map[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*entry[V]
}

type entry[V any] struct {
	v     V
	users int
}

// NewMap returns an empty Map.
func NewMap[K comparable, V any]() *Map[K, V] {
	return &Map[K, V]{m: map[K]*entry[V]{}}
}

// Acquire returns key's instance and counts one more user, calling create
// (under the Map's lock, so two pipelines never make two) when there is
// none. A failed create leaves nothing behind.
func (m *Map[K, V]) Acquire(key K, create func() (V, error)) (V, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.m[key]; e != nil {
		e.users++
		return e.v, nil
	}
	v, err := create()
	if err != nil {
		return v, err
	}
	m.m[key] = &entry[V]{v: v, users: 1}
	return v, nil
}

// Release counts one user less of key's instance. When that was the last,
// the instance leaves the Map (a later Acquire makes a new one) and last
// is true: the caller shuts v down. Each Acquire is released once.
func (m *Map[K, V]) Release(key K) (v V, last bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.m[key]
	if e == nil {
		return v, false
	}
	if e.users--; e.users > 0 {
		return e.v, false
	}
	delete(m.m, key)
	return e.v, true
}

// Get returns key's instance and its number of users, if it has one.
func (m *Map[K, V]) Get(key K) (v V, users int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.m[key]; e != nil {
		return e.v, e.users, true
	}
	return v, 0, false
}

// Len is the number of instances held.
func (m *Map[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
