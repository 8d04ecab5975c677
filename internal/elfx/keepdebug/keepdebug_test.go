package keepdebug

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/testfixture"
)

func extract(t *testing.T, src string, comp Compression) (string, Stats) {
	t.Helper()
	f, err := elfx.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := filepath.Join(t.TempDir(), "out.debug")
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	st, err := Write(f, w, comp)
	if err != nil {
		t.Fatal(err)
	}
	return out, st
}

// The extracted file names every function of the fixture with the same
// frames (function, file, line) as the unstripped original, through our
// engine and through llvm-symbolizer, while dropping the code.
func TestExtractSymbolizesLikeOriginal(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "keepdebug", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=keepdebug"}})
	id := testfixture.BuildID(t, bin)
	var addrs []uint64
	for _, fn := range []string{"spin_keepdebug", "main"} {
		start, size := testfixture.Func(t, bin, fn)
		for off := uint64(0); off < size; off += 3 {
			addrs = append(addrs, start+off)
		}
	}
	for _, comp := range []Compression{Zstd, Zlib, None} {
		t.Run(fmt.Sprint(comp), func(t *testing.T) {
			out, st := extract(t, bin, comp)
			if st.Emptied == 0 || st.OutBytes >= st.InBytes && comp != None {
				t.Errorf("nothing dropped: %+v", st)
			}
			if comp != None && st.Compressed == 0 {
				t.Errorf("no section compressed: %+v", st)
			}
			f, err := elfx.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			got, err := buildid.GNU(f)
			if err != nil || buildid.HexString(got) != id {
				t.Fatalf("build id %x, %v; want %s", got, err, id)
			}
			if !HasSymbols(f) {
				t.Error("extracted file has no symbols")
			}
			if s := f.Section(".text"); s == nil || s.Type != elf.SHT_NOBITS {
				t.Error(".text kept")
			}
			f.Close()

			want := symbolize.New(symbolize.DefaultOptions()).Symbolize(context.Background(), bin, "", addrs)
			// The extracted file alone, as a gateway gets it by build id.
			gotRes := symbolize.New(symbolize.DefaultOptions()).Symbolize(context.Background(), "", out, addrs)
			for i := range addrs {
				if fmt.Sprint(frames(want[i])) != fmt.Sprint(frames(gotRes[i])) {
					t.Errorf("%#x: extracted %v, original %v", addrs[i], frames(gotRes[i]), frames(want[i]))
				}
			}
			if comp == Zstd {
				return // llvm-symbolizer 19 as packaged may lack zstd
			}
			llvm := testfixture.NeedTool(t, "llvm-symbolizer-19", "llvm-symbolizer")
			a := fmt.Sprintf("%#x", addrs[0])
			o1, _ := exec.Command(llvm, "--obj="+bin, a).Output()
			o2, _ := exec.Command(llvm, "--obj="+out, a).Output()
			if string(o1) != string(o2) || !strings.Contains(string(o2), "hot.c:") {
				t.Errorf("llvm-symbolizer on the extracted file: %q, on the original %q", o2, o1)
			}
		})
	}
}

func frames(r symbolize.Result) []string {
	var s []string
	for _, f := range r.Frames {
		s = append(s, fmt.Sprintf("%s %s:%d", f.Function, filepath.Base(f.File), f.Line))
	}
	return s
}

// A stripped binary has nothing to keep but its symbol-less headers.
func TestHasSymbolsStripped(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "keepdebug", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=keepdebug"}})
	stripped, debug := testfixture.SplitDebug(t, bin, true)
	for p, want := range map[string]bool{bin: true, stripped: false, debug: true} {
		f, err := elfx.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if HasSymbols(f) != want {
			t.Errorf("%s: HasSymbols = %v", p, !want)
		}
		f.Close()
	}
	// Re-extracting objcopy's debug file works too (the agent does this
	// for /usr/lib/debug files: compressed, code-free).
	out, _ := extract(t, debug, Zlib)
	f, err := elfx.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !HasSymbols(f) {
		t.Error("re-extracted debug file lost its symbols")
	}
}

// Pace sees every kept byte, in pieces of at most PaceChunk, before it is
// compressed or copied; the output is the same as unpaced; an error from
// Pace stops the extraction.
func TestPace(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "keepdebugpace", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=keepdebugpace"}})
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kept int64
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOBITS && s.Type != elf.SHT_NULL && (s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOTE || keepAlloc[s.Name]) {
			kept += int64(s.FileSize)
		}
	}
	plain, _ := extract(t, bin, Zstd)
	for _, comp := range []Compression{Zstd, Zlib, None} {
		var paced int64
		calls := 0
		out := filepath.Join(t.TempDir(), "paced.debug")
		w, _ := os.Create(out)
		_, err := WriteOptions(f, w, Options{Compression: comp, Pace: func(n int) error {
			if n <= 0 || n > PaceChunk {
				t.Errorf("Pace(%d)", n)
			}
			paced += int64(n)
			calls++
			return nil
		}})
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		if paced != kept {
			t.Errorf("%v: paced %d bytes in %d calls, the kept sections hold %d", comp, paced, calls, kept)
		}
		if comp == Zstd {
			a, _ := os.ReadFile(plain)
			b, _ := os.ReadFile(out)
			if string(a) != string(b) {
				t.Error("paced output differs from unpaced")
			}
		}
	}
	stop := fmt.Errorf("stop")
	w, _ := os.Create(filepath.Join(t.TempDir(), "stopped.debug"))
	defer w.Close()
	if _, err := WriteOptions(f, w, Options{Pace: func(int) error { return stop }}); err != stop {
		t.Errorf("Pace's error: %v", err)
	}
}
