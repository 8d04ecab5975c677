package gopclntab

import (
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// build is one fixture compiled twice by the same toolchain: with DWARF (the
// ground truth for llvm-symbolizer) and with -s -w (what we symbolize).
type build struct {
	name            string
	dwarf, stripped string
}

func fixture(t testing.TB, extra ...string) build {
	t.Helper()
	name := "gopclntab" + strings.Join(extra, "")
	name = strings.NewReplacer("-", "", "=", "_", " ", "").Replace(name)
	d := testfixture.Build(t, testfixture.Spec{Name: name, Lang: "go", Sources: []string{"gopclntab"}, Args: extra})
	s := testfixture.Build(t, testfixture.Spec{Name: name + "_stripped", Lang: "go", Sources: []string{"gopclntab"},
		Args: append(append([]string{}, extra...), "-ldflags=-s -w")})
	return build{name: "go-current" + strings.Join(extra, ""), dwarf: d, stripped: s}
}

// oldToolchains are other Go releases to test the older table formats with
// (a skipped part of the test where missing, a failure under CI) (Debian ships golang-1.19-go, which writes the Go 1.18
// format: 0xfffffff0, inline tree entries with parent/file/line fields).
var oldToolchains = []string{"/usr/lib/go-1.19/bin/go"}

// fixtureWith builds the fixture with another toolchain or target (env is
// added to the build's environment), cached by the toolchain's version, env
// and the sources' contents.
func fixtureWith(t testing.TB, gobin string, env ...string) (build, bool) {
	return fixtureArgs(t, gobin, env, "")
}

// fixtureArgs is fixtureWith with linker flags for both builds.
func fixtureArgs(t testing.TB, gobin string, env []string, ldflags string) (build, bool) {
	t.Helper()
	if _, err := os.Stat(gobin); err != nil {
		return build{}, false
	}
	ver, err := exec.Command(gobin, "version").Output()
	if err != nil {
		return build{}, false
	}
	v := strings.Fields(string(ver))[2]
	for _, e := range append(append([]string{}, env...), ldflags) {
		if e != "" {
			v += "-" + strings.NewReplacer("=", "_", " ", "_", "/", "_").Replace(e)
		}
	}
	src := testfixture.Src(t, "gopclntab")
	h := fmt.Sprintf("%x", hashDir(t, src))
	dir := filepath.Join(testfixture.CacheDir(), "gopclntab-"+v+"-"+h)
	b := build{name: v, dwarf: filepath.Join(dir, "dwarf"), stripped: filepath.Join(dir, "stripped")}
	if _, err := os.Stat(b.stripped); err == nil {
		return b, true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		out  string
		args []string
	}{{b.dwarf, []string{"-ldflags=" + ldflags}}, {b.stripped, []string{"-ldflags=" + ldflags + " -s -w"}}} {
		args := append([]string{"build", "-o", o.out + ".tmp"}, o.args...)
		cmd := exec.Command(gobin, append(args, ".")...)
		cmd.Dir = src
		cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local"), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd.Args, err, out)
		}
		if err := os.Rename(o.out+".tmp", o.out); err != nil {
			t.Fatal(err)
		}
	}
	return b, true
}

func hashDir(t testing.TB, dir string) uint64 {
	var h uint64 = 14695981039346656037
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append([]byte(e.Name()), b...) {
			h = (h ^ uint64(c)) * 1099511628211
		}
	}
	return h
}

func allBuilds(t *testing.T) []build {
	bs := []build{fixture(t), fixture(t, "-buildmode=pie")}
	// Other targets: 4-byte pointers, and a 4-byte pc quantum.
	gobin := testfixture.NeedTool(t, "go")
	for _, arch := range []string{"GOARCH=386", "GOARCH=arm64"} {
		if b, ok := fixtureWith(t, gobin, arch); ok {
			bs = append(bs, b)
		}
	}
	// External linking puts C start-up code first in .text, so the Go text
	// start must come from moduledata, not the section.
	if _, err := exec.LookPath("gcc"); err == nil {
		if b, ok := fixtureArgs(t, gobin, []string{"CGO_ENABLED=1"}, "-linkmode=external"); ok {
			bs = append(bs, b)
		}
	} else {
		testfixture.SkipPart(t, "linkmode-external", "gcc not installed: external linking not tested")
	}
	for _, g := range oldToolchains {
		if b, ok := fixtureWith(t, g); ok {
			bs = append(bs, b)
		} else {
			testfixture.SkipPart(t, filepath.Base(filepath.Dir(filepath.Dir(g))), "%s not installed (golang-1.19-go): older table format not tested", g)
		}
	}
	return bs
}

func open(t testing.TB, path string) *Table {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tab, err := New(f)
	if err != nil {
		t.Fatalf("New(%s): %v", path, err)
	}
	return tab
}

func textBytes(t testing.TB, path string) []byte {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := f.Section(".text").Data()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameCode checks that the two builds place the same code at the same
// addresses, so that DWARF answers for one are ground truth for the other.
// The .text bytes are not quite identical: the build info in .rodata records
// "-ldflags=-s -w", which shifts later read-only data, and so changes a few
// pc-relative displacements. Equal function tables plus few differing bytes
// show that no code moved.
func sameCode(t *testing.T, b build, stripped *Table) {
	t.Helper()
	a, c := textBytes(t, b.dwarf), textBytes(t, b.stripped)
	if len(a) != len(c) {
		t.Fatalf(".text is %d bytes with DWARF, %d stripped", len(a), len(c))
	}
	diff := 0
	for i := range a {
		if a[i] != c[i] {
			diff++
		}
	}
	if diff > len(a)/50 {
		t.Fatalf("%d .text bytes differ between the builds", diff)
	}
	ref := open(t, b.dwarf)
	if ref.nfunc != stripped.nfunc {
		t.Fatalf("%d functions with DWARF, %d stripped", ref.nfunc, stripped.nfunc)
	}
	for i := 0; i <= ref.nfunc; i++ {
		if ref.entry(i) != stripped.entry(i) {
			t.Fatalf("function %d at %#x with DWARF, %#x stripped", i, ref.entry(i), stripped.entry(i))
		}
	}
}

type llvmFrame = testfixture.LLVMFrame

func llvmSymbolize(t testing.TB, obj string, pcs []uint64) [][]llvmFrame {
	return testfixture.LLVMSymbolize(t, obj, pcs, "--inlines", "--functions=linkage")
}

// samplePCs picks addresses spread over every function: its entry and a few
// random offsets inside it (the pclntab and DWARF line tables both resolve
// any byte, not only instruction starts).
func samplePCs(tab *Table, perFunc int) []uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	var pcs []uint64
	for i := 0; i < tab.nfunc; i++ {
		lo, hi := tab.entry(i), tab.entry(i+1)
		pcs = append(pcs, lo)
		for k := 0; k < perFunc && hi > lo+1; k++ {
			pcs = append(pcs, lo+1+r.Uint64N(hi-lo-1))
		}
	}
	return pcs
}

// normName maps Go's DWARF and pclntab spellings of a name to one form. The
// compiler names generic instantiations by shape in DWARF
// ("main.sum[go.shape.int]") but writes "main.sum[...]" in the pclntab, so
// type arguments are dropped on both sides.
//
// Assembly functions carry their ABI in DWARF ("internal/cpu.cpuid.abi0"),
// the linker symbol's name, while the pclntab has the Go name.
//
// A few generated names spell a separator "·" in the pclntab and "." in
// DWARF ("type:.eq.runtime.untracedG·7").
func normName(s string) string {
	s = strings.ReplaceAll(strings.TrimSuffix(s, ".abi0"), "·", ".")
	var b strings.Builder
	depth := 0
	for _, c := range s {
		switch {
		case c == '[':
			if depth == 0 {
				b.WriteString("[...]")
			}
			depth++
		case c == ']':
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// normFile undoes llvm-symbolizer joining relative DWARF file names with
// the compilation directory Go records, ".": "./<autogenerated>".
func normFile(s string) string { return strings.TrimPrefix(s, "./") }

type score struct {
	n, outer, chain, uncovered int
	lineN, fileLine            int // over addresses where llvm knows the line
}

func (s score) pct(k int) float64 { return 100 * float64(k) / float64(max(s.n, 1)) }

func (s score) linePct() float64 { return 100 * float64(s.fileLine) / float64(max(s.lineN, 1)) }

func compare(t *testing.T, tab *Table, pcs []uint64, want [][]llvmFrame) score {
	var sc score
	var logged int
	var dst []frame.Frame
	for i, pc := range pcs {
		w := want[i]
		if len(w) == 0 || w[0].FunctionName == "??" || w[0].FunctionName == "" {
			continue
		}
		sc.n++
		var err error
		dst, err = tab.Lookup(pc, true, dst[:0])
		if err != nil {
			t.Errorf("Lookup(%#x): %v", pc, err)
			continue
		}
		if len(dst) == 0 {
			sc.uncovered++
		}
		okOuter := len(dst) > 0 && normName(dst[len(dst)-1].Name) == normName(w[len(w)-1].FunctionName)
		okChain := len(dst) == len(w)
		for k := 0; okChain && k < len(w); k++ {
			okChain = normName(dst[k].Name) == normName(w[k].FunctionName)
		}
		// DWARF says line 0 on some prologues of generated functions; there
		// is nothing to compare against.
		knowLine := w[0].Line != 0
		okLine := !knowLine || len(dst) > 0 && dst[0].File == normFile(w[0].FileName) && dst[0].Line == w[0].Line
		if knowLine {
			sc.lineN++
		}
		if okOuter {
			sc.outer++
		}
		if okChain {
			sc.chain++
		}
		if okLine && knowLine {
			sc.fileLine++
		}
		if (!okOuter || !okChain || !okLine) && logged < 15 {
			logged++
			t.Logf("%#x (outer %v chain %v line %v):\n  ours: %s\n  llvm: %s", pc, okOuter, okChain, okLine, fmtOurs(dst), fmtLLVM(w))
		}
	}
	return sc
}

func fmtOurs(fs []frame.Frame) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%q %s:%d", f.Name, f.File, f.Line))
	}
	return strings.Join(s, " <- ")
}

func fmtLLVM(fs []llvmFrame) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%q %s:%d", f.FunctionName, f.FileName, f.Line))
	}
	return strings.Join(s, " <- ")
}

// TestAgainstLLVM symbolizes the stripped build and compares with
// llvm-symbolizer on the DWARF build of the same code at the same addresses.
func TestAgainstLLVM(t *testing.T) {
	for _, b := range allBuilds(t) {
		t.Run(b.name, func(t *testing.T) {
			tab := open(t, b.stripped)
			sameCode(t, b, tab)
			if tab.gofunc == 0 {
				t.Fatal("moduledata.gofunc not found")
			}
			pcs := samplePCs(tab, 3)
			want := llvmSymbolize(t, b.dwarf, pcs)
			sc := compare(t, tab, pcs, want)
			t.Logf("%s: %d addresses llvm resolves: outer %.2f%%, chain %.2f%%, innermost file:line %.2f%% (of %d with a line), uncovered %d",
				b.name, sc.n, sc.pct(sc.outer), sc.pct(sc.chain), sc.linePct(), sc.lineN, sc.uncovered)
			if sc.n < 1000 {
				t.Fatalf("only %d addresses resolved by llvm-symbolizer", sc.n)
			}
			if sc.pct(sc.outer) < 99.5 || sc.pct(sc.chain) < 98 || sc.linePct() < 98 {
				t.Errorf("accuracy below target")
			}
		})
	}
}

// TestInlineChains checks specific fixture functions whose inlining the
// compiler is known to do, so a regression in inline decoding shows by name.
func TestInlineChains(t *testing.T) {
	b := fixture(t)
	tab := open(t, b.stripped)
	pcs := samplePCs(tab, 40)
	seen := map[string]bool{}
	var dst []frame.Frame
	for _, pc := range pcs {
		var err error
		dst, err = tab.Lookup(pc, true, dst[:0])
		if err != nil {
			t.Fatal(err)
		}
		if len(dst) < 2 || !strings.HasPrefix(dst[len(dst)-1].Name, "main.") {
			continue
		}
		var names []string
		for _, f := range dst {
			names = append(names, normName(f.Name))
		}
		seen[strings.Join(names, " <- ")] = true
	}
	for _, chain := range []string{
		"main.clamp <- main.mix <- main.mix3 <- main.hot",
		"main.point.add <- main.hot",
		"main.abs <- main.point.norm1 <- main.hot",
		"main.sum[...] <- main.generic",
		"main.(*stack[...]).push <- main.useStack",
	} {
		if !seen[chain] {
			t.Errorf("no pc resolves to %s", chain)
		}
	}
	if t.Failed() {
		for c := range seen {
			t.Log(c)
		}
	}
}

func TestLookupBasics(t *testing.T) {
	b := fixture(t)
	tab := open(t, b.stripped)
	lo, hi := tab.TextRange()
	for _, pc := range []uint64{0, lo - 1, hi, hi + 100, ^uint64(0)} {
		dst := []frame.Frame{{Name: "keep"}}
		got, err := tab.Lookup(pc, true, dst)
		if err != nil || len(got) != 1 || got[0].Name != "keep" {
			t.Errorf("Lookup(%#x) = %v, %v; want dst unchanged", pc, got, err)
		}
	}
	// inlines=false gives the physical function with its own line at pc.
	var found bool
	for _, pc := range samplePCs(tab, 20) {
		all, err := tab.Lookup(pc, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) < 2 {
			continue
		}
		one, err := tab.Lookup(pc, false, nil)
		if err != nil || len(one) != 1 {
			t.Fatalf("Lookup(%#x, false) = %v, %v", pc, one, err)
		}
		outer := all[len(all)-1]
		if one[0].Name != outer.Name || one[0].StartAddress != outer.StartAddress {
			t.Fatalf("Lookup(%#x, false) = %+v, want function %s", pc, one[0], outer.Name)
		}
		// Its line is the line at pc, which is in the inlined callee's body.
		if one[0].Line != all[0].Line {
			t.Fatalf("Lookup(%#x, false) line %d, want %d", pc, one[0].Line, all[0].Line)
		}
		found = true
	}
	if !found {
		t.Fatal("no inlined pc found")
	}
	if tab.SizeBytes() <= 0 {
		t.Error("SizeBytes")
	}
}

func TestNoPclntab(t *testing.T) {
	cc := testfixture.NeedTool(t, "gcc", "cc")
	dir := t.TempDir()
	src := filepath.Join(dir, "a.c")
	os.WriteFile(src, []byte("int main(void){return 0;}\n"), 0o644)
	out := filepath.Join(dir, "a")
	testfixture.Run(t, cc, "-o", out, src)
	f, err := elfx.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := New(f); !errors.Is(err, frame.ErrNoDebugInfo) {
		t.Fatalf("New on a C binary: %v, want ErrNoDebugInfo", err)
	}
}

// TestNoSectionHeaders drops the section header table, so New has to find
// the pclntab by its magic and moduledata in the writable segment.
func TestNoSectionHeaders(t *testing.T) {
	b := fixture(t)
	img, err := os.ReadFile(b.stripped)
	if err != nil {
		t.Fatal(err)
	}
	// e_shoff, e_shnum, e_shstrndx of ELF64.
	for _, r := range [][2]int{{0x28, 8}, {0x3c, 2}, {0x3e, 2}} {
		for i := 0; i < r[1]; i++ {
			img[r[0]+i] = 0
		}
	}
	p := filepath.Join(t.TempDir(), "noshdr")
	if err := os.WriteFile(p, img, 0o755); err != nil {
		t.Fatal(err)
	}
	ref := open(t, b.stripped)
	scans0 := scans.Load()
	tab := open(t, p)
	if scans.Load() == scans0 {
		t.Error("found without section headers or symbols, yet not by scanning?")
	}
	if tab.gofunc != ref.gofunc || tab.textStart != ref.textStart {
		t.Fatalf("gofunc %#x text %#x, want %#x %#x", tab.gofunc, tab.textStart, ref.gofunc, ref.textStart)
	}
	var a, c []frame.Frame
	for _, pc := range samplePCs(ref, 2) {
		a, _ = ref.Lookup(pc, true, a[:0])
		c, _ = tab.Lookup(pc, true, c[:0])
		if fmtOurs(a) != fmtOurs(c) {
			t.Fatalf("%#x: %s != %s", pc, fmtOurs(c), fmtOurs(a))
		}
	}
}

// TestTableBySymbol: without a .gopclntab section (external linking puts
// the table in .data.rel.ro; here the section is renamed), New finds the
// table and moduledata through runtime.pclntab and runtime.firstmoduledata,
// without scanning the file.
func TestTableBySymbol(t *testing.T) {
	b := fixture(t)
	objcopy := testfixture.NeedTool(t, "llvm-objcopy-19")
	p := filepath.Join(t.TempDir(), "renamed")
	testfixture.Run(t, objcopy, "--rename-section", ".gopclntab=.rodata.pcl", b.dwarf, p)
	ref := open(t, b.dwarf)
	scans0 := scans.Load()
	tab := open(t, p)
	if n := scans.Load() - scans0; n != 0 {
		t.Errorf("%d scans for a table the symbols locate", n)
	}
	if tab.gofunc != ref.gofunc || tab.textStart != ref.textStart || tab.nfunc != ref.nfunc {
		t.Fatalf("gofunc %#x text %#x, %d funcs; want %#x %#x, %d", tab.gofunc, tab.textStart, tab.nfunc, ref.gofunc, ref.textStart, ref.nfunc)
	}
	var a, c []frame.Frame
	for _, pc := range samplePCs(ref, 2) {
		a, _ = ref.Lookup(pc, true, a[:0])
		c, _ = tab.Lookup(pc, true, c[:0])
		if fmtOurs(a) != fmtOurs(c) {
			t.Fatalf("%#x: %s != %s", pc, fmtOurs(c), fmtOurs(a))
		}
	}
}

func BenchmarkLookupWarm(b *testing.B) {
	fx := fixture(b)
	benchWarm(b, open(b, fx.stripped), 512)
}

// benchWarm looks up a working set of n addresses over and over, as a
// profile's hot addresses are: after the first pass every function is in the
// cache.
func benchWarm(b *testing.B, tab *Table, n int) {
	all := samplePCs(tab, 3)
	r := rand.New(rand.NewPCG(3, 4))
	pcs := make([]uint64, n)
	for i := range pcs {
		pcs[i] = all[r.IntN(len(all))]
	}
	var dst []frame.Frame
	for _, pc := range pcs {
		dst, _ = tab.Lookup(pc, true, dst[:0])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = tab.Lookup(pcs[i%len(pcs)], true, dst[:0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/addr")
}

// BenchmarkLookupCold measures a lookup whose function is not cached.
func BenchmarkLookupCold(b *testing.B) {
	fx := fixture(b)
	f, err := elfx.Open(fx.stripped)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	pcs := samplePCs(open(b, fx.stripped), 3)
	var dst []frame.Frame
	b.ReportAllocs()
	var tab *Table
	for i := 0; i < b.N; i++ {
		if i%len(pcs) == 0 {
			b.StopTimer()
			tab, _ = New(f)
			b.StartTimer()
		}
		dst, _ = tab.Lookup(pcs[i%len(pcs)], true, dst[:0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/addr")
}

// goTool returns a tool binary of the installed Go distribution: large,
// stripped (no DWARF, no .symtab) Go programs.
func goTool(t testing.TB, name string) string {
	t.Helper()
	gobin := testfixture.NeedTool(t, "go")
	out, err := exec.Command(gobin, "env", "GOROOT", "GOHOSTOS", "GOHOSTARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(out))
	p := filepath.Join(f[0], "pkg", "tool", f[1]+"_"+f[2], name)
	if _, err := os.Stat(p); err != nil {
		testfixture.SkipOrFail(t, "%s: %v", p, err)
	}
	return p
}

// TestLargeBinaryVsGosym symbolizes the stripped compiler (tens of
// thousands of functions) and compares the physical function and its
// file:line with debug/gosym, which reads the same table independently but
// knows nothing of inlining.
func TestLargeBinaryVsGosym(t *testing.T) {
	path := goTool(t, "compile")
	tab := open(t, path)
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	data, err := ef.Section(".gopclntab").Data()
	if err != nil {
		t.Fatal(err)
	}
	gt, err := gosym.NewTable(nil, gosym.NewLineTable(data, tab.textStart))
	if err != nil {
		t.Fatal(err)
	}
	pcs := samplePCs(tab, 1)
	var one, all []frame.Frame
	var n, inlined, bad int
	for _, pc := range pcs {
		one, err = tab.Lookup(pc, false, one[:0])
		if err != nil {
			t.Fatalf("%#x: %v", pc, err)
		}
		all, err = tab.Lookup(pc, true, all[:0])
		if err != nil {
			t.Fatalf("%#x: %v", pc, err)
		}
		if len(one) == 0 {
			if len(all) != 0 {
				t.Fatalf("%#x: covered only with inlines", pc)
			}
			continue // padding
		}
		n++
		file, line, fn := gt.PCToLine(pc)
		if one[0].Line == 0 && fn != nil && fn.Name == one[0].Name {
			continue // a linker marker: debug/gosym reads line -1 or garbage
		}
		if fn == nil || fn.Name != one[0].Name || file != one[0].File || uint32(line) != one[0].Line {
			if bad++; bad < 10 {
				name := "<nil>"
				if fn != nil {
					name = fn.Name
				}
				t.Errorf("%#x: got %s %s:%d, gosym %s %s:%d", pc, one[0].Name, one[0].File, one[0].Line, name, file, line)
			}
		}
		if all[len(all)-1].Name != one[0].Name || all[0].Line != one[0].Line || all[0].File != one[0].File {
			t.Fatalf("%#x: inline chain %s does not end in %s or start at its line", pc, fmtOurs(all), fmtOurs(one))
		}
		if len(all) > 1 {
			inlined++
		}
	}
	t.Logf("%s: %d functions, %d addresses, %d with inline frames, %d disagree with debug/gosym", path, tab.nfunc, n, inlined, bad)
	if n < 10000 || inlined < n/20 {
		t.Fatalf("too few addresses (%d) or inlined ones (%d)", n, inlined)
	}
}

func BenchmarkLookupWarmLarge(b *testing.B) {
	tab := open(b, goTool(b, "compile"))
	benchWarm(b, tab, 4096)
}

// TestConcurrent runs lookups from several goroutines on one Table, over
// more functions than the cache holds, so slots are replaced while read.
func TestConcurrent(t *testing.T) {
	tab := open(t, fixture(t).stripped)
	pcs := samplePCs(tab, 2)
	want := make([]string, len(pcs))
	ref := open(t, fixture(t).stripped)
	for i, pc := range pcs {
		fr, err := ref.Lookup(pc, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = fmtOurs(fr)
	}
	errc := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			var dst []frame.Frame
			for k := range pcs {
				i := (k*7919 + g*1013) % len(pcs)
				var err error
				if dst, err = tab.Lookup(pcs[i], true, dst[:0]); err != nil || fmtOurs(dst) != want[i] {
					errc <- fmt.Errorf("%#x: %s, %v; want %s", pcs[i], fmtOurs(dst), err, want[i])
					return
				}
			}
			errc <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestGoVersionAndBuildID(t *testing.T) {
	b := fixture(t)
	f, err := elfx.Open(b.stripped)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := GoVersion(f)
	if err != nil || !strings.HasPrefix(v, "go1.") {
		t.Fatalf("GoVersion = %q, %v", v, err)
	}
	want := strings.TrimSpace(testfixture.Run(t, testfixture.NeedTool(t, "go"), "tool", "buildid", b.stripped))
	if id, err := GoBuildID(f); err != nil || id != want {
		t.Fatalf("GoBuildID = %q, %v; want %q", id, err, want)
	}
}

func BenchmarkNew(b *testing.B) {
	f, err := elfx.Open(goTool(b, "compile"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := New(f); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFuncAt: FuncAt reads each function as Funcs reports it.
func TestFuncAt(t *testing.T) {
	tab := open(t, fixture(t).stripped)
	i := 0
	err := tab.Funcs(func(f *Func, _ []byte) bool {
		g, err := tab.FuncAt(i)
		if err != nil || g != *f {
			t.Fatalf("function %d: FuncAt %+v, %v; Funcs %+v", i, g, err, *f)
		}
		i++
		return true
	})
	if err != nil || i != tab.NumFuncs() {
		t.Fatalf("%d of %d functions: %v", i, tab.NumFuncs(), err)
	}
	if _, err := tab.FuncAt(i); err == nil {
		t.Fatal("FuncAt past the end")
	}
}

// TestManyProgramHeaders: a file claiming 20,000 segments, each the whole
// file, is searched as if it had one (a search per segment would take
// 20,000 times as long: a hang for a gateway handed such a file).
func TestManyProgramHeaders(t *testing.T) {
	b := fixture(t)
	img, err := os.ReadFile(b.stripped)
	if err != nil {
		t.Fatal(err)
	}
	// Drop the section headers, so the table must be searched for, and
	// append the program headers: PT_LOAD, read-only, the whole file.
	for _, r := range [][2]int{{0x28, 8}, {0x3c, 2}, {0x3e, 2}} {
		clear(img[r[0] : r[0]+r[1]])
	}
	phoff := len(img)
	var ph [56]byte
	binary.LittleEndian.PutUint32(ph[0:], uint32(elf.PT_LOAD))
	binary.LittleEndian.PutUint32(ph[4:], uint32(elf.PF_R))
	binary.LittleEndian.PutUint64(ph[32:], uint64(phoff)) // filesz
	binary.LittleEndian.PutUint64(ph[40:], uint64(phoff)) // memsz
	const n = 20000
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(ph[16:], uint64(i)<<12) // vaddr: each its own
		img = append(img, ph[:]...)
	}
	binary.LittleEndian.PutUint64(img[0x20:], uint64(phoff))
	binary.LittleEndian.PutUint16(img[0x38:], n)
	f, err := elfx.NewFile(img)
	if err != nil {
		t.Fatal(err)
	}
	searched0 := searched.Load()
	_, err = New(f)
	if err != nil && !errors.Is(err, frame.ErrNoDebugInfo) && !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("New: %v", err)
	}
	if got := searched.Load() - searched0; got > 4*int64(len(img)) {
		t.Fatalf("searched %d bytes of a %d-byte file", got, len(img))
	}
}

// New runs on goroutines of its own (the symbolizer's open builds it beside
// the DWARF index), where a panic ends the process whatever the caller
// recovers: New contains its own, as a corrupt file, and counts it. An
// elfx.File without its ELF headers stands in for a parser bug.
func TestNewContainsAPanic(t *testing.T) {
	before := contain.Count()
	done := make(chan error, 1)
	go func() {
		_, err := New(&elfx.File{})
		done <- err
	}()
	if err := <-done; !errors.Is(err, frame.ErrCorruptFile) {
		t.Errorf("New on a File without headers: %v; want a corrupt file", err)
	}
	if n := contain.Count() - before; n != 1 {
		t.Errorf("%d panics counted, want 1", n)
	}
}
