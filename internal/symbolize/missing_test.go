package symbolize

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// Handle.Missing tells a frame named from the symbol table because the
// DWARF could not be used (here: it decompresses past the limit) from one
// with lines, and from an address nothing names.
func TestMissing(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "prog-gz", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-gz=zlib", "-Wl,--build-id", "-DSEED=12"}})
	start, size := testfixture.Func(t, bin, "hot")
	for _, tc := range []struct {
		limit int64
		want  error
	}{{0, nil}, {1024, frame.ErrLimitExceeded}} {
		opt := DefaultOptions()
		opt.Limits = elfx.Limits{MaxDecompressedBytes: tc.limit}
		r := New(opt)
		h, err := r.Open(context.Background(), bin, "")
		if err != nil {
			t.Fatal(err)
		}
		frames, err := h.Lookup(start+size/2, nil)
		if err != nil || len(frames) == 0 || frames[len(frames)-1].Function != "hot" {
			t.Fatalf("limit %d: %v %+v", tc.limit, err, frames)
		}
		if m := h.Missing(); tc.want == nil && m != nil || tc.want != nil && !errors.Is(m, tc.want) {
			t.Errorf("limit %d: Missing() = %v, want %v (lines %d)", tc.limit, m, tc.want, frames[0].Line)
		}
		if tc.want != nil && frames[0].Line != 0 {
			t.Errorf("limit %d: line %d from refused DWARF", tc.limit, frames[0].Line)
		}
		if _, err := h.Lookup(1, nil); err == nil || h.Missing() != nil {
			t.Errorf("limit %d: unnamed address: err %v, Missing %v", tc.limit, err, h.Missing())
		}
		h.Close()
		r.Close()
	}
}

// The decompressed DWARF of every open object together stays within the
// engine's pool (CacheBytes): an object that does not fit while others are
// in use is named from its symbol table, marked as worth retrying and not
// kept; once the others are idle it is opened with its DWARF, idle objects
// giving their memory back.
func TestDecompressedPool(t *testing.T) {
	var bins []string
	for _, seed := range []string{"31", "32"} {
		bins = append(bins, testfixture.Build(t, testfixture.Spec{Name: "prog-gz" + seed, Lang: "c", Sources: []string{"processor/prog.c"},
			Args: []string{"-O2", "-g", "-gz=zlib", "-Wl,--build-id", "-DSEED=" + seed}}))
	}
	probe := New(DefaultOptions())
	h, err := probe.Open(context.Background(), bins[0], "")
	if err != nil {
		t.Fatal(err)
	}
	held, _, _ := probe.DecompressedStats()
	h.Close()
	probe.Close()
	if held == 0 {
		t.Fatal("the fixture has no compressed DWARF")
	}

	opt := DefaultOptions()
	opt.CacheBytes = held * 3 / 2
	opt.Limits = elfx.Limits{MaxDecompressedBytes: held * 3 / 2}
	r := New(opt)
	defer r.Close()
	hot := func(bin string) uint64 { start, size := testfixture.Func(t, bin, "hot"); return start + size/2 }
	a, err := r.Open(context.Background(), bins[0], "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Open(context.Background(), bins[1], "")
	if err != nil {
		t.Fatal(err)
	}
	frames, err := b.Lookup(hot(bins[1]), nil)
	if err != nil || len(frames) == 0 || frames[0].Line != 0 || !frame.Transient(b.Missing()) || !errors.Is(b.Missing(), frame.ErrLimitExceeded) {
		t.Fatalf("second object while the first is in use: %v %+v, Missing %v", err, frames, b.Missing())
	}
	if used, limit, refused := r.DecompressedStats(); used > limit || refused == 0 {
		t.Errorf("pool %d of %d, %d refused", used, limit, refused)
	}
	a.Close()
	b.Close()
	b, err = r.Open(context.Background(), bins[1], "")
	if err != nil {
		t.Fatal(err)
	}
	frames, err = b.Lookup(hot(bins[1]), nil)
	if err != nil || len(frames) == 0 || frames[0].Line == 0 || b.Missing() != nil {
		t.Errorf("second object once the first is idle: %v %+v, Missing %v", err, frames, b.Missing())
	}
	b.Close()
	if used, limit, _ := r.DecompressedStats(); used > limit {
		t.Errorf("pool %d of %d", used, limit)
	}
}

// A debug file whose DWARF inflates (within the limits) and then fails to
// parse holds none of those bytes while it stays cached: a batch of such
// files would otherwise pin memory, or make every batch inflate them again.
func TestFailedDWARFHoldsNothing(t *testing.T) {
	id := "00112233445566778899aabbccddeeff00112233"
	img := testfixture.BuildELF(testfixture.BuildIDNote(t, id),
		testfixture.CompressedSection(t, ".debug_info", elf.COMPRESS_ZLIB, 8<<20, 8<<20))
	p := filepath.Join(t.TempDir(), "bomb.debug")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	r := New(DefaultOptions())
	defer r.Close()
	h, err := r.Open(context.Background(), "", p)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if held, _, _ := r.DecompressedStats(); held != 0 {
		t.Errorf("%d decompressed bytes held for DWARF that failed (%v)", held, h.Why())
	}
	if _, err := h.Lookup(0x1000, nil); err == nil {
		t.Error("a bomb named an address")
	}
}
