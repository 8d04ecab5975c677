package threadctx

import (
	"os"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzInspect: any file, as the program or as a library, is inspected
// without a panic, and a place it reports is one the reader follows.
func FuzzInspect(f *testing.F) {
	f.Add(testfixture.BuildELF())
	if !testing.Short() {
		for variant, bin := range testfixture.ThreadCtx(f) {
			paths := []string{bin}
			if variant != testfixture.ThreadCtxExe {
				paths = append(paths, soOfF(f, bin))
			}
			for _, p := range paths {
				if b, err := os.ReadFile(p); err == nil {
					f.Add(b)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elfx.NewFile(data)
		if err != nil {
			return
		}
		defer func() { _ = ef.Close() }()
		for _, exe := range []bool{true, false} {
			w, found, err := Inspect(ef, exe)
			if !found || err != nil {
				continue
			}
			switch {
			case exe && w.How != Static, !exe && w.How != GOTOffset && w.How != GOTDescriptor:
				t.Fatalf("exe %v: place %+v", exe, w)
			case w.How == Static && (w.Offset >= 0 || w.Offset < -(1<<31)):
				t.Fatalf("static offset %d", w.Offset)
			}
		}
	})
}
