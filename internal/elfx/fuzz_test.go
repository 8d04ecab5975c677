package elfx_test

import (
	"debug/elf"
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzSectionData: any file, any section: no panic, a countable reason for
// every failure, and never more decompressed than the file's limit.
func FuzzSectionData(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	f.Add(testfixture.BuildELF(
		testfixture.CompressedSection(f, ".debug_info", elf.COMPRESS_ZLIB, 4096, 4096),
		testfixture.CompressedSection(f, ".debug_line", elf.COMPRESS_ZSTD, 4096, 4096),
		testfixture.Section{Name: ".zdebug_str", Type: elf.SHT_PROGBITS, Data: []byte("ZLIB\x00\x00\x00\x00\x00\x00\x10\x00x\x9c")},
	))
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	const limit = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elfx.NewFileLimits(data, elfx.Limits{MaxDecompressedBytes: limit})
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) {
				t.Fatalf("unclassified: %v", err)
			}
			return
		}
		defer ef.Close()
		for _, s := range ef.Sections {
			_, err := ef.SectionData(s.Name)
			if err != nil && !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, frame.ErrLimitExceeded) && !errors.Is(err, elfx.ErrNoSection) {
				t.Fatalf("%s: unclassified: %v", s.Name, err)
			}
		}
		if _, err := ef.Symbols(); err != nil && errors.Is(err, frame.ErrLimitExceeded) {
			return
		}
		if spent, _ := ef.DecompressedBytes(); spent > limit {
			t.Fatalf("decompressed %d bytes, limit %d", spent, limit)
		}
	})
}
