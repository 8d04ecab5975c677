package otlpsym

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

// dwzPrograms is the dwz fixture of internal/symbolize's TestDWZ (GNU
// forms: the common file carries a build id, so stores and debuginfod
// servers can serve it).
func dwzPrograms(t *testing.T, dwarf string) testfixture.DWZSet {
	var specs []testfixture.Spec
	for i := 1; i <= 3; i++ {
		specs = append(specs, testfixture.Spec{Name: fmt.Sprintf("dwz-%s-%d", strings.TrimPrefix(dwarf, "-gdwarf-"), i), Lang: "c++",
			Sources: []string{fmt.Sprintf("dwz/main%d.cc", i)}, Args: []string{"-O2", dwarf, "-std=c++17"}})
	}
	set := testfixture.DWZ(t, "dwz-otlp"+dwarf, specs, "/usr/lib/debug/.dwz/profsym-otlp"+dwarf+".debug")
	if n := testfixture.SupRefs(t, set.Bins[0]); n < 20 {
		t.Fatalf("%d references into the common file", n)
	}
	return set
}

// frameLines renders a location's lines, innermost first.
func frameLines(pd pprofile.Profiles, loc int32) []string {
	d := pd.Dictionary()
	var out []string
	for _, ln := range d.LocationTable().At(int(loc)).Lines().All() {
		fn := d.FunctionTable().At(int(ln.FunctionIndex()))
		out = append(out, fmt.Sprintf("%s@%s:%d:%d", d.StringTable().At(int(fn.NameStrindex())),
			d.StringTable().At(int(fn.FilenameStrindex())), ln.Line(), ln.Column()))
	}
	return out
}

// llvmLines is llvm-symbolizer-19's answer for each address of ref, in
// frameLines' form, with the names llvm 19 cannot demangle spelled as
// c++filt does.
func llvmLines(t *testing.T, ref string, addrs []uint64) [][]string {
	want := testfixture.LLVMSymbolize(t, ref, addrs, "--inlines")
	out := make([][]string, len(want))
	for i, w := range want {
		if len(w) == 0 || w[len(w)-1].FunctionName == "??" || w[len(w)-1].FunctionName == "" {
			continue
		}
		for _, f := range w {
			name := f.FunctionName
			if strings.HasPrefix(name, "_Z") {
				b, _ := exec.Command(testfixture.NeedTool(t, "c++filt"), name).Output()
				name = strings.ReplaceAll(strings.TrimSpace(string(b)), "> >", ">>")
			}
			out[i] = append(out[i], fmt.Sprintf("%s@%s:%d:%d", name, f.FileName, f.Line, f.Column))
		}
	}
	return out
}

// textAddrs spreads n addresses over bin's .text.
func textAddrs(t *testing.T, bin string, n int) []uint64 {
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	var out []uint64
	for a := text.Addr; a < text.Addr+text.Size && len(out) < n; a += text.Size/uint64(n) | 1 {
		out = append(out, a)
	}
	return out
}

// TestDWZSources symbolizes frames of programs rewritten by dwz -m, known
// only by build id, whose debug files and common file come from a symbol
// store or from a real debuginfod server (the common file by its own build
// id), and compares every frame with llvm-symbolizer-19 on the programs
// as built.
func TestDWZSources(t *testing.T) {
	for _, dwarf := range []string{"-gdwarf-4", "-gdwarf-5"} {
		set := dwzPrograms(t, dwarf)
		served := t.TempDir()
		var ready []string
		for _, p := range append(append([]string{}, set.Bins...), set.Common) {
			copyTo(t, p, filepath.Join(served, filepath.Base(p)))
			ready = append(ready, idsOf(t, p).gnu+"/debuginfo")
		}
		sources := map[string]func(t *testing.T) locate.Config{
			"symbol_store": func(t *testing.T) locate.Config {
				backend, err := symstore.NewDir(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				store, err := symstore.New(context.Background(), symstore.Config{Backend: backend, ScratchDir: t.TempDir()})
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range append(append([]string{}, set.Bins...), set.Common) {
					fh, err := os.Open(p)
					if err != nil {
						t.Fatal(err)
					}
					st, _ := fh.Stat()
					if _, err := store.Put(context.Background(), idsOf(t, p).gnu, "debuginfo", fh, st.Size(), ""); err != nil {
						t.Fatalf("storing %s: %v", p, err)
					}
					fh.Close()
				}
				return locate.Config{Order: []string{locate.SourceStore}, Store: locate.Store(store)}
			},
			"debuginfod": func(t *testing.T) locate.Config {
				srv := testfixture.StartDebuginfod(t, served, ready...)
				t.Cleanup(srv.Stop)
				client, err := debuginfod.New(debuginfod.Config{URLs: []string{srv.URL}, CacheDir: t.TempDir()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { client.Close() })
				return locate.Config{Order: []string{locate.SourceDebuginfod}, Debuginfod: client}
			},
		}
		for _, name := range []string{"symbol_store", "debuginfod"} {
			t.Run(name+dwarf, func(t *testing.T) {
				opt := defaults()
				opt.Locate = sources[name](t)
				opt.FetchWait = opt.Timeout // wait for the downloads: this test is about the answers
				s := newSym(t, opt)
				for i, bin := range set.Bins {
					addrs := textAddrs(t, set.Orig[i], 400)
					want := llvmLines(t, set.Orig[i], addrs)
					var frames []rawFrame
					for _, a := range addrs {
						frames = append(frames, rawFrame{file: "/gone/" + filepath.Base(bin), ids: fileIDs{gnu: idsOf(t, bin).gnu}, addr: a})
					}
					pd, locs := rawProfile(frames...)
					s.Profiles(context.Background(), pd)
					differ, resolved := 0, 0
					for j, loc := range locs {
						if want[j] == nil {
							continue
						}
						resolved++
						if got := frameLines(pd, loc); strings.Join(got, " ") != strings.Join(want[j], " ") {
							if differ++; differ <= 3 {
								t.Errorf("%s %#x: %v (reason %q), llvm %v", filepath.Base(bin), addrs[j], got, reasonOf(pd, loc), want[j])
							}
						}
					}
					t.Logf("%s: %d of %d addresses differ from llvm-symbolizer-19 on the original", filepath.Base(bin), differ, resolved)
					if resolved < 100 || differ > 0 {
						t.Errorf("%s: %d of %d differ", bin, differ, resolved)
					}
				}
			})
		}
	}
}
