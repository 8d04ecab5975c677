package golabels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// fakeMem is process memory at base: reads outside b fail.
type fakeMem struct {
	base  uint64
	b     []byte
	reads int
}

func (m *fakeMem) Read(addr uint64, p []byte) error {
	m.reads++
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return fmt.Errorf("read of %d at %#x: %w", len(p), addr, errors.New("fault"))
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

const memBase = 0x10000

// memBuilder lays out Go values in a fakeMem.
type memBuilder struct{ b []byte }

func (w *memBuilder) alloc(n int) uint64 {
	n = (n + 7) &^ 7
	a := memBase + uint64(len(w.b))
	w.b = append(w.b, make([]byte, n)...)
	return a
}

func (w *memBuilder) put(addr, v uint64) { binary.LittleEndian.PutUint64(w.b[addr-memBase:], v) }

func (w *memBuilder) str(s string) (uint64, uint64) {
	a := w.alloc(len(s) + 1)
	copy(w.b[a-memBase:], s)
	return a, uint64(len(s))
}

func (w *memBuilder) mem() *fakeMem { return &fakeMem{base: memBase, b: w.b} }

// sliceSet lays out labelMap{Set{List: labels}} (Go 1.24+) and returns its address.
func sliceSet(w *memBuilder, labels []Label) uint64 {
	data := w.alloc(32 * len(labels))
	for i, l := range labels {
		kp, kn := w.str(l.Key)
		vp, vn := w.str(l.Value)
		e := data + uint64(32*i)
		w.put(e, kp)
		w.put(e+8, kn)
		w.put(e+16, vp)
		w.put(e+24, vn)
	}
	hdr := w.alloc(24)
	w.put(hdr, data)
	w.put(hdr+8, uint64(len(labels)))
	w.put(hdr+16, uint64(len(labels)))
	return hdr
}

// mapSet lays out a *map[string]string (Go 1.9-1.23) of 2^b buckets, the
// labels spread over them with overflow buckets past 8 a bucket, and
// returns its address.
func mapSet(w *memBuilder, labels []Label, b uint8) uint64 {
	nb := 1 << b
	buckets := w.alloc(bucketSize * nb)
	fill := make([]int, nb)
	last := make([]uint64, nb)
	for i := range last {
		last[i] = buckets + uint64(bucketSize*i)
	}
	for i, l := range labels {
		bi := i % nb
		if fill[bi] == bucketCnt {
			ov := w.alloc(bucketSize)
			w.put(last[bi]+bucketOverflw, ov)
			last[bi], fill[bi] = ov, 0
		}
		cell := fill[bi]
		fill[bi]++
		bk := last[bi]
		w.b[bk-memBase+uint64(cell)] = minTopHash + uint8(i%200)
		kp, kn := w.str(l.Key)
		vp, vn := w.str(l.Value)
		w.put(bk+8+uint64(16*cell), kp)
		w.put(bk+16+uint64(16*cell), kn)
		w.put(bk+bucketValues+uint64(16*cell), vp)
		w.put(bk+bucketValues+8+uint64(16*cell), vn)
	}
	h := w.alloc(hmapSize)
	w.put(h, uint64(len(labels)))
	w.b[h-memBase+hmapB] = b
	w.put(h+hmapBuckets, buckets)
	v := w.alloc(8)
	w.put(v, h)
	return v
}

var lim = Limits{MaxLabels: 16, MaxBytes: 64}

func TestReadSets(t *testing.T) {
	want := []Label{{Key: "request", Value: "a"}, {Key: "span_id", Value: "00f067aa0ba902b7"}, {Key: "user", Value: ""}}
	for _, slice := range []bool{false, true} {
		for _, b := range []uint8{0, 2} {
			w := &memBuilder{}
			var p uint64
			if slice {
				p = sliceSet(w, want)
			} else {
				p = mapSet(w, []Label{want[2], want[0], want[1]}, b)
			}
			got, err := Read(w.mem(), p, Layout{Slice: slice}, lim)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("slice %v, B %d: %v, %v; want %v", slice, b, got, err, want)
			}
		}
	}
}

// TestReadBounds: many labels, long keys and values are cut to Limits.
func TestReadBounds(t *testing.T) {
	var many []Label
	for i := range 40 {
		many = append(many, Label{Key: fmt.Sprintf("k%02d-%s", i, string(make([]byte, 100))), Value: "v"})
	}
	for _, slice := range []bool{false, true} {
		w := &memBuilder{}
		p := mapSet(w, many, 0) // 40 in one bucket chain: 5 overflow buckets
		if slice {
			p = sliceSet(w, many)
		}
		got, err := Read(w.mem(), p, Layout{Slice: slice}, Limits{MaxLabels: 10, MaxBytes: 8})
		if err != nil || len(got) != 10 {
			t.Fatalf("slice %v: %d labels, %v; want 10", slice, len(got), err)
		}
		for _, l := range got {
			if len(l.Key) > 8 || len(l.Value) > 8 {
				t.Errorf("slice %v: %q=%q longer than 8 bytes", slice, l.Key, l.Value)
			}
		}
	}
}

// TestForgedSets: forged label sets end in an error or a bounded set,
// quickly, after a bounded number of reads.
func TestForgedSets(t *testing.T) {
	cases := map[string]func(w *memBuilder) (uint64, bool){
		"slice length huge": func(w *memBuilder) (uint64, bool) {
			p := sliceSet(w, []Label{{Key: "a", Value: "b"}})
			w.put(p+8, 1<<62)
			return p, true
		},
		"string length huge": func(w *memBuilder) (uint64, bool) {
			p := sliceSet(w, []Label{{Key: "a", Value: "b"}})
			data := binary.LittleEndian.Uint64(w.b[p-memBase:])
			w.put(data+8, 1<<63)
			return p, true
		},
		"slice data wild": func(w *memBuilder) (uint64, bool) {
			p := sliceSet(w, []Label{{Key: "a", Value: "b"}})
			w.put(p, 0xdead0000)
			return p, true
		},
		"map B huge": func(w *memBuilder) (uint64, bool) {
			p := mapSet(w, []Label{{Key: "a", Value: "b"}}, 0)
			h := binary.LittleEndian.Uint64(w.b[p-memBase:])
			w.b[h-memBase+hmapB] = 60
			return p, false
		},
		"overflow cycle": func(w *memBuilder) (uint64, bool) {
			p := mapSet(w, []Label{{Key: "a", Value: "b"}}, 0)
			h := binary.LittleEndian.Uint64(w.b[p-memBase:])
			bk := binary.LittleEndian.Uint64(w.b[h-memBase+hmapBuckets:])
			w.put(bk+bucketOverflw, bk) // its own overflow
			return p, false
		},
		"buckets nil": func(w *memBuilder) (uint64, bool) {
			p := mapSet(w, []Label{{Key: "a", Value: "b"}}, 0)
			h := binary.LittleEndian.Uint64(w.b[p-memBase:])
			w.put(h+hmapBuckets, 0)
			return p, false
		},
		"pointer wild": func(*memBuilder) (uint64, bool) { return 0xffff_ffff_ffff_fff0, true },
	}
	for name, forge := range cases {
		t.Run(name, func(t *testing.T) {
			w := &memBuilder{}
			p, slice := forge(w)
			m := w.mem()
			start := time.Now()
			got, err := Read(m, p, Layout{Slice: slice}, lim)
			if len(got) > lim.MaxLabels {
				t.Errorf("%d labels", len(got))
			}
			if m.reads > 4*maxBuckets {
				t.Errorf("%d reads", m.reads)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("took %v", d)
			}
			t.Logf("%d labels, err %v, %d reads", len(got), err, m.reads)
		})
	}
}

func FuzzRead(f *testing.F) {
	for _, slice := range []bool{false, true} {
		w := &memBuilder{}
		var p uint64
		if slice {
			p = sliceSet(w, []Label{{Key: "request", Value: "a"}, {Key: "k", Value: "v"}})
		} else {
			p = mapSet(w, []Label{{Key: "request", Value: "a"}, {Key: "k", Value: "v"}}, 1)
		}
		f.Add(w.b, p, slice)
	}
	f.Fuzz(func(t *testing.T, b []byte, p uint64, slice bool) {
		if len(b) > 1<<16 {
			return
		}
		m := &fakeMem{base: memBase, b: b}
		got, _ := Read(m, p, Layout{Slice: slice}, lim)
		if len(got) > lim.MaxLabels {
			t.Fatalf("%d labels", len(got))
		}
		for _, l := range got {
			if len(l.Key) > lim.MaxBytes || len(l.Value) > lim.MaxBytes {
				t.Fatalf("%q=%q past %d bytes", l.Key, l.Value, lim.MaxBytes)
			}
		}
		if m.reads > maxBuckets+3*maxCells+8 {
			t.Fatalf("%d reads", m.reads)
		}
	})
}
