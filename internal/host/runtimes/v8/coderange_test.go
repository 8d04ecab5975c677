package v8

import (
	"testing"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// isolateMaps is the executable mappings of node 20 running four worker
// threads (as /proc/PID/maps showed them): the file's own text, then per
// isolate its JIT code (anonymous, rwx) at the bottom of its code range and
// its copy of the builtins near the top, each range 640 MB above the last;
// libc above them all. extra is added in order.
func isolateMaps(node *normalize.FileInfo, extra ...normalize.Mapping) *normalize.Process {
	p := &normalize.Process{PID: 1}
	add := func(m normalize.Mapping) {
		for i, o := range p.Mappings {
			if o.Start > m.Start {
				p.Mappings = append(p.Mappings[:i], append([]normalize.Mapping{m}, p.Mappings[i:]...)...)
				return
			}
		}
		p.Mappings = append(p.Mappings, m)
	}
	add(normalize.Mapping{Start: 0xb72000, End: 0x25fe000, Offset: 0x772000, Path: "/usr/bin/node", File: node})
	for _, r := range [][2]uint64{
		{0x7ffb30003000, 0x7ffb4fe40000},
		{0x7ffb58003000, 0x7ffb77e40000},
		{0x7ffb78003000, 0x7ffb97e40000},
		{0x7ffba0003000, 0x7ffbbfe40000},
		{0x7ffbc77c3000, 0x7ffbe7600000},
	} {
		add(normalize.Mapping{Start: r[0], End: r[0] + 0x3c000, Anonymous: true})
		add(normalize.Mapping{Start: r[1], End: r[1] + 0x192000, Offset: 0x14c4000, Path: "/usr/bin/node", File: node})
	}
	add(normalize.Mapping{
		Start: 0x7ffbe8244000, End: 0x7ffbe839a000, Offset: 0x26000, Path: "/usr/lib/x86_64-linux-gnu/libc.so.6",
		File: &normalize.FileInfo{ID: normalize.FileID{Ino: 2}, Loads: []elfx.Segment{{Off: 0, Vaddr: 0, Filesz: 0x200000}}},
	})
	for _, m := range extra {
		add(m)
	}
	return p
}

// TestCodeRangeIsolates: each isolate's copy of the builtins is given to
// the walker (interpreted frames are told by a PC in one), and the code
// span covers every isolate's JIT code, but never another file's code.
func TestCodeRangeIsolates(t *testing.T) {
	node := &normalize.FileInfo{ID: normalize.FileID{Ino: 1}, Loads: []elfx.Segment{{Off: 0, Vaddr: 0x400000, Filesz: 0x5300000}}}
	fi := &fileInfo{blobLo: 0x18c4000, blobHi: 0x18c4000 + 0x192000, blobFileLo: 0x14c4000}
	own := func(p *normalize.Process) *normalize.Mapping { return &p.Mappings[0] }
	copyAt := func(a uint64) [2]uint64 { return [2]uint64{a, a + 0x192000} }
	most := len(bpf.ProfileV8Proc{}.Blob) - 1

	p := isolateMaps(node)
	copies, cr, left, ok := codeRange(p, own(p), fi, most)
	want := [][2]uint64{copyAt(0x7ffb4fe40000), copyAt(0x7ffb77e40000), copyAt(0x7ffb97e40000), copyAt(0x7ffbbfe40000), copyAt(0x7ffbe7600000)}
	if !ok || left != 0 || len(copies) != len(want) || cr != [2]uint64{0x7ffb30003000, 0x7ffbe7792000} {
		t.Fatalf("five isolates: copies %x, span %x, %d left, ok %v; want copies %x, span 7ffb30003000-7ffbe7792000", copies, cr, left, ok, want)
	}
	for i := range want {
		if copies[i] != want[i] {
			t.Errorf("copy %d: %x, want %x", i, copies[i], want[i])
		}
	}

	// A native addon loaded between two isolates' ranges: the span stops
	// below it, and the isolates above are left (their frames stay native).
	addon := normalize.Mapping{
		Start: 0x7ffb80000000, End: 0x7ffb80010000, Path: "/srv/addon.node",
		File: &normalize.FileInfo{ID: normalize.FileID{Ino: 3}, Loads: []elfx.Segment{{Off: 0, Vaddr: 0, Filesz: 0x10000}}},
	}
	p = isolateMaps(node, addon)
	copies, cr, left, ok = codeRange(p, own(p), fi, most)
	if !ok || len(copies) != 2 || left != 3 || cr[0] != 0x7ffb30003000 || cr[1] > addon.Start || cr[1] != 0x7ffb7803f000 {
		t.Errorf("an addon between isolates: copies %x, span %x, %d left, ok %v; want 2 copies, span 7ffb30003000-7ffb7803f000, 3 left", copies, cr, left, ok)
	}

	// More isolates than the walker's entry holds.
	p = isolateMaps(node)
	copies, _, left, _ = codeRange(p, own(p), fi, 2)
	if len(copies) != 2 || left != 3 {
		t.Errorf("room for 2: %d copies, %d left", len(copies), left)
	}
}
