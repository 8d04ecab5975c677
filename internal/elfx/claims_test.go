package elfx

import (
	"debug/elf"
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// mapsRecorder is sectionMemory that notes the size of every mapping.
type mapsRecorder struct {
	memory
	sizes []int
}

func (m *mapsRecorder) grow(buf []byte, n int) ([]byte, error) {
	m.sizes = append(m.sizes, n)
	return m.memory.grow(buf, n)
}

// A compression header whose ch_size one flipped bit took from 1 MiB to
// 257 MiB: within the budget, but more than its compressed bytes can expand
// to. It is corrupt before anything is mapped for it; it was mapped whole,
// address space that under `ulimit -v` the runtime's heap then lacked.
// Honest sections, at their formats' densest, still decode.
func TestClaimPastTheStreamNotMapped(t *testing.T) {
	rec := &mapsRecorder{memory: sectionMemory}
	sectionMemory = rec
	defer func() { sectionMemory = rec.memory }()
	for _, typ := range []elf.CompressionType{elf.COMPRESS_ZLIB, elf.COMPRESS_ZSTD} {
		rec.sizes = nil
		sec := testfixture.CompressedSection(t, ".debug_info", typ, 1<<20|1<<28, 1<<20)
		f, err := NewFile(testfixture.BuildELF(sec))
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.SectionData(".debug_info")
		if !errors.Is(err, ErrCorrupt) || len(rec.sizes) != 0 {
			t.Errorf("%v: %v after mapping %v; want corrupt, nothing mapped", typ, err, rec.sizes)
		}
		// Zeros compress about as far as the format goes.
		sec = testfixture.CompressedSection(t, ".debug_str", typ, 64<<20, 64<<20)
		t.Logf("%v: 64 MiB of zeros in %d compressed bytes", typ, len(sec.Data))
		f, err = NewFile(testfixture.BuildELF(sec))
		if err != nil {
			t.Fatal(err)
		}
		if d, err := f.SectionData(".debug_str"); err != nil || len(d) != 64<<20 {
			t.Errorf("%v: an honest 64 MiB section: %d bytes, %v", typ, len(d), err)
		}
		f.Close()
	}
}

func TestCheckRatio(t *testing.T) {
	for _, c := range []struct {
		size  uint64
		n     int
		ratio int
		ok    bool
	}{
		{1 << 20, 1 << 10, maxZlibRatio, true},
		{1<<10*maxZlibRatio + ratioSlack, 1 << 10, maxZlibRatio, true},
		{1<<10*maxZlibRatio + ratioSlack + 1, 1 << 10, maxZlibRatio, false},
		{512 << 20, 1 << 14, maxZstdRatio, true},
		{512 << 20, 1 << 10, maxZstdRatio, false},
		{1, -1, maxZlibRatio, false},
		{^uint64(0), 1 << 30, maxZstdRatio, false},
	} {
		if err := checkRatio(c.size, c.n, c.ratio); (err == nil) != c.ok {
			t.Errorf("checkRatio(%d, %d, %d) = %v, want ok %v", c.size, c.n, c.ratio, err, c.ok)
		}
	}
}
