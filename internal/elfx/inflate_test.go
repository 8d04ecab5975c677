package elfx

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	kzlib "github.com/klauspost/compress/zlib"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// samples are inputs of every shape DEFLATE encoders produce: text,
// runs, random bytes (stored blocks), a mix, and empty.
func inflateSamples() [][]byte {
	rng := rand.New(rand.NewPCG(7, 9))
	text := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog; DW_TAG_subprogram\x00"), 3000)
	random := make([]byte, 200_000)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	runs := bytes.Repeat([]byte{0}, 100_000)
	mixed := append(append(append([]byte{}, text[:5000]...), random[:70000]...), runs[:40000]...)
	skewed := make([]byte, 300_000) // few symbols, long codes
	for i := range skewed {
		x := rng.ExpFloat64() * 3
		skewed[i] = byte(min(x, 255))
	}
	self, _ := os.ReadFile(os.Args[0])
	if len(self) > 4<<20 {
		self = self[:4<<20]
	}
	return [][]byte{nil, []byte("a"), text, random, runs, mixed, skewed, self}
}

func compressZlib(t testing.TB, data []byte, level int) []byte {
	var buf bytes.Buffer
	w, err := zlib.NewWriterLevel(&buf, level)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

// TestInflateMatchesZlib decodes every sample at every level (stored,
// fixed-code, dynamic blocks) and compares with the input.
func TestInflateMatchesZlib(t *testing.T) {
	for i, data := range inflateSamples() {
		for _, level := range []int{zlib.NoCompression, zlib.BestSpeed, 5, zlib.BestCompression, zlib.HuffmanOnly} {
			z := compressZlib(t, data, level)
			dst := make([]byte, len(data))
			if _, err := inflateZlib(dst, z); err != nil {
				t.Fatalf("sample %d level %d: %v", i, level, err)
			}
			if !bytes.Equal(dst, data) {
				t.Fatalf("sample %d level %d: output differs", i, level)
			}
			// A wrong claimed size is an error either way.
			if len(data) > 0 {
				if _, err := inflateZlib(make([]byte, len(data)-1), z); !errors.Is(err, frame.ErrCorruptFile) {
					t.Errorf("sample %d level %d: short buffer: %v", i, level, err)
				}
			}
			if _, err := inflateZlib(make([]byte, len(data)+1), z); !errors.Is(err, frame.ErrCorruptFile) {
				t.Errorf("sample %d level %d: long buffer: %v", i, level, err)
			}
		}
	}
}

// TestInflateFixedCodes uses the klauspost encoder, which emits fixed-code
// blocks for short inputs where compress/flate does not.
func TestInflateFixedCodes(t *testing.T) {
	for _, data := range [][]byte{[]byte("abcabcabcabc"), []byte("hello, hello, hello world"), bytes.Repeat([]byte("xy"), 40)} {
		var buf bytes.Buffer
		w, _ := kzlib.NewWriterLevel(&buf, kzlib.BestSpeed)
		w.Write(data)
		w.Close()
		dst := make([]byte, len(data))
		if _, err := inflateZlib(dst, buf.Bytes()); err != nil || !bytes.Equal(dst, data) {
			t.Fatalf("%q: %v, got %q", data, err, dst)
		}
	}
}

// TestInflateTruncatedAndCorrupt: every truncation and many bit flips of
// a real stream fail cleanly (or, for a flip zlib also accepts, decode to
// what zlib decodes).
func TestInflateTruncatedAndCorrupt(t *testing.T) {
	data := inflateSamples()[5]
	z := compressZlib(t, data, 6)
	dst := make([]byte, len(data))
	for n := 0; n < len(z); n += 1 + n/50 {
		if _, err := inflateZlib(dst, z[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(z))
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 300; i++ {
		c := bytes.Clone(z)
		c[rng.IntN(len(c))] ^= 1 << rng.IntN(8)
		checkAgainstZlib(t, c, len(data))
	}
}

// TestInflateLargeChecksum: a stream large enough for the checksum to run
// beside the decoder still has it checked (a flipped checksum byte, a flip
// in the data), fails cleanly when cut short, and leaves no goroutine.
func TestInflateLargeChecksum(t *testing.T) {
	data := inflateSamples()[7] // the test binary: megabytes
	if len(data) < 2*concurrentSumBytes {
		t.Fatalf("sample of %d bytes: too small for the concurrent checksum", len(data))
	}
	z := compressZlib(t, data, 6)
	before := runtime.NumGoroutine()
	dst := make([]byte, len(data))
	if _, err := inflateZlib(dst, z); err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("intact stream: %v", err)
	}
	bad := bytes.Clone(z)
	bad[len(bad)-1] ^= 1
	if _, err := inflateZlib(dst, bad); !errors.Is(err, frame.ErrCorruptFile) || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("flipped checksum: %v", err)
	}
	// A stored block's byte (level 0 copies the input) changes the data
	// and nothing else: only the checksum can tell.
	stored := compressZlib(t, data, zlib.NoCompression)
	stored[len(stored)/2] ^= 0x10
	if _, err := inflateZlib(dst, stored); !errors.Is(err, frame.ErrCorruptFile) || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("flipped data byte: %v", err)
	}
	for _, n := range []int{len(z) / 3, len(z) - 5} {
		if _, err := inflateZlib(dst, z[:n]); err == nil {
			t.Errorf("cut to %d of %d bytes: no error", n, len(z))
		}
	}
	for i := 0; i < 50 && runtime.NumGoroutine() > before; i++ {
		time.Sleep(10 * time.Millisecond) // a summing goroutine on its way out
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after, %d before", n, before)
	}
}

// checkAgainstZlib requires inflateZlib to agree with compress/zlib on
// src decoded into exactly size bytes: both succeed with the same bytes,
// or inflateZlib fails.
func checkAgainstZlib(t *testing.T, src []byte, size int) {
	t.Helper()
	dst := make([]byte, size)
	_, err := inflateZlib(dst, src)
	var want []byte
	var werr error
	if zr, zerr := zlib.NewReader(bytes.NewReader(src)); zerr != nil {
		werr = zerr
	} else {
		want, werr = io.ReadAll(io.LimitReader(zr, int64(size)+1))
	}
	if werr == nil && len(want) != size {
		werr = errors.New("size")
	}
	switch {
	case err == nil && werr != nil:
		t.Fatalf("accepted a stream compress/zlib refuses (%v)", werr)
	case err == nil && !bytes.Equal(dst, want):
		t.Fatalf("output differs from compress/zlib's")
	case err != nil && !errors.Is(err, frame.ErrCorruptFile):
		t.Fatalf("error %v does not say corrupt_file", err)
	case err != nil && werr == nil:
		t.Fatalf("refused a stream compress/zlib decodes: %v", err)
	}
}

// FuzzInflate holds the decoder to compress/zlib's answers on any bytes.
func FuzzInflate(f *testing.F) {
	for _, d := range inflateSamples()[:7] {
		f.Add(compressZlib(f, d[:min(len(d), 4096)], 6), uint16(min(len(d), 4096)))
		f.Add(compressZlib(f, d[:min(len(d), 300)], 1), uint16(min(len(d), 300)))
	}
	f.Fuzz(func(t *testing.T, src []byte, size uint16) {
		checkAgainstZlib(t, src, int(size))
	})
}

// BenchmarkInflate compares the decoder with compress/zlib and
// klauspost/compress/zlib on real compressed DWARF: the .debug_info of a
// Go program built with DWARF (the Go linker compresses it with zlib), in
// MB/s of output.
func BenchmarkInflate(b *testing.B) {
	bin := testfixture.Build(b, testfixture.Spec{Name: "inflate-go", Lang: "go", Sources: []string{"engine/go"}})
	f, err := Open(bin)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".debug_info")
	if s == nil || s.Flags&elf.SHF_COMPRESSED == 0 {
		b.Fatalf("%s: no compressed .debug_info", bin)
	}
	raw, _ := f.raw(s)
	_, size, hdr, _ := f.compressionHeader(raw)
	z := raw[hdr:]
	dst := make([]byte, size)
	b.Run("profsym", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			if _, err := inflateZlib(dst, z); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("compress-zlib", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			zr, _ := zlib.NewReader(bytes.NewReader(z))
			io.ReadFull(zr, dst)
		}
	})
	b.Run("klauspost-zlib", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			zr, _ := kzlib.NewReader(bytes.NewReader(z))
			io.ReadFull(zr, dst)
		}
	})
}
