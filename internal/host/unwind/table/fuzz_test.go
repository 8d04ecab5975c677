package table

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// Seeds are the CFI sections of real files; the fuzzer mutates the bytes
// and the addresses the sections are said to sit at.

type cfiSeed struct {
	ehAddr, hdrAddr uint64
	eh, hdr, debug  []byte
}

func realSeeds(f *testing.F, paths ...string) []cfiSeed {
	var out []cfiSeed
	for _, p := range paths {
		ef, err := elfx.Open(p)
		if err != nil {
			continue // a missing system file only costs a seed
		}
		var s cfiSeed
		if sec := ef.Section(".eh_frame"); sec != nil {
			s.eh, _ = ef.SectionData(".eh_frame")
			s.eh = append([]byte(nil), s.eh...)
			s.ehAddr = sec.Addr
		}
		if sec := ef.Section(".eh_frame_hdr"); sec != nil {
			s.hdr, _ = ef.SectionData(".eh_frame_hdr")
			s.hdr = append([]byte(nil), s.hdr...)
			s.hdrAddr = sec.Addr
		}
		if ef.Section(".debug_frame") != nil {
			d, _ := ef.SectionData(".debug_frame")
			s.debug = append([]byte(nil), d...)
		}
		ef.Close()
		out = append(out, s)
	}
	return out
}

func fuzzBuilder() *builder {
	b := testBuilder(1 << 14)
	b.text = [][2]uint64{{0, 1 << 48}}
	return b
}

func FuzzEHFrame(f *testing.F) {
	fx := testfixture.Build(f, testfixture.Spec{Name: "unwindtable-gcc-O2-nofp", Lang: "c", Sources: []string{"unwindtable/cfi.c"}, Args: []string{"-O2", "-fomit-frame-pointer"}})
	for _, s := range realSeeds(f, fx, "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6") {
		f.Add(s.ehAddr, s.hdrAddr, s.eh, s.hdr)
	}
	f.Fuzz(func(t *testing.T, ehAddr, hdrAddr uint64, eh, hdr []byte) {
		parseEH(t, fuzzBuilder(), eh, ehAddr, hdr, hdrAddr)
	})
}

func FuzzDebugFrame(f *testing.F) {
	fx := testfixture.Build(f, testfixture.Spec{Name: "unwindtable-debugframe", Lang: "c", Sources: []string{"unwindtable/cfi.c"},
		Args: []string{"-O2", "-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"}})
	gobin := testfixture.Build(f, testfixture.Spec{Name: "gowalk", Lang: "go", Sources: []string{"unwindtable/gowalk"}})
	for _, s := range realSeeds(f, fx, gobin) {
		if len(s.debug) > 64<<10 {
			s.debug = s.debug[:64<<10] // Go's is large; its start is what matters
		}
		f.Add(s.debug)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBuilder()
		src, _ := b.readDebugFrame(data)
		if src == nil || len(src.segs) == 0 {
			return
		}
		rows, err := b.emitAll(b.merge([]*source{src}))
		if err != nil {
			return
		}
		checkRows(t, rows)
	})
}

// FuzzBuild feeds whole ELF images: section and program headers, the
// .eh_frame_hdr lookup, gap scanning and the merge, not only the CFI.
func FuzzBuild(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	fx := testfixture.Build(f, testfixture.Spec{Name: "unwindtable-gcc-O2-nofp", Lang: "c", Sources: []string{"unwindtable/cfi.c"}, Args: []string{"-O2", "-fomit-frame-pointer"}})
	stripped := filepath.Join(f.TempDir(), "stripped")
	testfixture.Run(f, testfixture.NeedTool(f, "strip"), "-s", "-o", stripped, fx)
	img, err := os.ReadFile(stripped)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(img)
	f.Fuzz(func(t *testing.T, img []byte) {
		ef, err := elfx.NewFile(img)
		if err != nil {
			return
		}
		tab, err := Build(ef, Options{MaxRows: 1 << 14})
		if err != nil {
			return
		}
		checkRows(t, tab.Rows)
		if len(tab.Rows) == 0 || tab.Rows[len(tab.Rows)-1].Kind != KindFallback {
			t.Fatalf("table does not end in a fallback row")
		}
	})
}
