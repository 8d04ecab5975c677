package v8

import (
	"slices"
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
// spans cover every isolate's JIT code, but never another file's code.
func TestCodeRangeIsolates(t *testing.T) {
	node := &normalize.FileInfo{ID: normalize.FileID{Ino: 1}, Loads: []elfx.Segment{{Off: 0, Vaddr: 0x400000, Filesz: 0x5300000}}}
	fi := &fileInfo{blobLo: 0x18c4000, blobHi: 0x18c4000 + 0x192000, blobFileLo: 0x14c4000}
	own := func(p *normalize.Process) *normalize.Mapping { return &p.Mappings[0] }
	copyAt := func(a uint64) [2]uint64 { return [2]uint64{a, a + 0x192000} }
	most := len(bpf.ProfileV8Proc{}.Blob) - 1
	spans := len(bpf.ProfileUnwindProc{}.Rt) - 1
	check := func(what string, copies, jit [][2]uint64, left int, wantCopies, wantJIT [][2]uint64, wantLeft int) {
		t.Helper()
		if !slices.Equal(copies, wantCopies) || !slices.Equal(jit, wantJIT) || left != wantLeft {
			t.Errorf("%s: copies %x, spans %x, %d left; want copies %x, spans %x, %d left", what, copies, jit, left, wantCopies, wantJIT, wantLeft)
		}
	}
	all := [][2]uint64{copyAt(0x7ffb4fe40000), copyAt(0x7ffb77e40000), copyAt(0x7ffb97e40000), copyAt(0x7ffbbfe40000), copyAt(0x7ffbe7600000)}

	p := isolateMaps(node)
	copies, jit, left := codeRange(p, own(p), fi, most, spans)
	check("five isolates", copies, jit, left, all, [][2]uint64{{0x7ffb30003000, 0x7ffbe7792000}}, 0)

	// A native addon loaded between two isolates' ranges: the span stops
	// below it and another begins above it.
	addon := normalize.Mapping{
		Start: 0x7ffb80000000, End: 0x7ffb80010000, Path: "/srv/addon.node",
		File: &normalize.FileInfo{ID: normalize.FileID{Ino: 3}, Loads: []elfx.Segment{{Off: 0, Vaddr: 0, Filesz: 0x10000}}},
	}
	p = isolateMaps(node, addon)
	copies, jit, left = codeRange(p, own(p), fi, most, spans)
	check("an addon between isolates", copies, jit, left, all,
		[][2]uint64{{0x7ffb30003000, 0x7ffb7803f000}, {0x7ffb97e40000, 0x7ffbe7792000}}, 0)
	// With room for one span, the larger cluster is taken and the
	// isolates below the addon are left (their frames stay native).
	copies, jit, left = codeRange(p, own(p), fi, most, 1)
	check("an addon, one span", copies, jit, left, all[2:], [][2]uint64{{0x7ffb97e40000, 0x7ffbe7792000}}, 2)

	// More isolates than the walker's entry holds.
	p = isolateMaps(node)
	copies, _, left = codeRange(p, own(p), fi, 2, spans)
	if len(copies) != 2 || left != 3 {
		t.Errorf("room for 2: %d copies, %d left", len(copies), left)
	}

	// Worker isolates whose code ranges V8 placed right above node's heap,
	// within reach of its own builtins: no copies, and JIT code 120 GB
	// below the main isolate's (as node 22 ran in TestCollectorNodeWorker:
	// their leaf frames were left native). They get a span of their own,
	// ahead of a larger cluster farther away without copies.
	var near []normalize.Mapping
	for _, a := range []uint64{0x21843000, 0x41843000, 0x61843000} {
		near = append(near, normalize.Mapping{Start: a, End: a + 0x3c000, Anonymous: true})
	}
	stray := normalize.Mapping{Start: 0x500000000000, End: 0x500001000000, Anonymous: true}
	p = isolateMaps(node, append(near, stray)...)
	copies, jit, left = codeRange(p, own(p), fi, most, 2)
	check("isolates near the binary", copies, jit, left, all,
		[][2]uint64{{0x21843000, 0x6187f000}, {0x7ffb30003000, 0x7ffbe7792000}}, 1)
	copies, jit, left = codeRange(p, own(p), fi, most, spans)
	check("isolates near the binary, room for all", copies, jit, left, all,
		[][2]uint64{{0x21843000, 0x6187f000}, {0x500000000000, 0x500001000000}, {0x7ffb30003000, 0x7ffbe7792000}}, 0)

	// A V8 that maps no copies (no short builtin calls): its JIT code
	// alone makes the span.
	p = &normalize.Process{PID: 1, Mappings: []normalize.Mapping{
		{Start: 0xb72000, End: 0x25fe000, Offset: 0x772000, Path: "/usr/bin/node", File: node},
		{Start: 0x3e0000000000, End: 0x3e0000040000, Anonymous: true},
		{Start: 0x3e0010000000, End: 0x3e0010040000, Anonymous: true},
	}}
	copies, jit, left = codeRange(p, own(p), fi, most, spans)
	check("no copies", copies, jit, left, nil, [][2]uint64{{0x3e0000000000, 0x3e0010040000}}, 0)
}
