package dwarf

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

const llvmSymbolizer = "llvm-symbolizer-19"

var cSources = []string{"dwarf/c/main.c", "dwarf/c/util.c", "dwarf/c/work.c"}

type fixture struct {
	name string
	path string
}

// cFixture builds the C fixture with the given flags.
func cFixture(t testing.TB, name string, args ...string) fixture {
	return fixture{name, testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: cSources, Args: args})}
}

// recompress copies bin with its debug sections compressed by objcopy,
// for compressions the compiler cannot produce itself (gcc 12 has no
// -gz=zstd).
func recompress(t testing.TB, bin, kind string) string {
	objcopy := testfixture.NeedTool(t, "objcopy")
	out := filepath.Join(t.TempDir(), filepath.Base(bin)+"."+kind)
	testfixture.Run(t, objcopy, "--compress-debug-sections="+kind, bin, out)
	return out
}

// gccHasZstd reports whether gcc accepts -gz=zstd.
func gccHasZstd() bool {
	cmd := exec.Command("gcc", "-gz=zstd", "-x", "c", "-c", "-o", os.DevNull, "-")
	cmd.Stdin = strings.NewReader("int x;\n")
	return cmd.Run() == nil
}

// libcDebug returns the libc6-dbg debug file of the running system's libc.
func libcDebug(t testing.TB) string {
	ef, err := elf.Open("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		testfixture.SkipOrFail(t, "no libc.so.6: %v", err)
	}
	defer ef.Close()
	id := buildID(ef)
	if len(id) < 2 {
		testfixture.SkipOrFail(t, "libc.so.6 has no build id")
	}
	h := hex.EncodeToString(id)
	p := filepath.Join("/usr/lib/debug/.build-id", h[:2], h[2:]+".debug")
	if _, err := os.Stat(p); err != nil {
		testfixture.SkipOrFail(t, "libc debug file missing (install libc6-dbg): %v", err)
	}
	return p
}

func buildID(ef *elf.File) []byte {
	s := ef.Section(".note.gnu.build-id")
	if s == nil {
		return nil
	}
	d, err := s.Data()
	if err != nil || len(d) < 16 {
		return nil
	}
	nameSz := ef.ByteOrder.Uint32(d[0:])
	descSz := ef.ByteOrder.Uint32(d[4:])
	off := 12 + (int(nameSz)+3)&^3
	if off+int(descSz) > len(d) {
		return nil
	}
	return d[off : off+int(descSz)]
}

// clangFixture builds the C sources with clang-19. Clang's DWARF 5 uses the
// forms GCC does not (strx, addrx, rnglistx, .debug_str_offsets,
// .debug_addr, MD5 file entries). Without clang-19 the variant is a skipped
// part of the test (a failure under CI).
func clangFixture(t *testing.T, name string, args ...string) (fixture, bool) {
	cc, err := exec.LookPath("clang-19")
	if err != nil {
		testfixture.SkipPart(t, name, "clang-19 not installed: %s not tested", name)
		return fixture{}, false
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := append(append([]string{}, args...), "-o", out)
	for _, s := range cSources {
		cmd = append(cmd, testfixture.Src(t, s))
	}
	testfixture.Run(t, cc, cmd...)
	return fixture{name, out}, true
}

// fixtures is the build matrix of the accuracy test.
func fixtures(t *testing.T) []fixture {
	var fs []fixture
	for _, o := range []string{"-O0", "-O2", "-O3"} {
		for _, v := range []string{"-gdwarf-4", "-gdwarf-5"} {
			fs = append(fs, cFixture(t, "c"+o+v, o, v))
		}
	}
	fs = append(fs,
		cFixture(t, "c-O2-nopie", "-O2", "-gdwarf-4", "-fno-pie", "-no-pie"),
		cFixture(t, "c-O2-zlib", "-O2", "-gdwarf-5", "-gz=zlib"),
		// LTO: inlined instances refer across units (DW_FORM_ref_addr)
		// to the abstract functions of the early-debug units.
		cFixture(t, "c-O2-flto", "-O2", "-gdwarf-5", "-flto"),
		fixture{"cpp-O2-dwarf5", testfixture.Build(t, testfixture.Spec{Name: "cpp-O2-dwarf5", Lang: "c++", Sources: []string{"dwarf/cpp/main.cc"}, Args: []string{"-O2", "-gdwarf-5"}})},
		fixture{"cpp-O1-dwarf4", testfixture.Build(t, testfixture.Spec{Name: "cpp-O1-dwarf4", Lang: "c++", Sources: []string{"dwarf/cpp/main.cc"}, Args: []string{"-O1", "-gdwarf-4"}})},
		fixture{"so-O3", testfixture.Build(t, testfixture.Spec{Name: "libwork.so", Lang: "c", Sources: []string{"dwarf/c/util.c", "dwarf/c/work.c"}, Args: []string{"-O3", "-g", "-shared", "-fPIC"}})},
		fixture{"go", testfixture.Build(t, testfixture.Spec{Name: "goprog", Lang: "go", Sources: []string{"dwarf/goprog"}})},
	)
	if gccHasZstd() {
		fs = append(fs, cFixture(t, "c-O2-zstd", "-O2", "-gdwarf-4", "-gz=zstd"))
	} else {
		bin := cFixture(t, "c-O2-forzstd", "-O2", "-gdwarf-4").path
		fs = append(fs, fixture{"c-O2-zstd(objcopy)", recompress(t, bin, "zstd")})
	}
	for _, c := range [][]string{{"-O2", "-gdwarf-5"}, {"-O3", "-gdwarf-4"}, {"-O1", "-gdwarf-5", "-shared", "-fPIC"}} {
		if fx, ok := clangFixture(t, "clang"+strings.Join(c, ""), c...); ok {
			fs = append(fs, fx)
		}
	}
	_, dbg := testfixture.SplitDebug(t, fs[3].path, true)
	fs = append(fs, fixture{"c-O2-dwarf5-split.debug", dbg})
	return fs
}

// llvmFrame is one frame of llvm-symbolizer's JSON output.
type llvmFrame = testfixture.LLVMFrame

// runLLVM symbolizes addrs with one llvm-symbolizer process; --no-demangle
// so names compare byte for byte with what the table returns.
func runLLVM(t testing.TB, obj string, addrs []uint64) [][]llvmFrame {
	return testfixture.LLVMSymbolize(t, obj, addrs, "--inlines", "--no-demangle")
}

// pickAddrs chooses test addresses: every function start, evenly spread
// interior addresses, and the start and middle of inlined ranges.
func pickAddrs(t testing.TB, path string, tab *Table, max int) []uint64 {
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	var fns []elf.Symbol
	var total uint64
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 && s.Value != 0 {
			fns = append(fns, s)
			total += s.Size
		}
	}
	set := map[uint64]bool{}
	step := total/uint64(max/2+1) + 1
	for _, s := range fns {
		set[s.Value] = true
		for a := s.Value + step/2; a < s.Value+s.Size; a += step {
			set[a] = true
		}
	}
	var inl []uint64
	for _, u := range tab.units {
		d, err := tab.fullOf(u)
		if err != nil {
			continue
		}
		for _, sp := range d.spans {
			if !d.nodes[sp.node].sub {
				inl = append(inl, sp.lo, sp.lo+(sp.hi-sp.lo)/2)
			}
		}
	}
	if n := len(inl); n > max/2 {
		for i := 0; i < max/2; i++ {
			set[inl[i*n/(max/2)]] = true
		}
	} else {
		for _, a := range inl {
			set[a] = true
		}
	}
	out := make([]uint64, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.Sort(out)
	if len(out) > max {
		sub := make([]uint64, 0, max)
		for i := 0; i < max; i++ {
			sub = append(sub, out[i*len(out)/max])
		}
		out = sub
	}
	return out
}

func openTable(t testing.TB, path string) (*elfx.File, *Table) {
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tab, err := New(f)
	if err != nil {
		t.Fatalf("New(%s): %v", path, err)
	}
	return f, tab
}

// outerNameOK compares an outermost frame name. llvm replaces it with the
// ELF symbol covering the address, which for GCC's clones carries a suffix
// (foo.part.0, foo.cold, foo.isra.0, foo.constprop.0) the DWARF name lacks.
func outerNameOK(llvm, ours string) bool {
	if llvm == ours {
		return true
	}
	return strings.HasPrefix(llvm, ours+".")
}

// locOK compares file:line. When DWARF has no line row for an address,
// llvm fills the outermost frame's file from the symbol table's STT_FILE
// entry (a bare name like "syslog.c"); that is not DWARF's to match.
func locOK(outer bool, g frame.Frame, w llvmFrame) bool {
	if g.File == w.FileName && g.Line == w.Line {
		return true
	}
	return outer && g.File == "" && g.Line == 0 && w.Line == 0 && !strings.Contains(w.FileName, "/")
}

type score struct {
	n, chain, inner, col, start, outerName int
	extra                                  int // we answer, llvm does not
	bad                                    []string
}

func compare(addr uint64, want []llvmFrame, got []frame.Frame, sc *score) {
	// A lone frame with no line and no declaration comes from llvm's
	// symbol-table fallback (its file from an STT_FILE symbol), not DWARF.
	resolved := len(want) > 1 || len(want) == 1 && want[0].FileName != "" &&
		(want[0].Line != 0 || want[0].StartLine != 0 || want[0].StartFileName != "")
	if !resolved {
		if len(got) > 0 && got[0].Line != 0 {
			sc.extra++
		}
		return
	}
	sc.n++
	var why []string
	if len(got) == 0 {
		why = append(why, "no frames")
	} else {
		if locOK(len(got) == 1, got[0], want[0]) {
			sc.inner++
		} else {
			why = append(why, fmt.Sprintf("inner %s:%d want %s:%d", got[0].File, got[0].Line, want[0].FileName, want[0].Line))
		}
		if got[0].Column == want[0].Column && got[0].Discriminator == want[0].Discriminator {
			sc.col++
		}
	}
	chainOK := len(got) == len(want)
	if !chainOK {
		why = append(why, fmt.Sprintf("%d frames want %d", len(got), len(want)))
	}
	startOK := true
	for i := 0; chainOK && i < len(got); i++ {
		g, w := got[i], want[i]
		if i == len(got)-1 {
			if outerNameOK(w.FunctionName, g.Name) {
				sc.outerName++
			} else if os.Getenv("DWARFSYM_DEBUG") != "" {
				fmt.Printf("outer %#x: %q want %q\n", addr, g.Name, w.FunctionName)
			}
		} else if g.Name != w.FunctionName {
			chainOK = false
			why = append(why, fmt.Sprintf("frame %d name %q want %q", i, g.Name, w.FunctionName))
		}
		if !locOK(i == len(got)-1, g, w) {
			chainOK = false
			why = append(why, fmt.Sprintf("frame %d at %s:%d want %s:%d", i, g.File, g.Line, w.FileName, w.Line))
		}
		// llvm 19 loses DW_AT_decl_file when its form is
		// DW_FORM_implicit_const (GCC's DWARF 5 default for it): the
		// value it builds for an implicit constant has no unit, and
		// DWARFFormValue::getAsFile needs one to find the line table. We
		// report the file; accept llvm's empty name there. The outermost
		// frame's StartAddress is llvm's symbol-table address, which the
		// symbol-table layer supplies, not DWARF.
		fileOK := g.StartFile == w.StartFileName || w.StartFileName == ""
		addrOK := i == len(got)-1 || w.StartAddress == "" || w.StartAddress == "0x"+strconv.FormatUint(g.StartAddress, 16)
		if !fileOK || !addrOK || g.StartLine != w.StartLine {
			startOK = false
			if os.Getenv("DWARFSYM_DEBUG") != "" {
				fmt.Printf("start %#x frame %d: %s:%d %#x want %s:%d %s\n", addr, i, g.StartFile, g.StartLine, g.StartAddress, w.StartFileName, w.StartLine, w.StartAddress)
			}
		}
	}
	if chainOK {
		sc.chain++
	}
	if chainOK && startOK {
		sc.start++
	}
	if len(why) > 0 && len(sc.bad) < 12 {
		sc.bad = append(sc.bad, fmt.Sprintf("%#x: %s", addr, strings.Join(why, "; ")))
	}
}

func pct(a, n int) float64 { return 100 * float64(a) / float64(max(n, 1)) }

func checkAccuracy(t *testing.T, fx fixture, maxAddrs int) {
	_, tab := openTable(t, fx.path)
	addrs := pickAddrs(t, fx.path, tab, maxAddrs)
	want := runLLVM(t, fx.path, addrs)
	var sc score
	var frames []frame.Frame
	for i, a := range addrs {
		var err error
		frames, _, err = tab.Lookup(a, true, frames[:0])
		if err != nil {
			t.Errorf("Lookup(%#x): %v", a, err)
			continue
		}
		compare(a, want[i], frames, &sc)
	}
	t.Logf("%-26s parsed=%dKiB addrs=%d resolved=%d extra=%d chain=%.2f%% inner=%.2f%% col+disc=%.2f%% start=%.2f%% outername=%.2f%%",
		fx.name, tab.SizeBytes()>>10, len(addrs), sc.n, sc.extra, pct(sc.chain, sc.n), pct(sc.inner, sc.n), pct(sc.col, sc.n), pct(sc.start, sc.n), pct(sc.outerName, sc.n))
	for _, b := range sc.bad {
		t.Log("  mismatch ", b)
	}
	if sc.n < len(addrs)/2 {
		t.Errorf("llvm resolved only %d of %d addresses: fixture lacks DWARF?", sc.n, len(addrs))
	}
	if pct(sc.chain, sc.n) < 98 || pct(sc.inner, sc.n) < 98 {
		t.Errorf("%s: accuracy below 98%%", fx.name)
	}
}

func TestAccuracy(t *testing.T) {
	testfixture.NeedTool(t, llvmSymbolizer)
	for _, fx := range fixtures(t) {
		t.Run(fx.name, func(t *testing.T) { checkAccuracy(t, fx, 4000) })
	}
}

func TestAccuracyLibc(t *testing.T) {
	testfixture.NeedTool(t, llvmSymbolizer)
	n := 10000
	if testing.Short() {
		n = 2000
	}
	checkAccuracy(t, fixture{"libc.debug", libcDebug(t)}, n)
}

// TestAccuracyObj checks any object named by PROFSYM_ACCURACY_OBJ, such
// as Go's own compile binary.
func TestAccuracyObj(t *testing.T) {
	obj := os.Getenv("PROFSYM_ACCURACY_OBJ")
	if obj == "" {
		t.Skip("set PROFSYM_ACCURACY_OBJ to check another object")
	}
	checkAccuracy(t, fixture{filepath.Base(obj), obj}, 10000)
}

// TestNoInlines checks the inlines=false answer against the full chain:
// the outermost function, located by the line table.
func TestNoInlines(t *testing.T) {
	fx := cFixture(t, "c-O3-gdwarf-5", "-O3", "-gdwarf-5")
	_, tab := openTable(t, fx.path)
	var full, one []frame.Frame
	for _, a := range pickAddrs(t, fx.path, tab, 2000) {
		full, _, _ = tab.Lookup(a, true, full[:0])
		one, _, _ = tab.Lookup(a, false, one[:0])
		if len(full) == 0 {
			if len(one) != 0 {
				t.Fatalf("%#x: %d frames without inlines, none with", a, len(one))
			}
			continue
		}
		outer, inner := full[len(full)-1], full[0]
		if len(one) != 1 || one[0].Name != outer.Name || one[0].File != inner.File || one[0].Line != inner.Line || one[0].StartAddress != outer.StartAddress {
			t.Fatalf("%#x: no-inlines %+v, want name of %+v at %s:%d", a, one, outer, inner.File, inner.Line)
		}
	}
}

// TestCorruptUnit garbles the DIEs of every unit after its unit DIE: the
// index still builds from .debug_aranges, and lookups must fail with
// ErrCorruptFile rather than panic or answer nonsense.
func TestCorruptUnit(t *testing.T) {
	fx := cFixture(t, "c-O2-gdwarf-4", "-O2", "-gdwarf-4")
	s := loadSections(t, fx.path)
	units, err := scanUnits(s.info, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		for i := u.dieOff + 40; i < u.end; i++ {
			s.info[i] = 0xff
		}
	}
	tab, err := newTable(s, Extra{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for _, r := range tab.index {
		_, _, err := tab.Lookup(r.lo, true, nil)
		if err != nil && !errors.Is(err, frame.ErrCorruptFile) {
			t.Fatalf("Lookup(%#x): %v, want ErrCorruptFile", r.lo, err)
		}
		if err != nil {
			bad++
		}
	}
	if bad == 0 {
		t.Fatal("no lookup noticed the corruption")
	}
}

func TestNoDebugInfo(t *testing.T) {
	bin := cFixture(t, "c-O2-nodebug", "-O2", "-g0").path
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := New(f); !errors.Is(err, frame.ErrNoDebugInfo) {
		t.Fatalf("New on a file without DWARF: %v, want ErrNoDebugInfo", err)
	}
}

func TestOutsideAnyUnit(t *testing.T) {
	fx := cFixture(t, "c-O2-gdwarf-4", "-O2", "-gdwarf-4")
	_, tab := openTable(t, fx.path)
	dst := []frame.Frame{{Name: "keep"}}
	got, _, err := tab.Lookup(1, true, dst)
	if err != nil || len(got) != 1 || got[0].Name != "keep" {
		t.Fatalf("Lookup(1) = %v, %v; want dst unchanged", got, err)
	}
}

// TestConcurrent looks addresses up from many goroutines on a fresh table,
// so units are parsed under contention (run with -race to check).
func TestConcurrent(t *testing.T) {
	fx := cFixture(t, "c-O2-gdwarf-5", "-O2", "-gdwarf-5")
	_, ref := openTable(t, fx.path)
	addrs := pickAddrs(t, fx.path, ref, 2000)
	want := make([][]frame.Frame, len(addrs))
	for i, a := range addrs {
		want[i], _, _ = ref.Lookup(a, true, nil)
	}
	_, tab := openTable(t, fx.path)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var fr []frame.Frame
			for k := range addrs {
				i := (k*7 + g*131) % len(addrs)
				fr, _, _ = tab.Lookup(addrs[i], true, fr[:0])
				if !slices.Equal(fr, want[i]) {
					t.Errorf("%#x: concurrent %v want %v", addrs[i], fr, want[i])
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if tab.SizeBytes() <= 0 {
		t.Error("SizeBytes after parsing is not positive")
	}
}

// TestFramesOutliveFile: frames copy their strings, so they stay valid
// after the file's mapping is gone.
func TestFramesOutliveFile(t *testing.T) {
	fx := cFixture(t, "c-O2-gdwarf-5", "-O2", "-gdwarf-5")
	f, err := elfx.Open(fx.path)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	addrs := pickAddrs(t, fx.path, tab, 200)
	var all []frame.Frame
	for _, a := range addrs {
		all, _, _ = tab.Lookup(a, true, all)
	}
	f.Close()
	n := 0
	for _, fr := range all {
		n += len(fr.Name) + len(fr.File) + len(fr.StartFile)
		_ = strings.Count(fr.Name+fr.File+fr.StartFile, "/")
	}
	if n == 0 {
		t.Fatal("no names")
	}
}

func BenchmarkLookupWarm(b *testing.B) {
	path := os.Getenv("PROFSYM_BENCH_OBJ")
	if path == "" {
		path = cFixture(b, "c-O3-gdwarf-5", "-O3", "-gdwarf-5").path
	}
	_, tab := openTable(b, path)
	addrs := pickAddrs(b, path, tab, 10000)
	var fr []frame.Frame
	for _, a := range addrs {
		fr, _, _ = tab.Lookup(a, true, fr[:0])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fr, _, _ = tab.Lookup(addrs[i%len(addrs)], true, fr[:0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/addr")
}

// coldAddrs spreads n addresses evenly over the code the table indexes.
func coldAddrs(tab *Table, n int) []uint64 {
	var total uint64
	for _, r := range tab.index {
		total += r.hi - r.lo
	}
	out := make([]uint64, 0, n)
	step := total / uint64(n)
	var acc uint64
	for _, r := range tab.index {
		for a := r.lo + (step-acc%step)%step; a < r.hi && len(out) < n; a += max(step, 1) {
			out = append(out, a)
		}
		acc += r.hi - r.lo
	}
	return out
}

// TestColdVsLLVM compares the wall time of a whole process symbolizing
// 10,000 addresses spread over a big object, cold, against
// llvm-symbolizer-19. It is a measurement, not a unit test: it runs only
// with PROFSYM_COLD_OBJ set (to the object's path) and reports through
// t.Log, failing only if profsym is more than 1.5x slower, since the
// machine is shared and timings are noisy.
func TestColdVsLLVM(t *testing.T) {
	obj := os.Getenv("PROFSYM_COLD_OBJ")
	if obj == "" {
		t.Skip("set PROFSYM_COLD_OBJ to an object with DWARF to measure")
	}
	_, tab := openTable(t, obj)
	addrs := coldAddrs(tab, 10000)
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "0x%x\n", a)
	}
	addrFile := filepath.Join(t.TempDir(), "addrs")
	if err := os.WriteFile(addrFile, in.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, cmd *exec.Cmd) time.Duration {
		best := time.Duration(1 << 62)
		for i := 0; i < 3; i++ {
			c := exec.Command(cmd.Path, cmd.Args[1:]...)
			c.Env = cmd.Env
			c.Stdin = bytes.NewReader(in.Bytes())
			start := time.Now()
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, out)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	llvm := run("llvm", exec.Command(testfixture.NeedTool(t, llvmSymbolizer), "--output-style=JSON", "--inlines", "--obj="+obj))
	self := exec.Command(os.Args[0], "-test.run=^TestColdHelper$")
	self.Env = append(os.Environ(), "PROFSYM_COLD_HELPER="+obj, "PROFSYM_COLD_ADDRS="+addrFile)
	ours := run("profsym", self)
	t.Logf("%s: %d addresses cold: profsym %v, llvm-symbolizer-19 %v (ratio %.2f)", obj, len(addrs), ours, llvm, float64(ours)/float64(llvm))
	if ours > llvm*3/2 {
		t.Errorf("cold lookups slower than llvm-symbolizer-19")
	}
}

// TestColdHelper is the child process of TestColdVsLLVM: open, index and
// look up every address once, writing the frames out as llvm would.
func TestColdHelper(t *testing.T) {
	obj := os.Getenv("PROFSYM_COLD_HELPER")
	if obj == "" {
		t.Skip("helper process only")
	}
	b, err := os.ReadFile(os.Getenv("PROFSYM_COLD_ADDRS"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := elfx.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	var fr []frame.Frame
	for _, line := range strings.Fields(string(b)) {
		a, _ := strconv.ParseUint(strings.TrimPrefix(line, "0x"), 16, 64)
		fr, _, _ = tab.Lookup(a, true, fr[:0])
		for _, x := range fr {
			fmt.Fprintf(w, "%s %s:%d:%d\n", x.Name, x.File, x.Line, x.Column)
		}
	}
	w.Flush()
}

// BenchmarkOpen measures elfx.Open plus New: section decompression, unit
// headers and the unit index.
func BenchmarkOpen(b *testing.B) {
	path := os.Getenv("PROFSYM_BENCH_OBJ")
	if path == "" {
		path = cFixture(b, "c-O3-gdwarf-5", "-O3", "-gdwarf-5").path
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		f, err := elfx.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := New(f); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
