package symbolize

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/testfixture"
)

// sampleAddresses picks every function start, every function's second
// instruction region and a dense stride through .text, so inlined ranges
// are well covered. n bounds the stride sample.
func sampleAddresses(t *testing.T, path string, n int) []uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	if text == nil {
		t.Fatalf("%s: no .text", path)
	}
	set := map[uint64]bool{}
	syms, _ := f.Symbols()
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value >= text.Addr && s.Value < text.Addr+text.Size {
			set[s.Value] = true
			if s.Size > 8 {
				set[s.Value+s.Size/2] = true
			}
		}
	}
	stride := text.Size / uint64(n)
	if stride == 0 {
		stride = 1
	}
	// An odd stride avoids sampling only instruction-aligned boundaries.
	stride |= 1
	for a := text.Addr; a < text.Addr+text.Size; a += stride {
		set[a] = true
	}
	out := make([]uint64, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

type agreement struct {
	resolved, outer, chain, line int
	// setAside counts addresses llvm names from what the file profsym
	// reads does not hold; viaDebug those checked against llvm on the
	// debug file (see compareNorm).
	setAside, viaDebug, viaPeer int
	samples                     []string
}

func (a *agreement) pct(n int) float64 { return 100 * float64(n) / float64(max(a.resolved, 1)) }

// compare symbolizes addrs in ours (via the resolver) and in ref (via llvm)
// and counts agreement over the addresses llvm resolves.
func compare(t *testing.T, r *Resolver, ours target, ref string, addrs []uint64, llvmArgs ...string) *agreement {
	return compareRules(t, r, ours, ref, addrs, rules{}, llvmArgs...)
}

// rules are the mechanical rules of a comparison whose two sides read
// different records of the same code (docs/symbolization.md).
type rules struct {
	// norm, if set, passes both sides' names and files through first.
	norm func(name, file string) (string, string)
	// peer, if set, answers file:line ("FILE:LINE") for addresses where
	// profsym's innermost line differs from llvm's: profsym's must be the
	// peer's (Go's own pclntab reader, for a stripped Go binary).
	peer func(addrs []uint64) []string
}

// compareRules is compare under rl.
func compareRules(t *testing.T, r *Resolver, ours target, ref string, addrs []uint64, rl rules, llvmArgs ...string) *agreement {
	norm := rl.norm
	t.Helper()
	want := testfixture.LLVMSymbolize(t, ref, addrs, append([]string{"--inlines"}, llvmArgs...)...)
	if norm != nil {
		for i := range want {
			for j := range want[i] {
				s := &want[i][j]
				s.FunctionName, s.FileName = norm(s.FunctionName, s.FileName)
			}
		}
	}
	bin, debug := ours.files(t)
	got := r.Symbolize(context.Background(), bin, debug, addrs)
	// The corpus runs both ways: a symbol index of the same files must
	// answer every address exactly as they do.
	indexAgrees(t, r, bin, debug, addrs, got)
	if norm != nil {
		for i := range got {
			for j := range got[i].Frames {
				f := &got[i].Frames[j]
				f.Function, f.File = norm(f.Function, f.File)
			}
		}
	}
	// llvm-symbolizer 19's demangler gives up on some names GNU c++filt
	// demangles (e.g. std::swap<int>'s "sr" enable_if expression); there
	// llvm prints the mangled name and profsym the demangled one. Such a
	// frame agrees when c++filt's spelling, with GNU's "> >" closed up,
	// equals profsym's: c++filt is the evidence that profsym is right.
	for i := range want {
		if !r.Options().Demangle {
			break // names are compared mangled
		}
		for j := range want[i] {
			ws := &want[i][j]
			if strings.HasPrefix(ws.FunctionName, "_Z") {
				ws.FunctionName = gnuDemangle(t, ws.FunctionName)
			}
		}
	}
	a := &agreement{}
	var onDebug []int   // llvm's ?? that profsym names: checked against llvm on the debug file
	var peerCheck []int // lines that differ from llvm's: checked against rl.peer
	for i, w := range want {
		if len(w) == 0 || w[len(w)-1].FunctionName == "" || w[len(w)-1].FunctionName == "??" {
			if debug != "" && len(got[i].Frames) > 0 {
				onDebug = append(onDebug, i)
			}
			continue
		}
		g := got[i].Frames
		// ours is a stripped copy of ref: a name llvm reads from ref's
		// .symtab alone (no line) where the copy keeps nothing (a Go
		// linker marker such as runtime.etext) is not in the copy at all.
		if ours.path != "" && ours.path != ref && len(w) == 1 && w[0].Line == 0 && len(g) == 0 && IsUnresolved(got[i].Err) {
			a.setAside++
			continue
		}
		a.resolved++
		var gOuter, wOuter string
		if len(g) > 0 {
			gOuter = g[len(g)-1].Function
		}
		wOuter = w[len(w)-1].FunctionName
		if gOuter == wOuter {
			a.outer++
		}
		same := len(g) == len(w)
		for j := 0; same && j < len(g); j++ {
			same = g[j].Function == w[j].FunctionName
		}
		if same {
			a.chain++
		}
		// A file llvm has only from ref's symbol table (line 0, STT_FILE)
		// is not in a stripped copy either.
		if len(g) > 0 && (g[0].File == w[0].FileName && g[0].Line == w[0].Line ||
			norm != nil && w[0].Line == 0 && (w[0].FileName == "" || g[0].File == "")) {
			a.line++
		} else if len(g) > 0 && rl.peer != nil {
			peerCheck = append(peerCheck, i)
			continue
		}
		differs := !same || gOuter != wOuter || len(g) == 0 || g[0].Line != w[0].Line || g[0].File != w[0].FileName

		if differs && len(a.samples) < 8 {
			var gs, ws []string
			for _, f := range g {
				gs = append(gs, fmt.Sprintf("%s@%s:%d", f.Function, f.File, f.Line))
			}
			for _, f := range w {
				ws = append(ws, fmt.Sprintf("%s@%s:%d", f.FunctionName, f.FileName, f.Line))
			}
			a.samples = append(a.samples, fmt.Sprintf("%#x: profsym %v (err %v)\n\t\tllvm %v", addrs[i], gs, got[i].Err, ws))
		}
	}
	if len(peerCheck) > 0 {
		var as []uint64
		for _, i := range peerCheck {
			as = append(as, addrs[i])
		}
		for k, fl := range rl.peer(as) {
			i := peerCheck[k]
			g := got[i].Frames
			if fmt.Sprintf("%s:%d", g[0].File, g[0].Line) == fl {
				a.line++
				a.viaPeer++
			} else if len(a.samples) < 8 {
				a.samples = append(a.samples, fmt.Sprintf("%#x: profsym %s:%d, peer %s", addrs[i], g[0].File, g[0].Line, fl))
			}
		}
	}
	// Where llvm, through the stripped binary, names nothing and profsym
	// names the address from the debug file's .symtab, the whole answer is
	// llvm's on the debug file itself (llvm reads only the binary's own
	// symbol table: its ?? is a limit, not the answer).
	if len(onDebug) > 0 {
		var as []uint64
		for _, i := range onDebug {
			as = append(as, addrs[i])
		}
		ref := testfixture.LLVMSymbolize(t, debug, as, append([]string{"--inlines"}, llvmArgs...)...)
		for k, i := range onDebug {
			a.resolved++
			a.viaDebug++
			g, w := got[i].Frames, ref[k]
			same := len(g) == len(w)
			for j := 0; same && j < len(g); j++ {
				same = g[j].Function == w[j].FunctionName && g[j].File == w[j].FileName && g[j].Line == w[j].Line
			}
			if same {
				a.outer++
				a.chain++
				a.line++
			} else if len(a.samples) < 8 {
				a.samples = append(a.samples, fmt.Sprintf("%#x: profsym %+v, llvm on the debug file %+v", addrs[i], g, w))
			}
		}
	}
	return a
}

var gnuNames = map[string]string{}

// gnuDemangle asks binutils' c++filt, spelled like llvm ("a<b<c>>").
func gnuDemangle(t *testing.T, name string) string {
	if d, ok := gnuNames[name]; ok {
		return d
	}
	out, err := exec.Command(testfixture.NeedTool(t, "c++filt"), name).Output()
	d := name
	if err == nil {
		d = strings.ReplaceAll(strings.TrimSpace(string(out)), "> >", ">>")
		d = strings.ReplaceAll(d, "> >", ">>")
	}
	gnuNames[name] = d
	return d
}

// check requires full agreement: every address llvm resolves (or that
// profsym names from a debug file's .symtab where llvm says ??) has the
// same outermost name, inline chain and innermost file:line, once the
// mechanical rules for llvm's faults are applied (docs/symbolization.md).
func (a *agreement) check(t *testing.T, name string) {
	t.Helper()
	t.Logf("%s: %d resolved (%d checked on the debug file, %d lines on a peer, %d set aside: not in the file read); outer name %.2f%%, inline chain %.2f%%, innermost file:line %.2f%%",
		name, a.resolved, a.viaDebug, a.viaPeer, a.setAside, a.pct(a.outer), a.pct(a.chain), a.pct(a.line))
	for _, s := range a.samples {
		t.Logf("  differs at %s", s)
	}
	if a.resolved < 100 {
		t.Errorf("%s: only %d addresses resolved by llvm-symbolizer; fixture too small", name, a.resolved)
	}
	if a.outer != a.resolved || a.chain != a.resolved || a.line != a.resolved {
		t.Errorf("%s: %d, %d and %d of %d addresses agree in outermost name, inline chain and innermost file:line; want all",
			name, a.outer, a.chain, a.line, a.resolved)
	}
}

var cSources = []string{"engine/c/main.c", "engine/c/hash.c", "engine/c/sort.c"}

func TestAccuracyC(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"O0-dwarf5", []string{"-O0", "-g"}},
		{"O2-dwarf4", []string{"-O2", "-gdwarf-4"}},
		{"O3-dwarf5", []string{"-O3", "-gdwarf-5"}},
		{"O2-gz-zlib", []string{"-O2", "-g", "-gz=zlib"}},
		{"O2-gz-zstd", []string{"-O2", "-g", "-gz=zstd"}},
		{"O2-no-pie", []string{"-O2", "-g", "-no-pie", "-fno-pie"}},
		{"O3-shared", []string{"-O3", "-g", "-shared", "-fPIC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srcs := cSources
			if strings.Contains(tc.name, "shared") {
				srcs = []string{"engine/c/lib.c", "engine/c/hash.c", "engine/c/sort.c"}
			}
			args := tc.args
			zstdAfter := false
			if strings.Contains(tc.name, "zstd") && !gccSupports(t, "-gz=zstd") {
				// gcc 12 cannot emit zstd sections itself; binutils 2.40 can
				// compress them afterwards.
				args, zstdAfter = []string{"-O2", "-g"}, true
			}
			bin := testfixture.Build(t, testfixture.Spec{Name: "c-" + tc.name, Lang: "c", Sources: srcs, Args: args})
			if zstdAfter {
				z := filepath.Join(t.TempDir(), "zstd")
				testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--compress-debug-sections=zstd", bin, z)
				bin = z
			}
			r := New(DefaultOptions())
			defer r.Close()
			compare(t, r, target{path: bin}, bin, sampleAddresses(t, bin, 4000)).check(t, tc.name)
		})
	}
}

func gccSupports(t *testing.T, flag string) bool {
	dir := t.TempDir()
	src := filepath.Join(dir, "x.c")
	os.WriteFile(src, []byte("int main(void){return 0;}\n"), 0o644)
	return exec.Command("gcc", "-g", flag, "-o", filepath.Join(dir, "x"), src).Run() == nil
}

// Stripped binaries find their DWARF in a separate file, by .gnu_debuglink
// and by build id under a debug directory.
func TestAccuracySeparateDebug(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "c-O2-split", Lang: "c", Sources: cSources, Args: []string{"-O2", "-g", "-Wl,--build-id"}})
	addrs := sampleAddresses(t, bin, 3000)

	t.Run("debuglink", func(t *testing.T) {
		stripped, _ := testfixture.SplitDebug(t, bin, true)
		r := New(Options{Inlines: true, Demangle: true, UseSymbolTable: true})
		defer r.Close()
		compare(t, r, target{path: stripped}, bin, addrs).check(t, "debuglink")
	})
	t.Run("build-id-dir", func(t *testing.T) {
		stripped, debug := testfixture.SplitDebug(t, bin, false)
		id := buildIDOf(t, stripped)
		dir := t.TempDir()
		p := filepath.Join(dir, ".build-id", id[:2], id[2:]+".debug")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Rename(debug, p); err != nil {
			t.Fatal(err)
		}
		r := New(Options{Inlines: true, Demangle: true, UseSymbolTable: true})
		defer r.Close()
		compare(t, r, target{path: stripped, dirs: []string{dir}}, bin, addrs).check(t, "build-id-dir")
		// By build id alone, the debug file is enough to symbolize.
		compare(t, r, target{buildID: id, dirs: []string{dir}}, bin, addrs).check(t, "by-build-id")
	})
}

func buildIDOf(t *testing.T, path string) string { return testfixture.BuildID(t, path) }

// target is the object under test, by path or by build id. Its files are
// found the way the CLI and the processor find them: through a locate chain
// of the file itself and the debug directories (default /usr/lib/debug).
type target struct {
	path, buildID string
	dirs          []string
}

func (o target) files(t testing.TB) (bin, debug string) {
	t.Helper()
	dirs := o.dirs
	if len(dirs) == 0 {
		dirs = []string{debugdirs.DefaultDebugDir}
	}
	c := locate.New(locate.Options{Sources: []locate.Source{locate.Local{}, locate.DebugDirs{Dirs: dirs}}})
	q := locate.Query{ID: frame.Identity{GNU: o.buildID}}
	if o.path != "" {
		f, err := elfx.Open(o.path)
		if err != nil {
			t.Fatal(err)
		}
		q.ID = buildid.Identify(f)
		q.AddHint(locate.Hint{File: o.path})
		f.Close()
	}
	res, err := c.Locate(context.Background(), q)
	if err != nil {
		t.Fatalf("locating %+v: %v", o, err)
	}
	return res.Paths()
}

func TestAccuracyCPP(t *testing.T) {
	for _, opt := range []string{"-O0", "-O2"} {
		t.Run(opt, func(t *testing.T) {
			bin := testfixture.Build(t, testfixture.Spec{Name: "cpp" + opt, Lang: "c++", Sources: []string{"engine/cpp/main.cc"}, Args: []string{opt, "-g", "-std=c++17"}})
			r := New(DefaultOptions())
			defer r.Close()
			compare(t, r, target{path: bin}, bin, sampleAddresses(t, bin, 4000)).check(t, "c++"+opt)
		})
	}
}

func TestAccuracyGo(t *testing.T) {
	full := testfixture.Build(t, testfixture.Spec{Name: "gofix", Lang: "go", Sources: []string{"engine/go"}})
	stripped := testfixture.Build(t, testfixture.Spec{Name: "gofix-stripped", Lang: "go", Sources: []string{"engine/go"}, Args: []string{"-ldflags=-s -w"}})
	addrs := sampleAddresses(t, full, 4000)
	r := New(DefaultOptions())
	defer r.Close()
	t.Run("dwarf", func(t *testing.T) {
		compare(t, r, target{path: full}, full, addrs).check(t, "go")
	})
	t.Run("stripped", func(t *testing.T) {
		// Same code, no DWARF and no .symtab: names, lines and inlined
		// frames come from .gopclntab alone.
		compareRules(t, r, target{path: stripped}, full, addrs, rules{norm: goNames, peer: goAddr2line(t, full)}).check(t, "go -s -w")
	})
}

// goAddr2line answers "FILE:LINE" for addresses of bin with `go tool
// addr2line`, Go's own reader of the pclntab: where the pclntab and the
// DWARF llvm reads disagree on a line (both the Go toolchain's records),
// a stripped binary's answer is the pclntab's.
func goAddr2line(t *testing.T, bin string) func([]uint64) []string {
	return func(addrs []uint64) []string {
		var in strings.Builder
		for _, a := range addrs {
			fmt.Fprintf(&in, "%#x\n", a)
		}
		cmd := exec.Command(testfixture.NeedTool(t, "go"), "tool", "addr2line", bin)
		cmd.Stdin = strings.NewReader(in.String())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go tool addr2line: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var res []string
		for i := 1; i < len(lines); i += 2 { // function, then file:line
			res = append(res, lines[i])
		}
		if len(res) != len(addrs) {
			t.Fatalf("go tool addr2line answered %d of %d addresses", len(res), len(addrs))
		}
		return res
	}
}

var goShape = regexp.MustCompile(`\[go\.shape\.[^\]]*\]|\[[^\]]*\]$`)

// goNames reconciles the few ways Go's pclntab and its DWARF (or symbol
// table) spell the same function: assembly functions are "F.abi0" in the
// symbol table and "F" in the pclntab; generic instances are "F[go.shape.int]"
// in DWARF and "F[...]" in the pclntab; llvm prints generated code's file as
// "./<autogenerated>" or leaves it empty (line 0) where the pclntab says
// "<autogenerated>:1" (counted as agreement: the pclntab knows more).
func goNames(name, file string) (string, string) {
	name = strings.TrimSuffix(name, ".abi0")
	name = goShape.ReplaceAllString(name, "[...]")
	return name, strings.TrimPrefix(file, "./")
}

// Rust is compared with demangling off on both sides: llvm-symbolizer 19
// demangles legacy Rust names with its Itanium demangler, which keeps the
// hash and the $LT$ escapes ("S$LT$T$GT$::show::h79de9c7de3d0d1b4") where
// rustfilt and profsym print "S<T>::show"; raw names compare exactly.
func TestAccuracyRust(t *testing.T) {
	for _, tc := range []struct{ name, mangling string }{{"legacy", "legacy"}, {"v0", "v0"}} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"-g", "-C", "opt-level=2"}
			if tc.mangling != "legacy" { // legacy is rustc's default and cannot be named without -Z
				args = append(args, "-C", "symbol-mangling-version="+tc.mangling)
			}
			bin := testfixture.Build(t, testfixture.Spec{Name: "rust-" + tc.name, Lang: "rust", Sources: []string{"engine/rust/main.rs"}, Args: args})
			opt := DefaultOptions()
			opt.Demangle = false
			r := New(opt)
			defer r.Close()
			compare(t, r, target{path: bin}, bin, sampleAddresses(t, bin, 4000), "--no-demangle").check(t, "rust "+tc.name)
		})
	}
}

// libc.so.6 is stripped; its DWARF is libc6-dbg's file under
// /usr/lib/debug/.build-id.
func TestAccuracyLibc(t *testing.T) {
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	id := buildIDOf(t, libc)
	if _, err := os.Stat(filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")); err != nil {
		testfixture.SkipOrFail(t, "libc6-dbg is not installed: %v", err)
	}
	f, err := elf.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	f.Close()
	var addrs []uint64
	step := text.Size / 5000
	for a := text.Addr; a < text.Addr+text.Size; a += step | 1 {
		addrs = append(addrs, a)
	}
	r := New(DefaultOptions())
	defer r.Close()
	compare(t, r, target{path: libc}, libc, addrs).check(t, "libc")
}
