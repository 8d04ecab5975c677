package table_test

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

const (
	libc   = "/lib/x86_64-linux-gnu/libc.so.6"
	ldso   = "/lib64/ld-linux-x86-64.so.2"
	cfiSrc = "unwindtable/cfi.c"
)

func build(t testing.TB, path string) (*table.Table, *elfx.File) {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tab, err := table.Build(f, table.Options{})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return tab, f
}

func needFile(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testfixture.SkipOrFail(t, "%s: %v", path, err)
	}
}

func codeOf(f *elfx.File) func(uint64, int) []byte {
	return func(a uint64, n int) []byte {
		b, _ := f.ReadVaddr(a, n)
		return b
	}
}

// cFixtures are the native builds compared with the peer.
func cFixtures(t *testing.T) map[string]string {
	m := map[string]string{}
	for name, spec := range map[string]testfixture.Spec{
		"gcc-O2-nofp":     {Lang: "c", Sources: []string{cfiSrc}, Args: []string{"-O2", "-fomit-frame-pointer"}},
		"gcc-O2-nofp-pie": {Lang: "c", Sources: []string{cfiSrc}, Args: []string{"-O2", "-fomit-frame-pointer", "-fPIE", "-pie"}},
		"gcc-O2-nopie":    {Lang: "c", Sources: []string{cfiSrc}, Args: []string{"-O2", "-fomit-frame-pointer", "-fno-pie", "-no-pie"}},
		"gcc-O2-fp":       {Lang: "c", Sources: []string{cfiSrc}, Args: []string{"-O2", "-fno-omit-frame-pointer"}},
		"clang19-O2":      {Lang: "c", Compiler: "clang-19", Sources: []string{cfiSrc}, Args: []string{"-O2"}},
		"clang19-O2-fp":   {Lang: "c", Compiler: "clang-19", Sources: []string{cfiSrc}, Args: []string{"-O2", "-fno-omit-frame-pointer"}},
		"g++-O2":          {Lang: "c++", Sources: []string{"engine/cpp/main.cc"}, Args: []string{"-O2", "-std=c++17"}},
		"clang++19-O2":    {Lang: "c++", Compiler: "clang++-19", Sources: []string{"engine/cpp/main.cc"}, Args: []string{"-O2", "-std=c++17"}},
		"rust-O2":         {Lang: "rust", Sources: []string{"engine/rust/main.rs"}, Args: []string{"-C", "opt-level=2"}},
	} {
		spec.Name = "unwindtable-" + name
		m[name] = testfixture.Build(t, spec)
	}
	return m
}

// TestEHFrameAgainstLLVM compares, for every address of every FDE, the row
// of our table with llvm-dwarfdump-19's decoding of the same .eh_frame.
func TestEHFrameAgainstLLVM(t *testing.T) {
	// libcrypto: OpenSSL's assembly takes its CFA from registers and from
	// its realigned frames (CFAReg, CFASPDeref).
	files := map[string]string{"libc": libc, "ld.so": ldso, "libcrypto": "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"}
	for name, p := range cFixtures(t) {
		files[name] = p
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			needFile(t, path)
			tab, f := build(t, path)
			checkShape(t, tab)
			if tab.Source != "eh_frame" {
				t.Errorf("source %q", tab.Source)
			}
			fdes := peerFDEs(t, path, "--eh-frame")
			a := compareFDEs(t, tab, fdes, codeOf(f))
			t.Logf("%s: %d FDEs, %d rows: %s; stats %+v", name, len(fdes), len(tab.Rows), a, tab.Stats)
			for _, b := range a.bad {
				t.Error(b)
			}
			if a.addrs == 0 {
				t.Fatal("no addresses compared")
			}
			fromCFISrc := strings.HasPrefix(name, "gcc-") || strings.HasPrefix(name, "clang19-")
			if fromCFISrc && a.sigByCode == 0 {
				t.Error("cfi_restore_plain (a trampoline with plain CFI) was not taken for a signal frame")
			}
			if tab.Stats.BadFDEs != 0 || tab.Stats.FirstError != "" {
				t.Errorf("malformed entries in a real file: %+v", tab.Stats)
			}
			checkGaps(t, tab, fdes, f.File)
		})
	}
}

func TestMaxRows(t *testing.T) {
	needFile(t, libc)
	f, err := elfx.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = table.Build(f, table.Options{MaxRows: 1000})
	if !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("got %v, want a limit error", err)
	}
}

func TestNoUnwindInfo(t *testing.T) {
	// A file whose CFI sections were removed and that is no Go binary.
	bin := testfixture.Build(t, testfixture.Spec{Name: "unwindtable-nocfi", Lang: "c", Sources: []string{cfiSrc},
		Args: []string{"-O2", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"}})
	out := filepath.Join(t.TempDir(), "stripped")
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", "--remove-section=.debug_frame", bin, out)
	f, err := elfx.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := table.Build(f, table.Options{}); !errors.Is(err, table.ErrNoUnwindInfo) || !errors.Is(err, frame.ErrNoDebugInfo) {
		t.Fatalf("got %v", err)
	}
}

func TestUnsupportedArch(t *testing.T) {
	// A 32-bit x86 object file header is enough.
	img := make([]byte, 52)
	copy(img, "\x7fELF\x01\x01\x01")
	img[16], img[18], img[20] = 2, 3, 1 // ET_EXEC, EM_386, EV_CURRENT
	img[40], img[42], img[46] = 52, 32, 40
	f, err := elfx.NewFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if f.Machine != elf.EM_386 {
		t.Fatalf("machine %v", f.Machine)
	}
	if _, err := table.Build(f, table.Options{}); !errors.Is(err, table.ErrUnsupportedArch) {
		t.Fatalf("got %v", err)
	}
}
