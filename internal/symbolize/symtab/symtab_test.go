package symtab

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
	"github.com/ulikunitz/xz"
)

func hello(t testing.TB, name string, args ...string) string {
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"elf/hello.c"},
		Args: append([]string{"-O2"}, args...)})
}

func table(t testing.TB, path string) (*Table, *elfx.File) {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tab, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	return tab, f
}

// symValue returns a symbol's value from the full .symtab.
func symValue(t testing.TB, f *elfx.File, name string) elf.Symbol {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no symbol %s", name)
	return elf.Symbol{}
}

func TestLookupBasics(t *testing.T) {
	tab, f := table(t, hello(t, "hello-O2"))
	for _, name := range []string{"main", "global_worker", "local_helper", "asm_nosize"} {
		s := symValue(t, f, name)
		got, start, _, ok := tab.Lookup(s.Value)
		if !ok || got != name || start != s.Value {
			t.Errorf("Lookup(%s@%#x) = %q %#x %v", name, s.Value, got, start, ok)
		}
	}
	// asm_nosize has st_size 0: it covers the bytes up to the next symbol.
	s := symValue(t, f, "asm_nosize")
	if s.Size != 0 {
		t.Fatalf("fixture: asm_nosize has size %d", s.Size)
	}
	if got, _, size, ok := tab.Lookup(s.Value + 3); !ok || got != "asm_nosize" || size == 0 {
		t.Errorf("inside unsized symbol: %q size %d ok %v", got, size, ok)
	}
	if _, _, _, ok := tab.Lookup(0); ok {
		t.Error("address 0 resolved")
	}
	if _, _, _, ok := tab.Lookup(^uint64(0)); ok {
		t.Error("top address resolved")
	}
	if tab.SizeBytes() <= 0 || tab.Len() == 0 {
		t.Error("empty table")
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	tab, f := table(t, hello(t, "hello-O2"))
	pc := symValue(t, f, "main").Value + 1
	if n := testing.AllocsPerRun(1000, func() { tab.Lookup(pc) }); n != 0 {
		t.Fatalf("Lookup allocates %v times", n)
	}
}

// Versioned dynamic symbols come back bare, as llvm-symbolizer prints them.
func TestLibcBareNames(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		testfixture.SkipOrFail(t, "no %s", libc)
	}
	tab, f := table(t, libc)
	dyn, _ := f.DynamicSymbols()
	var memcpy uint64
	for _, s := range dyn {
		if s.Name == "memcpy" && s.Version == "GLIBC_2.14" {
			memcpy = s.Value
		}
	}
	if memcpy == 0 {
		testfixture.SkipOrFail(t, "no memcpy@@GLIBC_2.14 in %s", libc)
	}
	name, _, _, ok := tab.Lookup(memcpy)
	if !ok || strings.Contains(name, "@") {
		t.Fatalf("Lookup(memcpy) = %q, %v", name, ok)
	}
	tab.All(func(s Symbol) bool {
		if strings.Contains(s.Name, "@") && !strings.HasSuffix(s.Name, "@plt") {
			t.Errorf("versioned name %q", s.Name)
			return false
		}
		return true
	})
}

// A debug file's .symtab spells symbol versions into names
// (__libc_start_main@GLIBC_2.2.5 and @@GLIBC_2.34 at one address in
// libc6-dbg's file); the binary's .dynsym does not. Both name a function
// the same way, so a frame reads alike symbolized on the host (the binary)
// and on a gateway (the debug file, from a debug directory, debuginfod or
// the symbol store).
func TestVersionSuffixesDropped(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		testfixture.SkipOrFail(t, "no %s", libc)
	}
	bin, bf := table(t, libc)
	id, err := buildid.GNU(bf)
	if err != nil || len(id) < 2 {
		t.Fatalf("libc build id: %v", err)
	}
	hexID := fmt.Sprintf("%x", id)
	dbgPath := filepath.Join("/usr/lib/debug/.build-id", hexID[:2], hexID[2:]+".debug")
	if _, err := os.Stat(dbgPath); err != nil {
		testfixture.SkipOrFail(t, "no libc debug file %s (libc6-dbg)", dbgPath)
	}
	dbg, df := table(t, dbgPath)
	versioned := 0
	syms, _ := df.Symbols()
	for _, s := range syms {
		if strings.Contains(s.Name, "@") {
			versioned++
		}
	}
	if versioned == 0 {
		t.Fatalf("%s has no versioned names: nothing to test", dbgPath)
	}
	dyn, _ := bf.DynamicSymbols()
	compared := 0
	for _, s := range dyn {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF {
			continue
		}
		got, _, _, ok := dbg.Lookup(s.Value)
		if !ok || strings.Contains(got, "@") {
			t.Errorf("debug file: Lookup(%#x) = %q, %v", s.Value, got, ok)
			continue
		}
		if s.Name == "__libc_start_main" || s.Name == "memcpy" {
			if want, _, _, _ := bin.Lookup(s.Value); got != want || got != s.Name {
				t.Errorf("%s: debug file names it %q, the binary %q", s.Name, got, want)
			}
		}
		compared++
	}
	dbg.All(func(s Symbol) bool {
		if strings.Contains(s.Name, "@") && !strings.HasSuffix(s.Name, "@plt") {
			t.Errorf("versioned name %q from the debug file", s.Name)
			return false
		}
		return true
	})
	t.Logf("%d versioned names in %s; %d exported functions looked up", versioned, dbgPath, compared)
}

var pltLabel = regexp.MustCompile(`^([0-9a-f]+) <(.+@plt)>:$`)

// PLT names must match objdump's labels, for lazy PLTs, IBT .plt.sec
// layouts (Debian gcc with -fcf-protection and -z ibtplt), .plt.got, and the
// big system libraries.
func TestPLTMatchesObjdump(t *testing.T) {
	objdump := testfixture.NeedTool(t, "objdump")
	bins := []string{
		hello(t, "hello-O2"),
		hello(t, "hello-ibt", "-fcf-protection=full", "-Wl,-z,ibtplt"),
		hello(t, "hello-now", "-Wl,-z,now"),
		hello(t, "hello-nopie", "-no-pie", "-fno-pie"),
		"/usr/bin/ls", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
	}
	sawSec := false
	for _, bin := range bins {
		if _, err := os.Stat(bin); err != nil {
			testfixture.SkipPart(t, filepath.Base(bin), "no %s: %v", bin, err)
			continue
		}
		tab, f := table(t, bin)
		if f.Section(".plt.sec") != nil {
			sawSec = true
		}
		out := testfixture.Run(t, objdump, "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", bin)
		want := map[uint64]string{}
		for _, line := range strings.Split(out, "\n") {
			m := pltLabel.FindStringSubmatch(line)
			if m == nil || strings.HasPrefix(m[2], "*ABS*") {
				continue // IRELATIVE slots have no symbol to name
			}
			a, _ := strconv.ParseUint(m[1], 16, 64)
			want[a] = m[2]
		}
		got := map[uint64]string{}
		tab.All(func(s Symbol) bool {
			if strings.HasSuffix(s.Name, "@plt") {
				got[s.Start] = s.Name
			}
			return true
		})
		if len(want) == 0 {
			t.Errorf("%s: objdump shows no PLT labels", bin)
		}
		for a, n := range want {
			if got[a] != n {
				t.Errorf("%s: %#x: got %q, objdump %q", filepath.Base(bin), a, got[a], n)
			}
		}
		for a, n := range got {
			if want[a] == "" {
				t.Errorf("%s: %#x: extra %q", filepath.Base(bin), a, n)
			}
		}
		t.Logf("%s: %d PLT entries match objdump", filepath.Base(bin), len(want))
	}
	if !sawSec {
		t.Error("no fixture had an IBT .plt.sec")
	}
}

// makeMiniDebugInfo builds what Fedora's find-debuginfo does: a stripped
// binary (dynsym kept) carrying .gnu_debugdata, an xz-compressed ELF with
// the local function symbols that are not in .dynsym.
func makeMiniDebugInfo(t testing.TB, bin string) string {
	t.Helper()
	objcopy := testfixture.NeedTool(t, "objcopy")
	dir := t.TempDir()
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	f.Close()
	exported := map[string]bool{}
	for _, s := range dyn {
		exported[s.Name] = true
	}
	var keep bytes.Buffer
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && !exported[s.Name] {
			keep.WriteString(s.Name + "\n")
		}
	}
	keepFile := filepath.Join(dir, "keep")
	os.WriteFile(keepFile, keep.Bytes(), 0o644)
	debug := filepath.Join(dir, "debug")
	mini := filepath.Join(dir, "mini")
	testfixture.Run(t, objcopy, "--only-keep-debug", bin, debug)
	testfixture.Run(t, objcopy, "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment", "--keep-symbols="+keepFile, debug, mini)
	raw, err := os.ReadFile(mini)
	if err != nil {
		t.Fatal(err)
	}
	var xzb bytes.Buffer
	w, err := xz.NewWriter(&xzb)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(raw)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	xzFile := filepath.Join(dir, "mini.xz")
	os.WriteFile(xzFile, xzb.Bytes(), 0o644)
	out := filepath.Join(dir, filepath.Base(bin)+"-minidebuginfo")
	testfixture.Run(t, objcopy, "--strip-all", bin, out)
	testfixture.Run(t, objcopy, "--add-section", ".gnu_debugdata="+xzFile, out)
	return out
}

func TestMiniDebugInfo(t *testing.T) {
	full := hello(t, "hello-O2")
	md := makeMiniDebugInfo(t, full)
	mf, err := elfx.Open(md)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	if mf.Section(".symtab") != nil || mf.Section(".gnu_debugdata") == nil {
		t.Fatal("fixture is not a MiniDebugInfo binary")
	}
	tab, err := New(mf)
	if err != nil {
		t.Fatal(err)
	}
	ff, _ := elfx.Open(full)
	defer ff.Close()
	ls := symValue(t, ff, "local_helper")
	if name, _, _, ok := tab.Lookup(ls.Value); !ok || name != "local_helper" {
		t.Fatalf("static function via MiniDebugInfo: %q %v", name, ok)
	}
	// Against llvm-symbolizer on the unstripped original: the rebuilt
	// table names what the full .symtab names.
	fullTab, _ := table(t, full)
	addrs, plt := sampleAddrs(ff, fullTab, 2000)
	want := llvmNames(t, full, addrs)
	agree, total := 0, 0
	for i, a := range addrs {
		if plt[a] || want[i] == "" {
			continue
		}
		if _, in := (&builder{text: execRanges(ff)}).textAt(a); !in {
			continue
		}
		total++
		if got, _, _, _ := tab.Lookup(a); got == want[i] {
			agree++
		} else {
			t.Logf("%#x: got %q, llvm on the full binary %q", a, got, want[i])
		}
	}
	t.Logf("MiniDebugInfo vs llvm-symbolizer on the full binary: %d/%d", agree, total)
	if total == 0 || float64(agree) < 0.995*float64(total) {
		t.Errorf("only %d/%d agree", agree, total)
	}
}

func TestCorruptMiniDebugInfo(t *testing.T) {
	f, err := elfx.NewFile(testfixture.BuildELF())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unxz(f, []byte("not xz")); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("garbage: %v", err)
	}
	var b bytes.Buffer
	w, _ := xz.NewWriter(&b)
	w.Write(make([]byte, 1<<20))
	w.Close()
	if out, err := unxz(f, b.Bytes()); err != nil || len(out) != 1<<20 {
		t.Fatalf("1 MiB: %d %v", len(out), err)
	}
}

// An xz bomb in .gnu_debugdata stops at MaxMiniDebugInfo, and at what is
// left of the file's decompression limit, with limit_exceeded; what was
// allocated stays within a small multiple of the bound.
func TestMiniDebugInfoBomb(t *testing.T) {
	for _, c := range []struct {
		name  string
		lim   elfx.Limits
		bytes int64
		bound int64
	}{
		{"MaxMiniDebugInfo", elfx.Limits{}, MaxMiniDebugInfo + 1<<20, MaxMiniDebugInfo},
		{"file budget", elfx.Limits{MaxDecompressedBytes: 16 << 20}, 64 << 20, 16 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			img := testfixture.BuildELF(testfixture.Section{Name: ".gnu_debugdata", Type: elf.SHT_PROGBITS, Data: testfixture.XZ(t, c.bytes)})
			f, err := elfx.NewFileLimits(img, c.lim)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = New(f)
			runtime.ReadMemStats(&after)
			n := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d-byte file expanding to %d: %v; allocated %d", len(img), c.bytes, err, n)
			if !errors.Is(err, frame.ErrLimitExceeded) {
				t.Fatalf("got %v, want %v", err, frame.ErrLimitExceeded)
			}
			// Doubling buffers up to the bound (twice the bound in all),
			// plus the xz decoder's own garbage; the live peak is far less.
			if n > uint64(4*c.bound+(16<<20)) {
				t.Errorf("allocated %d bytes against a bound of %d", n, c.bound)
			}
		})
	}
	// A bomb nested in the MiniDebugInfo ELF is charged to the outer file.
	inner := testfixture.CompressedSection(t, ".symtab", elf.COMPRESS_ZLIB, 1<<30, 1<<10)
	inner.Type = elf.SHT_SYMTAB
	var b bytes.Buffer
	w, _ := xz.NewWriter(&b)
	w.Write(testfixture.BuildELF(inner))
	w.Close()
	f, err := elfx.NewFile(testfixture.BuildELF(testfixture.Section{Name: ".gnu_debugdata", Type: elf.SHT_PROGBITS, Data: b.Bytes()}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(f); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("nested bomb: %v, want %v", err, frame.ErrLimitExceeded)
	}
}

func TestRelocSlotsCorrupt(t *testing.T) {
	le := []byte{1, 2, 3}
	if err := relocSlots(le, elf.ELFCLASS64, nil, elf.EM_X86_64, true, nil, map[uint64]string{}); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("odd size: %v", err)
	}
	// A JUMP_SLOT naming symbol 5 of an empty table.
	rel := make([]byte, 24)
	rel[8] = byte(elf.R_X86_64_JMP_SLOT)
	rel[12] = 5
	if err := relocSlots(rel, elf.ELFCLASS64, binary.LittleEndian, elf.EM_X86_64, true, nil, map[uint64]string{}); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("bad symbol index: %v", err)
	}
}

func FuzzNew(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	for _, p := range []string{hello(f, "hello-O2"), hello(f, "hello-ibt", "-fcf-protection=full", "-Wl,-z,ibtplt"), makeMiniDebugInfo(f, hello(f, "hello-O2"))} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elfx.NewFile(data)
		if err != nil {
			return
		}
		tab, err := New(ef)
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, frame.ErrLimitExceeded) {
				t.Fatalf("error not marked corrupt: %v", err)
			}
			return
		}
		first, prev := true, uint64(0)
		tab.All(func(s Symbol) bool {
			if s.End <= s.Start || (!first && s.Start <= prev) {
				t.Fatalf("bad entry %+v after start %#x", s, prev)
			}
			first, prev = false, s.Start
			return true
		})
		tab.Lookup(0x1000)
	})
}
