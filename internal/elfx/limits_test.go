package elfx_test

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// allocated runs fn and returns the bytes it allocated on the heap, which
// bounds the memory it could have taken, whatever the GC did meanwhile.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func write(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// F4: opening a FIFO used to block in open(2) until a writer came, with no
// timeout; it must now fail at once as not a regular file.
func TestOpenFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, open := range map[string]func() (*elfx.File, error){
		"Open": func() (*elfx.File, error) { return elfx.Open(p) },
		"OpenContext": func() (*elfx.File, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return elfx.OpenContext(ctx, p, elfx.Limits{})
		},
	} {
		start := time.Now()
		f, err := open()
		if f != nil {
			f.Close()
		}
		t.Logf("%s(fifo): %v after %v", name, err, time.Since(start))
		if !errors.Is(err, frame.ErrInvalidPath) {
			t.Errorf("%s(fifo) = %v, want %v", name, err, frame.ErrInvalidPath)
		}
	}
	// A device is never even opened (opening some has side effects).
	if _, err := elfx.Open("/dev/zero"); !errors.Is(err, frame.ErrInvalidPath) {
		t.Errorf("Open(/dev/zero) = %v, want %v", err, frame.ErrInvalidPath)
	}
	if _, err := elfx.Open(t.TempDir()); !errors.Is(err, frame.ErrInvalidPath) {
		t.Errorf("Open(dir) = %v, want %v", err, frame.ErrInvalidPath)
	}
}

// A context that has ended opens nothing and says timeout.
func TestOpenContextEnded(t *testing.T) {
	p := write(t, "ok", testfixture.BuildELF())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := elfx.OpenContext(ctx, p, elfx.Limits{}); !errors.Is(err, frame.ErrTimeout) {
		t.Fatalf("ended context: %v, want %v", err, frame.ErrTimeout)
	}
	f, err := elfx.OpenContext(context.Background(), p, elfx.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// F5: a sparse file of 1 TiB used to be read with io.ReadAll. It must be
// refused from its size alone, allocating nothing of it.
func TestOpenSparseHuge(t *testing.T) {
	p := write(t, "huge", testfixture.BuildELF())
	if err := os.Truncate(p, 1<<40); err != nil {
		testfixture.SkipOrFail(t, "file system cannot hold a sparse 1 TiB file: %v", err)
	}
	var err error
	n := allocated(func() {
		var f *elfx.File
		if f, err = elfx.Open(p); f != nil {
			f.Close()
		}
	})
	t.Logf("1 TiB sparse file: %v; %d bytes allocated", err, n)
	if !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("Open(1 TiB) = %v, want %v", err, frame.ErrLimitExceeded)
	}
	if n > 1<<20 {
		t.Errorf("refusing the file allocated %d bytes", n)
	}
	// Under the cap a large file is mapped, not read: a 3 GiB sparse file
	// behind a valid header opens without touching its pages.
	p2 := write(t, "large", testfixture.BuildELF())
	if err := os.Truncate(p2, 3<<30); err != nil {
		t.Fatal(err)
	}
	n = allocated(func() {
		f, err := elfx.Open(p2)
		if err != nil {
			t.Errorf("Open(3 GiB sparse ELF): %v", err)
			return
		}
		defer f.Close()
		if len(f.Bytes()) != 3<<30 {
			t.Errorf("mapped %d bytes", len(f.Bytes()))
		}
	})
	if n > 1<<20 {
		t.Errorf("opening a 3 GiB file allocated %d bytes", n)
	}
	// And the cap is the caller's to set.
	if _, err := elfx.OpenContext(context.Background(), p2, elfx.Limits{MaxFileBytes: 1 << 30}); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("3 GiB against a 1 GiB cap: %v", err)
	}
}

// F6: three zlib sections each claiming 2 GiB took RSS to 8.4 GB. Claims
// over the per-file budget are now refused before any byte is inflated.
func TestZlibBombClaims(t *testing.T) {
	var secs []testfixture.Section
	for _, name := range []string{".debug_info", ".debug_line", ".debug_str"} {
		secs = append(secs, testfixture.CompressedSection(t, name, elf.COMPRESS_ZLIB, 2<<30, 1<<20))
	}
	p := write(t, "bomb", testfixture.BuildELF(secs...))
	f, err := elfx.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := allocated(func() {
		for _, s := range secs {
			_, err := f.SectionData(s.Name)
			t.Logf("%s: %v", s.Name, err)
			if !errors.Is(err, frame.ErrLimitExceeded) {
				t.Errorf("%s: %v, want %v", s.Name, err, frame.ErrLimitExceeded)
			}
		}
	})
	if n > 1<<20 {
		t.Errorf("three refused sections allocated %d bytes", n)
	}
}

// The ZIP-bomb-style ELF: sections whose streams really expand to what they
// claim, each within the budget, together beyond it. What decompression
// produces for one file stops at MaxDecompressedBytes.
func TestZipBombELF(t *testing.T) {
	const each, budget = 40 << 20, 100 << 20
	for _, typ := range []elf.CompressionType{elf.COMPRESS_ZLIB, elf.COMPRESS_ZSTD} {
		t.Run(typ.String(), func(t *testing.T) {
			var secs []testfixture.Section
			for _, name := range []string{".debug_info", ".debug_line", ".debug_str"} {
				secs = append(secs, testfixture.CompressedSection(t, name, typ, each, each))
			}
			img := testfixture.BuildELF(secs...)
			t.Logf("%d-byte file, %d bytes claimed", len(img), 3*each)
			f, err := elfx.OpenContext(context.Background(), write(t, "bomb", img), elfx.Limits{MaxDecompressedBytes: budget})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var errs []error
			n := allocated(func() {
				for _, s := range secs {
					_, err := f.SectionData(s.Name)
					errs = append(errs, err)
				}
			})
			spent, limit := f.DecompressedBytes()
			t.Logf("errors %v; decompressed %d of %d; allocated %d", errs, spent, limit, n)
			if errs[0] != nil || errs[1] != nil {
				t.Errorf("sections within the budget failed: %v", errs)
			}
			if !errors.Is(errs[2], frame.ErrLimitExceeded) {
				t.Errorf("third section: %v, want %v", errs[2], frame.ErrLimitExceeded)
			}
			if spent > budget {
				t.Errorf("decompressed %d bytes, budget %d", spent, budget)
			}
			// Growing as bytes arrive allocates a series of doubling
			// buffers, under three times the output in all; at most the
			// last two are live at once.
			if n > 3*budget+(16<<20) {
				t.Errorf("allocated %d bytes for a %d-byte budget", n, budget)
			}
		})
	}
}

// A header that lies about the size: grow-as-you-read allocates for what the
// stream holds, not for the claim, and the mismatch is a corrupt file.
func TestLyingCompressionHeader(t *testing.T) {
	for _, typ := range []elf.CompressionType{elf.COMPRESS_ZLIB, elf.COMPRESS_ZSTD} {
		for _, c := range []struct{ claim, real int64 }{
			{claim: 400 << 20, real: 1 << 20}, // claims much, holds little
			{claim: 1 << 20, real: 64 << 20},  // claims little, holds much
		} {
			sec := testfixture.CompressedSection(t, ".debug_info", typ, c.claim, c.real)
			f, err := elfx.NewFile(testfixture.BuildELF(sec))
			if err != nil {
				t.Fatal(err)
			}
			n := allocated(func() { _, err = f.SectionData(".debug_info") })
			t.Logf("%v claim %d real %d: %v; allocated %d", typ, c.claim, c.real, err, n)
			if !errors.Is(err, frame.ErrCorruptFile) {
				t.Errorf("%v claim %d real %d: %v, want %v", typ, c.claim, c.real, err, frame.ErrCorruptFile)
			}
			if n > uint64(3*min(c.claim, c.real))+(16<<20) { // the zstd decoder's own buffers
				t.Errorf("%v claim %d real %d: allocated %d", typ, c.claim, c.real, n)
			}
		}
	}
}

// Honest compressed sections still decode, and are decoded once.
func TestCompressedSectionRoundTrip(t *testing.T) {
	for _, typ := range []elf.CompressionType{elf.COMPRESS_ZLIB, elf.COMPRESS_ZSTD} {
		sec := testfixture.CompressedSection(t, ".debug_str", typ, 3<<20, 3<<20)
		f, err := elfx.NewFile(testfixture.BuildELF(sec))
		if err != nil {
			t.Fatal(err)
		}
		d, err := f.SectionData(".debug_str")
		if err != nil || len(d) != 3<<20 {
			t.Fatalf("%v: %d bytes, %v", typ, len(d), err)
		}
		if _, err := f.SectionData(".debug_str"); err != nil {
			t.Fatal(err)
		}
		if spent, _ := f.DecompressedBytes(); spent != 3<<20 {
			t.Errorf("%v: decompressed %d bytes for one 3 MiB section read twice", typ, spent)
		}
	}
}

// A compressed symbol table is charged before debug/elf expands it.
func TestCompressedSymtabCharged(t *testing.T) {
	sec := testfixture.CompressedSection(t, ".symtab", elf.COMPRESS_ZLIB, 1<<30, 1<<10)
	sec.Type = elf.SHT_SYMTAB
	f, err := elfx.NewFile(testfixture.BuildELF(sec))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Symbols(); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("Symbols() over a 1 GiB compressed .symtab: %v, want %v", err, frame.ErrLimitExceeded)
	}
}

// The symbol versions DynamicSymbols reads with .dynsym are charged too: a
// .gnu.version_r flagged compressed, claiming 1 GiB, was read by debug/elf
// at its claim.
func TestCompressedVersionsCharged(t *testing.T) {
	dynsym := testfixture.Section{Name: ".dynsym", Type: elf.SHT_DYNSYM, Data: make([]byte, 2*elf.Sym64Size)}
	vers := testfixture.CompressedSection(t, ".gnu.version_r", elf.COMPRESS_ZLIB, 1<<30, 1<<10)
	vers.Type = elf.SHT_GNU_VERNEED
	f, err := elfx.NewFile(testfixture.BuildELF(dynsym, vers))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.DynamicSymbols(); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("DynamicSymbols() with a 1 GiB compressed .gnu.version_r: %v, want %v", err, frame.ErrLimitExceeded)
	}
}
