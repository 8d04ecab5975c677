package lru

import (
	"fmt"
	"testing"
)

func TestBoundsAndOrder(t *testing.T) {
	var gone []int
	c := New[int, int](10, 0, func(v int) int64 { return int64(v) }, func(k, _ int) { gone = append(gone, k) })
	c.Add(1, 4)
	c.Add(2, 4)
	if _, ok := c.Get(1); !ok { // 1 becomes most recent
		t.Fatal("1 missing")
	}
	c.Add(3, 4) // 12 > 10: evicts 2, the least recently used
	if _, ok := c.Get(2); ok {
		t.Fatal("2 should be evicted")
	}
	if len(gone) != 1 || gone[0] != 2 {
		t.Fatalf("evicted %v, want [2]", gone)
	}
	if s := c.Stats(); s.Bytes != 8 || s.Entries != 2 || s.Evictions != 1 {
		t.Fatalf("stats %+v", s)
	}
	c.Add(4, 100) // larger than the bound: kept alone
	if _, ok := c.Get(4); !ok || c.Stats().Entries != 1 {
		t.Fatalf("oversized entry: %+v", c.Stats())
	}
}

func TestTouchGrowth(t *testing.T) {
	sizes := map[string]int64{"a": 1, "b": 1}
	c := New[string, string](5, 0, func(v string) int64 { return sizes[v] }, nil)
	c.Add("a", "a")
	c.Add("b", "b")
	sizes["b"] = 5
	c.Touch("b")
	if _, ok := c.Get("a"); ok {
		t.Fatal("a should be evicted after b grew")
	}
	if c.Stats().Bytes != 5 {
		t.Fatalf("bytes %d", c.Stats().Bytes)
	}
}

func TestMaxEntries(t *testing.T) {
	c := New[int, int](0, 2, nil, nil)
	for i := 0; i < 5; i++ {
		c.Add(i, i)
	}
	if s := c.Stats(); s.Entries != 2 {
		t.Fatalf("entries %d", s.Entries)
	}
}

func TestClock(t *testing.T) {
	c := NewClock[int, string](3)
	c.Add(1, "a")
	c.Add(2, "b")
	c.Add(3, "c")
	c.Get(1) // 1 gets a second chance
	c.Add(4, "d")
	if _, ok := c.Get(1); !ok {
		t.Fatal("a referenced entry was evicted")
	}
	if _, ok := c.Get(2); ok {
		t.Fatal("the unreferenced entry should have gone")
	}
	if v, ok := c.Get(4); !ok || v != "d" {
		t.Fatal("new entry missing")
	}
	if s := c.Stats(); s.Entries != 3 || s.Evictions != 1 {
		t.Fatalf("stats %+v", s)
	}
	c.Add(4, "e")
	if v, _ := c.Get(4); v != "e" {
		t.Fatal("replace")
	}
}

func TestClockBytes(t *testing.T) {
	c := NewClockBytes[int, string](100, 10, func(v string) int64 { return int64(len(v)) })
	for i := 0; i < 50; i++ {
		c.Add(i, "abc")
		if s := c.Stats(); s.Bytes > 10 || s.Entries > 3 {
			t.Fatalf("after %d adds: %+v", i+1, s)
		}
	}
	c.Add(100, "0123456789abcdef") // larger than the bound: kept alone
	if s := c.Stats(); s.Entries != 1 {
		t.Fatalf("oversized entry: %+v", s)
	}
	if _, ok := c.Get(100); !ok {
		t.Fatal("newest entry evicted by its own insertion")
	}
	c.Remove(100)
	for i := 0; i < 200; i++ {
		c.Add(i, "ab")
	}
	if s := c.Stats(); s.Bytes != 10 || s.Entries != 5 || len(c.slots) > 100 {
		t.Fatalf("after refill: %+v, %d slots", s, len(c.slots))
	}
}

// TestClockGetMany answers as Get does, hits and misses counted.
func TestClockGetMany(t *testing.T) {
	c := NewClock[uint64, string](100)
	for i := uint64(0); i < 50; i++ {
		c.Add(i*2, fmt.Sprint(i*2))
	}
	keys := make([]uint64, 9000) // more than one chunk
	for i := range keys {
		keys[i] = uint64(i % 100)
	}
	vals, ok := make([]string, len(keys)), make([]bool, len(keys))
	if hits := c.GetMany(keys, vals, ok); hits != 4500 {
		t.Fatalf("%d hits, want 4500", hits)
	}
	for i, k := range keys {
		v, found := c.Get(k)
		if found != ok[i] || v != vals[i] {
			t.Fatalf("key %d: GetMany (%q, %v), Get (%q, %v)", k, vals[i], ok[i], v, found)
		}
	}
	if st := c.Stats(); st.Hits != 4500+4500 || st.Misses != 4500+4500 {
		t.Fatalf("stats %+v", st)
	}
}
