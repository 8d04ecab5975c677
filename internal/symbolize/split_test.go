package symbolize

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/testfixture"
)

// splitResolver is an engine that finds split units the way the CLI and
// the processor do: through a locate chain (the object's folder; debug
// directories dirs).
func splitResolver(dirs []string, demangle bool) *Resolver {
	c := locate.New(locate.Options{Sources: []locate.Source{locate.DebugDirs{Dirs: dirs}}})
	opt := DefaultOptions()
	opt.Demangle = demangle
	opt.Split = func(ctx context.Context, r SplitRequest) (string, error) {
		return c.LocateSplit(ctx, r.Files, r.DWOName, r.CompDir)
	}
	return New(opt)
}

// splitFixtures is the C++ fixture built with -gsplit-dwarf by gcc and
// clang, DWARF 4 (GNU's pre-standard split units) and 5, with .dwo files
// and packaged into a .dwp by llvm-dwp-19 and by binutils' dwp. gcc 12's
// DWARF 5 .dwo files cannot be packaged by either (llvm-dwp-19 hangs,
// dwp crashes): those stay .dwo only.
func splitFixtures() []testfixture.SplitSpec {
	var out []testfixture.SplitSpec
	for _, c := range []struct{ name, cc string }{{"gcc", "g++"}, {"clang", "clang++-19"}} {
		for _, v := range []string{"4", "5"} {
			for _, packer := range []string{"", "llvm-dwp-19", "dwp"} {
				if c.name == "gcc" && v == "5" && packer != "" || c.name == "clang" && packer == "dwp" {
					continue
				}
				name := fmt.Sprintf("split-%s-dwarf%s", c.name, v)
				if packer != "" {
					name += "-" + strings.TrimSuffix(packer, "-19")
				}
				out = append(out, testfixture.SplitSpec{Name: name, Compiler: c.cc, Packer: packer,
					Args: []string{"-O2", "-gdwarf-" + v, "-std=c++17"}, Sources: []string{"engine/cpp/main.cc"}})
			}
		}
	}
	return out
}

// TestSplitDWARF symbolizes programs built with -gsplit-dwarf, their
// functions and inlined calls in .dwo files or a .dwp package beside them,
// and gets every frame llvm-symbolizer-19 gives for each sampled address
// (names compared mangled: this test is about split units, not the
// demangler). Without the split files, the answers are llvm's without
// them too: lines, and names from the symbol table.
func TestSplitDWARF(t *testing.T) {
	for _, s := range splitFixtures() {
		t.Run(s.Name, func(t *testing.T) {
			bin := testfixture.SplitDWARF(t, s)
			addrs := sampleAddresses(t, bin, 2000)
			r := splitResolver(nil, false)
			defer r.Close()
			n, resolved, samples := exactDiffs(t, r, target{path: bin}, bin, addrs, "--no-demangle")
			t.Logf("%s: %d of %d addresses differ from llvm-symbolizer-19", s.Name, n, resolved)
			if n > 0 || resolved < 100 {
				t.Errorf("%d of %d addresses differ:\n\t%s", n, resolved, strings.Join(samples, "\n\t"))
			}
			frames := 0
			for _, res := range r.Symbolize(context.Background(), bin, "", addrs) {
				frames += len(res.Frames)
			}
			if frames < len(addrs)*3/2 {
				t.Errorf("%d frames for %d addresses: few inlined frames", frames, len(addrs))
			}

			if s.Packer == "" {
				return // the .dwo files stay reachable by their recorded path
			}
			// Moved away from its package, the binary answers as llvm does
			// without it.
			alone := filepath.Join(t.TempDir(), filepath.Base(bin))
			b, _ := os.ReadFile(bin)
			os.WriteFile(alone, b, 0o755)
			r2 := splitResolver(nil, false)
			defer r2.Close()
			if m, _, s := exactDiffs(t, r2, target{path: alone}, alone, addrs, "--no-demangle"); m > 0 {
				t.Errorf("without the package, %d answers differ from llvm's:\n\t%s", m, strings.Join(s, "\n\t"))
			}
		})
	}
}

// TestSplitDWARFWrongDWO: a .dwo of another build under the name a
// skeleton records is never used: the skeleton answers its lines, marked
// build_id_mismatch, and the name comes from the symbol table.
func TestSplitDWARFWrongDWO(t *testing.T) {
	specs := splitFixtures()
	own := specs[0] // gcc, DWARF 4, .dwo: a build of its own, whose .dwo this test removes
	own.Name = "split-gcc-dwarf4-wrongdwo"
	gcc4 := testfixture.SplitDWARF(t, own)
	var clang4 string
	for _, s := range specs {
		if s.Name == "split-clang-dwarf4" {
			clang4 = testfixture.SplitDWARF(t, s)
		}
	}
	// DW_AT_comp_dir names the fixture's folder: the right .dwo goes.
	os.Remove(filepath.Join(filepath.Dir(gcc4), own.Name+"-0.dwo"))
	dir := t.TempDir()
	bin := filepath.Join(dir, filepath.Base(gcc4))
	b, _ := os.ReadFile(gcc4)
	os.WriteFile(bin, b, 0o755)
	// The clang build's .dwo where the skeleton's name leads beside it.
	dwos, _ := filepath.Glob(filepath.Join(filepath.Dir(clang4), "*.dwo"))
	wrong, _ := os.ReadFile(dwos[0])
	os.WriteFile(filepath.Join(dir, own.Name+"-0.dwo"), wrong, 0o644)

	r := splitResolver(nil, false)
	defer r.Close()
	h, err := r.Open(context.Background(), bin, "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lines := 0
	for _, a := range sampleAddresses(t, bin, 300) {
		fr, err := h.Lookup(a, nil)
		if err != nil || len(fr) == 0 || fr[0].Line == 0 {
			continue
		}
		lines++
		if len(fr) != 1 || !errors.Is(h.Missing(), frame.ErrBuildIDMismatch) {
			t.Fatalf("%#x: %d frames, reason %v: want one frame, build_id_mismatch", a, len(fr), h.Missing())
		}
	}
	if lines < 100 {
		t.Fatalf("only %d addresses answered with lines", lines)
	}
}
