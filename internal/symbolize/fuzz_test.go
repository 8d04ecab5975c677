package symbolize

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzSymbolize opens whole ELF images as the CLI and the processor do (the
// binary's symbol tables, pclntab and DWARF, built side by side) and looks
// up addresses in them. Seeds are a small C program with zlib-compressed
// DWARF, and the same with symbols stripped. A panic or an allocation past
// the limits is ours, not a corrupt file's.
func FuzzSymbolize(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	bin := testfixture.Build(f, testfixture.Spec{Name: "fuzz-symbolize-gz", Lang: "c",
		Sources: []string{"engine/c/hash.c", "engine/c/sort.c", "engine/c/main.c"}, Args: []string{"-O2", "-g", "-gz=zlib"}})
	img, err := os.ReadFile(bin)
	if err != nil {
		f.Fatal(err)
	}
	var addr uint64
	if ef, err := elf.Open(bin); err == nil {
		if s := ef.Section(".text"); s != nil {
			addr = s.Addr + s.Size/2
		}
		ef.Close()
	}
	f.Add(img, addr)
	stripped := filepath.Join(f.TempDir(), "s")
	testfixture.Run(f, testfixture.NeedTool(f, "strip"), "-s", "-o", stripped, bin)
	if b, err := os.ReadFile(stripped); err == nil {
		f.Add(b, addr)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, in []byte, pc uint64) {
		p := filepath.Join(dir, "in")
		if err := os.WriteFile(p, in, 0o644); err != nil {
			t.Fatal(err)
		}
		opt := DefaultOptions()
		opt.Limits.MaxDecompressedBytes = 64 << 20
		r := New(opt)
		defer r.Close()
		for _, res := range r.Symbolize(context.Background(), p, "", []uint64{pc, pc + 1, 0}) {
			_ = res.Err
		}
	})
}
