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

// dwzVariant is one way distributions' debug files come out of dwz.
type dwzVariant struct {
	name, dwarf string
	dwzArgs     []string
	recorded    string // the common file's name in the rewritten files
}

var dwzVariants = []dwzVariant{
	// GNU forms (DW_FORM_GNU_ref_alt, DW_FORM_GNU_strp_alt,
	// .gnu_debugaltlink) with an absolute name, as Debian and Fedora ship.
	{"dwarf4", "-gdwarf-4", nil, "/usr/lib/debug/.dwz/profsym-dwz4.debug"},
	{"dwarf5", "-gdwarf-5", nil, "/usr/lib/debug/.dwz/profsym-dwz5.debug"},
	// DWARF 5's own forms (DW_FORM_ref_sup4, DW_FORM_strp_sup,
	// .debug_sup) with a bare name: the common file sits beside.
	{"dwarf5-sup", "-gdwarf-5", []string{"-5"}, "profsym-dwz5-sup.debug"},
}

// dwzSet builds the three programs of testdata/src/dwz with v's DWARF and
// rewrites them with dwz -m, checking that the common file really holds
// what their names need: the inline functions' abstract instances, which
// the programs' inlined frames point to with supplementary references.
func dwzSet(t *testing.T, v dwzVariant) testfixture.DWZSet {
	var specs []testfixture.Spec
	for i := 1; i <= 3; i++ {
		specs = append(specs, testfixture.Spec{Name: fmt.Sprintf("dwz-%s-%d", v.name, i), Lang: "c++",
			Sources: []string{fmt.Sprintf("dwz/main%d.cc", i)}, Args: []string{"-O2", v.dwarf, "-std=c++17"}})
	}
	set := testfixture.DWZ(t, "dwz-"+v.name, specs, v.recorded, v.dwzArgs...)
	if n := testfixture.InlineDecls(t, set.Common); n < 10 {
		t.Fatalf("%s: %d abstract inline instances in the common file: dwz moved nothing names need", v.name, n)
	}
	for _, b := range set.Bins {
		if n := testfixture.SupRefs(t, b); n < 20 {
			t.Fatalf("%s: %d references into the common file", b, n)
		}
	}
	return set
}

// exactDiffs symbolizes addrs of ours and llvm-symbolizer-19's of ref and
// returns the addresses llvm resolves whose frames differ in any field of
// llvm's JSON output (with a few samples). Where llvm 19 is at fault the
// rules of docs/symbolization.md apply: names it cannot demangle are
// compared as c++filt spells them, and a StartFileName it leaves empty is
// not compared.
func exactDiffs(t *testing.T, r *Resolver, ours target, ref string, addrs []uint64, llvmArgs ...string) (n, resolved int, samples []string) {
	t.Helper()
	want := testfixture.LLVMSymbolize(t, ref, addrs, append([]string{"--inlines"}, llvmArgs...)...)
	for i := range want {
		for j := range want[i] {
			// llvm 19 leaves a few names mangled that c++filt demangles
			// (its fault, set aside as in the accuracy tests).
			if w := &want[i][j]; r.Options().Demangle && strings.HasPrefix(w.FunctionName, "_Z") {
				w.FunctionName = gnuDemangle(t, w.FunctionName)
			}
		}
	}
	bin, debug := ours.files(t)
	got := r.Symbolize(context.Background(), bin, debug, addrs)
	for i, w := range want {
		if len(w) == 0 || w[len(w)-1].FunctionName == "" || w[len(w)-1].FunctionName == "??" {
			continue
		}
		resolved++
		g := got[i].Frames
		same := len(g) == len(w)
		for j := 0; same && j < len(g); j++ {
			start := ""
			if g[j].StartAddress != 0 {
				start = fmt.Sprintf("0x%x", g[j].StartAddress)
			}
			same = g[j].Function == w[j].FunctionName && g[j].File == w[j].FileName &&
				g[j].Line == w[j].Line && g[j].Column == w[j].Column && g[j].Discriminator == w[j].Discriminator &&
				g[j].StartLine == w[j].StartLine && start == w[j].StartAddress &&
				// llvm 19 loses a DW_FORM_implicit_const DW_AT_decl_file
				// (docs/symbolization.md): "" where profsym names the file.
				(g[j].StartFile == w[j].StartFileName || w[j].StartFileName == "")
		}
		if !same {
			n++
			if len(samples) < 5 {
				var gs, ws []string
				for _, f := range g {
					gs = append(gs, fmt.Sprintf("%s@%s:%d:%d", f.Function, f.File, f.Line, f.Column))
				}
				for _, f := range w {
					ws = append(ws, fmt.Sprintf("%s@%s:%d:%d", f.FunctionName, f.FileName, f.Line, f.Column))
				}
				samples = append(samples, fmt.Sprintf("%#x: profsym %v (%v)\n\t\tllvm %v", addrs[i], gs, got[i].Err, ws))
			}
		}
	}
	return n, resolved, samples
}

// supResolver is an engine that finds supplementary files the way the
// CLI and the processor do: through a locate chain (here the debug
// directories dirs, and the folder of the file that names one).
func supResolver(dirs []string) *Resolver {
	c := locate.New(locate.Options{Sources: []locate.Source{locate.DebugDirs{Dirs: dirs}}})
	opt := DefaultOptions()
	opt.Supplementary = func(ctx context.Context, r SupRequest) (string, error) {
		return c.LocateSup(ctx, r.BuildID, r.Name, r.From, r.ByName)
	}
	return New(opt)
}

// TestDWZ symbolizes programs rewritten by dwz -m through a debug
// directory (the common file under .dwz/, or beside them for a bare name)
// and gets, for every sampled address, the frames llvm-symbolizer-19 gives
// for the programs as built (llvm 19 does not follow the links: on the
// rewritten files it prints ?? for the inlined frames). Without the
// common file the answers are llvm's on the rewritten files.
func TestDWZ(t *testing.T) {
	for _, v := range dwzVariants {
		t.Run(v.name, func(t *testing.T) {
			set := dwzSet(t, v)
			debugDir := t.TempDir()
			if filepath.IsAbs(v.recorded) {
				dst := filepath.Join(debugDir, ".dwz", filepath.Base(v.recorded))
				os.MkdirAll(filepath.Dir(dst), 0o755)
				if err := os.Symlink(set.Common, dst); err != nil {
					t.Fatal(err)
				}
			}
			for i, bin := range set.Bins {
				addrs := sampleAddresses(t, set.Orig[i], 1500)
				r := supResolver([]string{debugDir})
				n, resolved, samples := exactDiffs(t, r, target{path: bin, dirs: []string{debugDir}}, set.Orig[i], addrs)
				r.Close()
				t.Logf("%s: %d of %d addresses differ from llvm-symbolizer-19 on the original", filepath.Base(bin), n, resolved)
				if n > 0 || resolved < 100 {
					t.Errorf("%s: %d of %d addresses differ:\n\t%s", bin, n, resolved, strings.Join(samples, "\n\t"))
				}
			}
			if filepath.IsAbs(v.recorded) {
				// The common file is where the names are: without it, the
				// inlined frames lose theirs, as with llvm on these files.
				r := supResolver([]string{t.TempDir()})
				defer r.Close()
				addrs := sampleAddresses(t, set.Orig[0], 1500)
				n, _, _ := exactDiffs(t, r, target{path: set.Bins[0], dirs: []string{t.TempDir()}}, set.Orig[0], addrs)
				if n == 0 {
					t.Errorf("without the common file every answer still agrees: the fixture does not need it")
				}
				if m, _, s := exactDiffs(t, r, target{path: set.Bins[0], dirs: []string{t.TempDir()}}, set.Bins[0], addrs); m > 0 {
					t.Errorf("without the common file, %d answers differ from llvm's on the same file:\n\t%s", m, strings.Join(s, "\n\t"))
				}
			}
		})
	}
}

// TestDWZWrongCommonFile: a common file of another build where the link
// points is never used; the program's own DWARF still answers, every
// answer marked with the reason (build_id_mismatch).
func TestDWZWrongCommonFile(t *testing.T) {
	set4, set5 := dwzSet(t, dwzVariants[0]), dwzSet(t, dwzVariants[1])
	debugDir := t.TempDir()
	dst := filepath.Join(debugDir, ".dwz", filepath.Base(dwzVariants[0].recorded))
	os.MkdirAll(filepath.Dir(dst), 0o755)
	if err := os.Symlink(set5.Common, dst); err != nil {
		t.Fatal(err)
	}
	r := supResolver([]string{debugDir})
	defer r.Close()
	h, err := r.Open(context.Background(), set4.Bins[0], "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	named := 0
	for _, a := range sampleAddresses(t, set4.Bins[0], 300) {
		fr, err := h.Lookup(a, nil)
		if err != nil || len(fr) == 0 || fr[0].Line == 0 {
			continue
		}
		named++
		if m := h.Missing(); !errors.Is(m, frame.ErrBuildIDMismatch) {
			t.Fatalf("%#x: answered with reason %v, want build_id_mismatch", a, m)
		}
	}
	if named < 100 {
		t.Fatalf("only %d addresses answered from the program's own DWARF", named)
	}
}
