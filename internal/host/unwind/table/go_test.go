package table_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/gopclntab"
	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

func goWalkBin(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{Name: "gowalk", Lang: "go", Sources: []string{"unwindtable/gowalk"}})
}

type goSnap struct {
	Chain   string
	PC, SP  uint64
	Stack   string
	Callers []string
}

// TestGoRuntimeWalk runs a Go program that copies its own stack at the
// bottom of several call chains, walks each copy with the table built from
// the program, and compares the functions with the runtime's own traceback
// (runtime.Callers) taken at the same point. It also checks the FPSaved
// rows: the BP each frame saved must be the frame pointer of its caller.
func TestGoRuntimeWalk(t *testing.T) {
	// Go 1.19 (Debian's golang-1.19-go) saves BP with the older prologue
	// (SUBQ; MOVQ BP, n-8(SP)); current Go with PUSHQ BP.
	t.Run("go-current", func(t *testing.T) { goRuntimeWalk(t, goWalkBin(t)) })
	t.Run("go1.19", func(t *testing.T) {
		goRuntimeWalk(t, goWalk119Bin(t))
	})
}

const go119 = "/usr/lib/go-1.19/bin/go"

// goWalk119Bin is the gowalk fixture built by Debian's Go 1.19.
func goWalk119Bin(t *testing.T) string {
	return testfixture.Build(t, testfixture.Spec{
		Name: "gowalk", Lang: "go", Compiler: go119,
		Sources: []string{"unwindtable/gowalk"}, Env: []string{"GOTOOLCHAIN=local"},
	})
}

func goRuntimeWalk(t *testing.T, bin string) {
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	tab, f := build(t, bin)
	checkShape(t, tab)
	if tab.Source != "gopclntab" {
		t.Fatalf("source %q", tab.Source)
	}
	sym, err := gopclntab.New(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	chains, frames, fpChecked := 0, 0, 0
	for sc.Scan() {
		var s goSnap
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		stack, err := hex.DecodeString(s.Stack)
		if err != nil {
			t.Fatal(err)
		}
		chains++
		names, n, ended := walkGo(t, tab, sym, s, stack, &fpChecked)
		frames += n
		if !ended {
			t.Errorf("%s: walk did not end on a KindEnd row: %v", s.Chain, names)
		}
		if strings.Join(names, " ") != strings.Join(s.Callers, " ") {
			t.Errorf("%s:\n walked  %v\n runtime %v", s.Chain, names, s.Callers)
		}
	}
	if chains < 5 {
		t.Fatalf("only %d chains", chains)
	}
	if fpChecked == 0 {
		t.Fatal("no saved frame pointer checked")
	}
	t.Logf("%d chains, %d physical frames walked, %d saved frame pointers checked; %d rows for %d Go functions", chains, frames, fpChecked, len(tab.Rows), tab.Stats.GoFuncs)
}

// walkGo unwinds a captured stack with the table. Every frame but the
// first is looked up at its return address - 1, as the sampler must.
func walkGo(t *testing.T, tab *table.Table, sym *gopclntab.Table, s goSnap, stack []byte, fpChecked *int) ([]string, int, bool) {
	read := func(addr uint64) (uint64, bool) {
		if addr < s.SP || addr-s.SP+8 > uint64(len(stack)) {
			return 0, false
		}
		return binary.LittleEndian.Uint64(stack[addr-s.SP:]), true
	}
	var names []string
	pc, sp := s.PC, s.SP
	// The caller's BP saved by the previous (inner) frame, to check against
	// this frame's own frame pointer (its CFA-16 when it saved one).
	var savedBP uint64
	haveBP := false
	for depth := 0; depth < 64; depth++ {
		row, ok := tab.Lookup(pc - 1)
		if !ok {
			t.Errorf("%s: no row at %#x", s.Chain, pc)
			return names, depth, false
		}
		fr, err := sym.Lookup(pc-1, true, nil)
		if err != nil || len(fr) == 0 {
			t.Errorf("%s: no function at %#x: %v", s.Chain, pc, err)
			return names, depth, false
		}
		for _, x := range fr {
			names = append(names, printName(x.Name))
		}
		switch row.Kind {
		case table.KindEnd:
			return names, depth + 1, true
		case table.KindNormal:
		default:
			t.Errorf("%s: %s at %#x: row %+v", s.Chain, fr[len(fr)-1].Name, pc, row)
			return names, depth, false
		}
		if row.CFA != table.CFASP {
			t.Errorf("%s: %s: CFA rule %v in Go code", s.Chain, fr[len(fr)-1].Name, row.CFA)
			return names, depth, false
		}
		cfa := sp + uint64(row.CFAOffset)
		if haveBP && row.FPSaved {
			// This frame's BP (CFA-16) is what the callee saved.
			if savedBP != cfa-16 {
				t.Errorf("%s: %s: callee saved BP %#x, frame pointer is %#x", s.Chain, fr[len(fr)-1].Name, savedBP, cfa-16)
			}
			*fpChecked++
		}
		haveBP = false
		if row.FPSaved {
			if savedBP, haveBP = read(cfa + uint64(int64(row.FPOffset))); !haveBP {
				t.Errorf("%s: saved BP outside the copy", s.Chain)
			}
		}
		ra, ok := read(cfa + uint64(int64(row.RAOffset)))
		if !ok {
			t.Errorf("%s: return address at %#x outside the copy", s.Chain, cfa-8)
			return names, depth, false
		}
		pc, sp = ra, cfa
	}
	return names, 64, false
}

// printName elides type arguments as the runtime's tracebacks do.
func printName(s string) string {
	i, j := strings.IndexByte(s, '['), strings.LastIndexByte(s, ']')
	if i < 0 || j < i {
		return s
	}
	return s[:i] + "[...]" + s[j+1:]
}

// TestGoAgainstDebugFrame compares the CFA of every address of every Go
// function with the Go linker's own .debug_frame (written from the same
// pcsp tables by other code), decoded by llvm-dwarfdump-19.
func TestGoAgainstDebugFrame(t *testing.T) {
	for name, bin := range map[string]string{
		"gowalk":        goWalkBin(t),
		"cgo":           cgoBin(t),
		"gowalk-go1.19": goWalk119Bin(t),
	} {
		t.Run(name, func(t *testing.T) {
			tab, f := build(t, bin)
			fdes := peerFDEs(t, bin, "--debug-frame")
			sym, err := gopclntab.New(f)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := sym.TextRange()
			addrs, agree, skipped := 0, 0, 0
			var bad []string
			for _, fd := range fdes {
				if fd.start < lo || fd.end > hi {
					continue // not Go code
				}
				for j, pr := range fd.rows {
					end := fd.end
					if j+1 < len(fd.rows) {
						end = fd.rows[j+1].pc
					}
					for pc := pr.pc; pc < end; pc++ {
						got, _ := tab.Lookup(pc)
						if got.Kind != table.KindNormal {
							skipped++ // top frames, SP-switching assembly
							continue
						}
						// Go's writer stops its last row one byte early.
						if pc == fd.end-1 {
							continue
						}
						addrs++
						if got.CFA == pr.row.CFA && got.CFAOffset == pr.row.CFAOffset && got.RAOffset == pr.row.RAOffset {
							agree++
						} else if len(bad) < 10 {
							bad = append(bad, pr.raw)
							t.Errorf("%#x: got %+v, .debug_frame %q", pc, got, pr.raw)
						}
					}
				}
			}
			if addrs == 0 {
				t.Fatal("no Go addresses compared")
			}
			t.Logf("%s: CFA of %d/%d Go addresses agree with .debug_frame (%d in non-normal rows skipped)", name, agree, addrs, skipped)
		})
	}
}

func cgoBin(t testing.TB) string {
	testfixture.NeedTool(t, "gcc")
	return testfixture.Build(t, testfixture.Spec{Name: "cgo", Lang: "go", Sources: []string{"unwindtable/cgo"}, Env: []string{"CGO_ENABLED=1"}})
}

// TestCgo checks a binary with both Go and C code: C functions get their
// .eh_frame rows, Go functions their pcsp rows.
func TestCgo(t *testing.T) {
	bin := cgoBin(t)
	tab, f := build(t, bin)
	checkShape(t, tab)
	if tab.Source != "eh_frame+gopclntab" {
		t.Fatalf("source %q", tab.Source)
	}
	sym, err := gopclntab.New(f)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := sym.TextRange()
	var native []peerFDE
	for _, fd := range peerFDEs(t, bin, "--eh-frame") {
		if fd.end <= lo || fd.start >= hi {
			native = append(native, fd)
		}
	}
	a := compareFDEs(t, tab, native, codeOf(f))
	for _, b := range a.bad {
		t.Error(b)
	}
	if a.addrs == 0 {
		t.Fatal("no C code compared")
	}
	start, _ := testfixture.Func(t, bin, "c_entry")
	if r, _ := tab.Lookup(start); r.Kind != table.KindNormal || r.CFA != table.CFASP || r.CFAOffset != 8 {
		t.Errorf("c_entry: %+v", r)
	}
	start, _ = testfixture.Func(t, bin, "main.goSide")
	var fr []frame.Frame
	if fr, _ = sym.Lookup(start, false, fr); len(fr) == 0 || fr[0].Name != "main.goSide" {
		t.Fatalf("main.goSide not in gopclntab")
	}
	t.Logf("cgo: %d rows, C code %s", len(tab.Rows), a)
}

// TestGoFileOpen keeps the Go build path honest on a binary without
// section headers' help: Go's compile tool, large and real.
func TestGoToolchainBinary(t *testing.T) {
	bin := goTool(t, "compile")
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := table.Build(f, table.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, tab)
	if tab.Stats.GoFuncs < 1000 || tab.Stats.BadFDEs != 0 {
		t.Fatalf("stats %+v", tab.Stats)
	}
	end := 0
	for _, r := range tab.Rows {
		if r.Kind == table.KindEnd {
			end++
		}
	}
	if end < 3 {
		t.Fatalf("%d end rows: goexit, mstart and rt0_go end stacks", end)
	}
}

func goTool(t testing.TB, name string) string {
	out, err := exec.Command(testfixture.NeedTool(t, "go"), "env", "GOTOOLDIR").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)) + "/" + name
}

// Go's traceback stops at mcall and morestack: their callee runs on g0
// with the goroutine's frame pointer still in BP (Go 1.19), and a walk past
// them put the scheduler under the goroutine's frames, without its pprof
// labels (TestCollectorGoLabels/go1.19 missed 3 of 295 in one CI run).
func TestGoStackSwitchesEnd(t *testing.T) {
	for name, bin := range map[string]string{
		"go-current": goWalkBin(t),
		"go1.19":     goWalk119Bin(t),
	} {
		t.Run(name, func(t *testing.T) {
			tab, f := build(t, bin)
			sym, err := gopclntab.New(f)
			if err != nil {
				t.Fatal(err)
			}
			found := map[string]bool{}
			sym.Funcs(func(fn *gopclntab.Func, n []byte) bool {
				switch string(n) {
				case "runtime.mcall", "runtime.morestack":
					found[string(n)] = true
					for pc := fn.Entry; pc < fn.End; pc++ {
						if r, ok := tab.Lookup(pc); !ok || r.Kind != table.KindEnd {
							t.Errorf("%s+%#x: row %+v (%v), want the end of the stack", n, pc-fn.Entry, r, ok)
							break
						}
					}
				}
				return true
			})
			if len(found) != 2 {
				t.Errorf("found %v of runtime.mcall and runtime.morestack", found)
			}
		})
	}
}
