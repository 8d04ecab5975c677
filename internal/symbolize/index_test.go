package symbolize

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize/symindex"
	"github.com/profsym/profsym/internal/testfixture"
)

// writeIndex compiles bin/debug's index into a file, or returns "" with the
// reason when the object is not indexable.
func writeIndex(t testing.TB, r *Resolver, bin, debug string) (string, []byte, IndexStats, error) {
	t.Helper()
	h, err := r.Open(context.Background(), bin, debug)
	if err != nil {
		t.Fatalf("open %s %s: %v", bin, debug, err)
	}
	defer h.Close()
	var buf bytes.Buffer
	st, err := h.WriteIndex(context.Background(), &buf)
	if err != nil {
		return "", nil, st, err
	}
	if st.Bytes != int64(buf.Len()) {
		t.Fatalf("WriteIndex says %d bytes, wrote %d", st.Bytes, buf.Len())
	}
	p := filepath.Join(t.TempDir(), "index")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	id := h.BuildID()
	if len(id) == 0 {
		id = h.obj.buildIDOfDebug()
	}
	return p, id, st, nil
}

// indexAgrees checks that the index of bin/debug answers addrs exactly as
// the files did (want).
func indexAgrees(t *testing.T, r *Resolver, bin, debug string, addrs []uint64, want []Result) {
	t.Helper()
	p, id, st, err := writeIndex(t, r, bin, debug)
	if err != nil {
		if !errors.Is(err, ErrNotIndexable) {
			t.Fatalf("index of %s %s: %v", bin, debug, err)
		}
		t.Logf("not indexed: %v", err)
		return
	}
	got := symbolizeIndex(t, r, p, id, addrs)
	diff := 0
	for i := range addrs {
		if !sameResult(want[i], got[i]) {
			if diff++; diff <= 5 {
				t.Errorf("%#x: index answers %+v (%v), files %+v (%v)", addrs[i], got[i].Frames, got[i].Err, want[i].Frames, want[i].Err)
			}
		}
	}
	if diff > 0 {
		t.Errorf("index (%d ranges, %d bytes) differs from the files at %d of %d addresses", st.Ranges, st.Bytes, diff, len(addrs))
	} else {
		t.Logf("index: %d bounds, %d ranges, %d bytes; %d of %d addresses answered alike", st.Bounds, st.Ranges, st.Bytes, len(addrs), len(addrs))
	}
}

func symbolizeIndex(t testing.TB, r *Resolver, p string, id []byte, addrs []uint64) []Result {
	t.Helper()
	h, err := r.OpenIndex(context.Background(), p, id)
	if err != nil {
		t.Fatalf("OpenIndex: %v", err)
	}
	defer h.Close()
	if !h.Indexed() {
		t.Fatal("handle does not answer from the index")
	}
	out := make([]Result, len(addrs))
	for i, a := range addrs {
		out[i].Frames, out[i].Err = h.Lookup(a, nil)
		if h.Missing() != nil {
			t.Fatalf("%#x: index answer missing %v", a, h.Missing())
		}
	}
	return out
}

func sameResult(a, b Result) bool {
	if (a.Err == nil) != (b.Err == nil) || a.Err != nil && IsUnresolved(a.Err) != IsUnresolved(b.Err) {
		return false
	}
	return reflect.DeepEqual(a.Frames, b.Frames) || len(a.Frames) == 0 && len(b.Frames) == 0
}

// Every address of the text, not a sample: bounds missing from a source's
// Bounds would show as a stretch answered with its neighbour's answer.
func TestIndexEveryAddress(t *testing.T) {
	c := testfixture.Build(t, testfixture.Spec{Name: "c-O2-dwarf4", Lang: "c", Sources: cSources, Args: []string{"-O2", "-gdwarf-4"}})
	cpp := testfixture.Build(t, testfixture.Spec{Name: "cpp-O2", Lang: "c++", Sources: []string{"engine/cpp/main.cc"}, Args: []string{"-O2", "-g", "-std=c++17"}})
	gobin := testfixture.Build(t, testfixture.Spec{Name: "gofix", Lang: "go", Sources: []string{"engine/go"}})
	for _, tc := range []struct {
		name string
		path string
		opt  Options
	}{
		{"c", c, DefaultOptions()},
		{"c-no-inlines", c, Options{Demangle: true, UseSymbolTable: true}},
		{"cpp", cpp, DefaultOptions()},
		{"go", gobin, DefaultOptions()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(tc.opt)
			defer r.Close()
			lo, hi := execRange(t, tc.path)
			if hi-lo > 8<<20 {
				hi = lo + 8<<20 // a bound on the test's time; the start of a Go binary's text has the runtime
			}
			addrs := make([]uint64, 0, hi-lo+64)
			for a := lo - 32; a < hi+32; a++ {
				addrs = append(addrs, a)
			}
			want := r.Symbolize(context.Background(), tc.path, "", addrs)
			indexAgrees(t, r, tc.path, "", addrs, want)
		})
	}
}

// execRange is the lowest and highest address of the executable sections.
func execRange(t testing.TB, path string) (lo, hi uint64) {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lo = ^uint64(0)
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_EXECINSTR != 0 && s.Size > 0 {
			lo, hi = min(lo, s.Addr), max(hi, s.Addr+s.Size)
		}
	}
	if hi == 0 {
		t.Fatalf("%s: no executable section", path)
	}
	return lo, hi
}

// A damaged, forged, foreign or other-options index is refused with a
// reason; the caller then opens the files.
func TestIndexRefused(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "c-O2-dwarf4", Lang: "c", Sources: cSources, Args: []string{"-O2", "-gdwarf-4"}})
	r := New(DefaultOptions())
	defer r.Close()
	p, id, _, err := writeIndex(t, r, bin, "")
	if err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(p)
	write := func(b []byte) string {
		q := filepath.Join(t.TempDir(), "index")
		if err := os.WriteFile(q, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return q
	}
	// reseal recomputes both checksums: a forger's file.
	reseal := func(b []byte) []byte {
		le := binary.LittleEndian
		tab := crc32.MakeTable(crc32.Castagnoli)
		le.PutUint32(b[96:], crc32.Checksum(b[256:], tab))
		le.PutUint32(b[252:], crc32.Checksum(b[:252], tab))
		return b
	}
	nRanges := int(binary.LittleEndian.Uint32(good[40:]))
	for _, tc := range []struct {
		name   string
		data   func() []byte
		id     []byte
		opt    Options
		reason error
	}{
		{"body-bit-flipped", func() []byte { b := bytes.Clone(good); b[len(b)-3] ^= 0x40; return b }, id, DefaultOptions(), frame.ErrCorruptFile},
		{"header-bit-flipped", func() []byte { b := bytes.Clone(good); b[20] ^= 1; return b }, id, DefaultOptions(), frame.ErrCorruptFile},
		{"truncated", func() []byte { return good[:len(good)-100] }, id, DefaultOptions(), frame.ErrCorruptFile},
		{"not-an-index", func() []byte {
			return []byte("\x7fELF not an index at all, but long enough to have a header..........")
		}, id, DefaultOptions(), frame.ErrCorruptFile},
		{"forged-unsorted-ranges", func() []byte {
			b := bytes.Clone(good)
			if nRanges < 3 {
				t.Fatal("too few ranges")
			}
			binary.LittleEndian.PutUint32(b[256+8:], 0xfffffff0)
			return reseal(b)
		}, id, DefaultOptions(), frame.ErrCorruptFile},
		{"forged-record-offset", func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint32(b[256+4:], 0x7ffffff0)
			return reseal(b)
		}, id, DefaultOptions(), frame.ErrCorruptFile},
		{"forged-section-sizes", func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint64(b[64:], 1<<40)
			return reseal(b)
		}, id, DefaultOptions(), frame.ErrCorruptFile},
		{"other-build", func() []byte { return good }, bytes.Repeat([]byte{0xab}, 20), DefaultOptions(), frame.ErrBuildIDMismatch},
		{"other-options", func() []byte { return good }, id, Options{Demangle: true, UseSymbolTable: true}, ErrIndexOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(tc.opt)
			defer r.Close()
			h, err := r.OpenIndex(context.Background(), write(tc.data()), tc.id)
			if err == nil {
				h.Close()
				t.Fatal("index taken")
			}
			if !errors.Is(err, tc.reason) {
				t.Fatalf("refused with %v, want %v", err, tc.reason)
			}
			t.Logf("refused: %v", err)
		})
	}
	t.Run("over-limit", func(t *testing.T) {
		o := DefaultOptions()
		o.MaxIndexBytes = int64(len(good)) - 1
		r := New(o)
		defer r.Close()
		_, err := r.OpenIndex(context.Background(), p, id)
		if !errors.Is(err, frame.ErrLimitExceeded) {
			t.Fatalf("got %v, want limit_exceeded", err)
		}
	})
	t.Run("forged-record", func(t *testing.T) {
		// A record whose strings point past the table, checksums made to
		// match: the lookup fails with a reason instead of reading out of
		// bounds.
		b := bytes.Clone(good)
		le := binary.LittleEndian
		recOff := le.Uint64(b[56:])
		b[recOff] = 1 // one frame
		b[recOff+1] = 0xff
		b[recOff+2] = 0xff
		b[recOff+3] = 0xff
		b[recOff+4] = 0x7f
		x, err := symindex.Parse(reseal(b))
		if err != nil {
			t.Fatal(err)
		}
		var bad error
		for i := 0; i < nRanges; i++ {
			a := le.Uint64(b[16:]) + uint64(le.Uint32(b[256+8*i:]))
			if rec := le.Uint32(b[256+8*i+4:]); rec == 0 {
				_, bad = x.Lookup(a, nil)
				break
			}
		}
		if !errors.Is(bad, frame.ErrCorruptFile) {
			t.Fatalf("forged record read as %v", bad)
		}
	})
}

// A build that would hold more parsed DWARF than half the object cache is
// refused with limit_exceeded, the object used as it is.
func TestIndexParseBudget(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "cpp-O2", Lang: "c++", Sources: []string{"engine/cpp/main.cc"}, Args: []string{"-O2", "-g", "-std=c++17"}})
	o := DefaultOptions()
	o.CacheBytes = 64 << 10
	r := New(o)
	defer r.Close()
	_, _, _, err := writeIndex(t, r, bin, "")
	if !errors.Is(err, ErrNotIndexable) || !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("built within a 32 KiB parse budget: %v", err)
	}
}
