package table_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

// The peer is llvm-dwarfdump-19, which decodes CFI into a table of rules
// per address (its --eh-frame / --debug-frame output). Each of its rows is
// mapped to the Row the unwinder needs by the rules of docs/unwinding.md,
// and every address of every FDE is looked up in our table.

type peerFDE struct {
	start, end uint64
	signal     bool      // CIE augmentation has 'S'
	rows       []peerRow // ascending
}

type peerRow struct {
	pc  uint64
	row table.Row
	raw string
}

var (
	reCIE   = regexp.MustCompile(`^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE`)
	reAug   = regexp.MustCompile(`^\s+Augmentation:\s+"([^"]*)"`)
	reFDE   = regexp.MustCompile(`^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.\.([0-9a-f]+)`)
	rePeerR = regexp.MustCompile(`^\s+0x([0-9a-f]+): CFA=(.*)$`)
)

// peerFDEs runs llvm-dwarfdump-19 with flag (--eh-frame or --debug-frame)
// on bin and returns its FDEs.
func peerFDEs(t testing.TB, bin, flag string) []peerFDE {
	t.Helper()
	tool := testfixture.NeedTool(t, "llvm-dwarfdump-19")
	out, err := exec.Command(tool, flag, bin).Output()
	if err != nil {
		t.Fatalf("%s %s %s: %v", tool, flag, bin, err)
	}
	augs := map[string]string{}
	var fdes []peerFDE
	var cur *peerFDE
	var curCIE string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if m := reCIE.FindStringSubmatch(line); m != nil {
			curCIE, cur = m[1], nil
			augs[curCIE] = ""
			continue
		}
		if m := reAug.FindStringSubmatch(line); m != nil && curCIE != "" {
			augs[curCIE] = m[1]
			continue
		}
		if m := reFDE.FindStringSubmatch(line); m != nil {
			curCIE = ""
			s, _ := strconv.ParseUint(m[3], 16, 64)
			e, _ := strconv.ParseUint(m[4], 16, 64)
			fdes = append(fdes, peerFDE{start: s, end: e, signal: strings.Contains(augs[m[2]], "S")})
			cur = &fdes[len(fdes)-1]
			continue
		}
		if m := rePeerR.FindStringSubmatch(line); m != nil && cur != nil {
			pc, _ := strconv.ParseUint(m[1], 16, 64)
			rule := peerRule
			if strings.HasPrefix(m[2], "W") { // arm64: WSP, W29
				rule = peerRuleARM64
			}
			cur.rows = append(cur.rows, peerRow{pc: pc, row: rule(m[2]), raw: m[2]})
		}
	}
	// The CIE augmentation line follows the CIE header; FDEs referencing a
	// CIE printed later (debug_frame) are fixed up here.
	sort.Slice(fdes, func(i, j int) bool { return fdes[i].start < fdes[j].start })
	return fdes
}

// splitTop splits s at ", " outside brackets.
func splitTop(s string) []string {
	var parts []string
	depth, last := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 && i+1 < len(s) && s[i+1] == ' ' {
				parts = append(parts, s[last:i])
				last = i + 2
			}
		}
	}
	return append(parts, s[last:])
}

const pltExpr = "DW_OP_breg7 RSP+8, DW_OP_breg16 RIP+0, DW_OP_lit15, DW_OP_and, DW_OP_lit11, DW_OP_ge, DW_OP_lit3, DW_OP_shl, DW_OP_plus"

var (
	reRegOff = regexp.MustCompile(`^(R[A-Z0-9]+)([+-]\d+)?$`)
	reAtCFA  = regexp.MustCompile(`^\[CFA([+-]\d+)?\]$`)
	reDeref  = regexp.MustCompile(`^DW_OP_breg\d+ (RSP|RBP)([+-]\d+), DW_OP_deref, DW_OP_plus_uconst 0x([0-9a-f]+)$`)
)

// peerRule maps one dwarfdump row ("RSP+16: RBX=[CFA-16], RIP=[CFA-8]") to
// the row the unwinder needs.
func peerRule(s string) table.Row {
	cfa, rest, _ := strings.Cut(s, ": ")
	if strings.HasPrefix(s, pltExpr) {
		cfa, rest = pltExpr, strings.TrimPrefix(strings.TrimPrefix(s, pltExpr), ": ")
	}
	rules := map[string]string{}
	if rest != "" {
		for _, p := range splitTop(rest) {
			k, v, _ := strings.Cut(p, "=")
			rules[k] = v
		}
	}
	fb := table.Row{Kind: table.KindFallback}
	rip, ok := rules["RIP"]
	if ok && rip == "undefined" {
		return table.Row{Kind: table.KindEnd}
	}
	m := reAtCFA.FindStringSubmatch(rip)
	if !ok || m == nil {
		return fb
	}
	r := table.Row{Kind: table.KindNormal, RAOffset: int32(atoi(m[1]))}
	if cfa == pltExpr {
		r.CFA = table.CFAPLT
	} else if m := reDeref.FindStringSubmatch(cfa); m != nil {
		add, _ := strconv.ParseInt(m[3], 16, 32)
		r.CFA, r.CFAOffset, r.CFAAdd = table.CFASPDeref, int32(atoi(m[2])), int32(add)
		if m[1] == "RBP" {
			r.CFA = table.CFAFPDeref
		}
	} else if m := reRegOff.FindStringSubmatch(cfa); m != nil {
		r.CFAOffset = int32(atoi(m[2]))
		n, known := x86DWARF[m[1]]
		switch {
		case m[1] == "RSP":
			r.CFA = table.CFASP
		case m[1] == "RBP":
			r.CFA = table.CFAFP
		case known && table.X86CFARegister(n):
			r.CFA, r.CFARegister = table.CFAReg, uint8(n)
		default:
			return fb
		}
	} else {
		return fb
	}
	if rbp, ok := rules["RBP"]; ok && rbp != "same" && rbp != "undefined" {
		m := reAtCFA.FindStringSubmatch(rbp)
		if m == nil {
			return fb
		}
		r.FPSaved, r.FPOffset = true, int32(atoi(m[1]))
	}
	return r
}

// x86DWARF numbers llvm-dwarfdump's register names.
var x86DWARF = map[string]uint64{"RAX": 0, "RDX": 1, "RCX": 2, "RBX": 3, "RSI": 4, "RDI": 5, "RBP": 6, "RSP": 7,
	"R8": 8, "R9": 9, "R10": 10, "R11": 11, "R12": 12, "R13": 13, "R14": 14, "R15": 15}

func atoi(s string) int64 {
	if s == "" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(err)
	}
	return v
}

// agreement is the result of comparing a table with the peer.
type agreement struct {
	addrs, agree int
	sigByCode    int // addresses we mark as signal frames by their code
	bad          []string
}

func (a *agreement) String() string {
	return fmt.Sprintf("%d/%d addresses agree (%.4f%%), %d signal by code", a.agree, a.addrs, 100*float64(a.agree)/float64(max(a.addrs, 1)), a.sigByCode)
}

// compareFDEs looks up every address of every FDE.
func compareFDEs(t testing.TB, tab *table.Table, fdes []peerFDE, code func(uint64, int) []byte) *agreement {
	a := &agreement{}
	for i, f := range fdes {
		if f.end <= f.start || len(f.rows) == 0 || f.start == 0 {
			continue
		}
		if i+1 < len(fdes) && fdes[i+1].start < f.end {
			continue // overlapping FDEs: either may win
		}
		sigCode := false
		if n := f.end - f.start; !f.signal && n <= 16 {
			c := code(f.start, int(n))
			sigCode = bytes.Contains(c, []byte{0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05})
		}
		k := sort.Search(len(tab.Rows), func(k int) bool { return tab.Rows[k].PC > f.start }) - 1
		for j, pr := range f.rows {
			end := f.end
			if j+1 < len(f.rows) {
				end = min(f.rows[j+1].pc, f.end)
			}
			want := pr.row
			if f.signal || sigCode {
				want = table.Row{Kind: table.KindSignal}
			}
			for pc := max(pr.pc, f.start); pc < end; pc++ {
				for k+1 < len(tab.Rows) && tab.Rows[k+1].PC <= pc {
					k++
				}
				a.addrs++
				var got table.Row
				if k >= 0 {
					got = tab.Rows[k]
				}
				got.PC = 0
				if got == want {
					a.agree++
					if sigCode {
						a.sigByCode++
					}
					continue
				}
				if len(a.bad) < 20 {
					a.bad = append(a.bad, fmt.Sprintf("%#x: got %+v, peer %q -> %+v", pc, got, pr.raw, want))
				}
			}
		}
	}
	return a
}

// checkGaps checks that code no FDE covers falls back to frame pointers,
// unless it is alignment padding before the next function (absorbed by
// the previous row), the entry point (KindEnd) or a signal trampoline.
func checkGaps(t testing.TB, tab *table.Table, fdes []peerFDE, f *elf.File) {
	t.Helper()
	var text [][2]uint64
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			text = append(text, [2]uint64{p.Vaddr, p.Vaddr + p.Memsz})
		}
	}
	bad := 0
	check := func(a, e uint64) {
		k := sort.Search(len(tab.Rows), func(k int) bool { return tab.Rows[k].PC > a }) - 1
		for ; k < len(tab.Rows) && (k < 0 || tab.Rows[k].PC < e); k++ {
			if k < 0 {
				continue
			}
			// The part of the gap this row covers.
			lo, hi := max(tab.Rows[k].PC, a), e
			if k+1 < len(tab.Rows) {
				hi = min(hi, tab.Rows[k+1].PC)
			}
			if hi-lo < 16 && hi%16 == 0 {
				continue // alignment padding absorbed by the previous row
			}
			if kd := tab.Rows[k].Kind; kd == table.KindNormal {
				if bad < 10 {
					t.Errorf("gap [%#x,%#x): row %+v", a, e, tab.Rows[k])
				}
				bad++
			}
		}
	}
	for _, tx := range text {
		a := tx[0]
		for _, fd := range fdes {
			if fd.end <= tx[0] || fd.start >= tx[1] || fd.start == 0 {
				continue
			}
			if fd.start > a {
				check(a, fd.start)
			}
			a = max(a, fd.end)
		}
		if a < tx[1] {
			check(a, tx[1])
		}
	}
}

// checkShape checks the invariants every table keeps.
func checkShape(t testing.TB, tab *table.Table) {
	t.Helper()
	if len(tab.Rows) == 0 {
		t.Fatal("no rows")
	}
	for i := 1; i < len(tab.Rows); i++ {
		p, r := tab.Rows[i-1], tab.Rows[i]
		if r.PC <= p.PC {
			t.Fatalf("row %d: pc %#x after %#x", i, r.PC, p.PC)
		}
		p.PC, r.PC = 0, 0
		if p == r {
			t.Fatalf("row %d at %#x repeats the row before", i, tab.Rows[i].PC)
		}
	}
	for i, r := range tab.Rows {
		if r.Kind != table.KindNormal && (r.CFA != 0 || r.CFAOffset != 0 || r.FPSaved || r.FPOffset != 0 || r.RAOffset != 0) {
			t.Fatalf("row %d: %+v carries rules", i, r)
		}
		if r.Kind == table.KindNormal && (r.CFA == table.CFAUndefined || r.RAOffset == 0 && tab.Arch != elf.EM_AARCH64) {
			t.Fatalf("row %d: %+v has no rule", i, r)
		}
	}
	if last := tab.Rows[len(tab.Rows)-1]; last.Kind != table.KindFallback {
		t.Fatalf("last row %+v is not a fallback", last)
	}
}
