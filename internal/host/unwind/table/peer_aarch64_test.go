package table_test

import (
	"debug/elf"
	"regexp"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

// arm64 rows as llvm-dwarfdump-19 prints them: "WSP+32: W29=[CFA-32],
// W30=[CFA-24], reg34=1" (reg34 is the RA sign state that
// DW_CFA_AARCH64_negate_ra_state toggles: the walker strips a PAC from
// every return address, signed or not).
var reARM64Reg = regexp.MustCompile(`^(WSP|W29)([+-]\d+)?$`)

func peerRuleARM64(s string) table.Row {
	cfa, rest, _ := strings.Cut(s, ": ")
	rules := map[string]string{}
	if rest != "" {
		for _, p := range splitTop(rest) {
			k, v, _ := strings.Cut(p, "=")
			rules[k] = v
		}
	}
	fb := table.Row{Kind: table.KindFallback}
	ra, ok := rules["W30"]
	if ok && ra == "undefined" {
		return table.Row{Kind: table.KindEnd}
	}
	r := table.Row{Kind: table.KindNormal}
	if ok && ra != "same" {
		m := reAtCFA.FindStringSubmatch(ra)
		if m == nil {
			return fb
		}
		r.RAOffset = int32(atoi(m[1]))
	}
	m := reARM64Reg.FindStringSubmatch(cfa)
	if m == nil {
		return fb
	}
	r.CFA, r.CFAOffset = table.CFASP, int32(atoi(m[2]))
	if m[1] == "W29" {
		r.CFA = table.CFAFP
	}
	if fp, ok := rules["W29"]; ok && fp != "same" && fp != "undefined" {
		m := reAtCFA.FindStringSubmatch(fp)
		if m == nil {
			return fb
		}
		r.FPSaved, r.FPOffset = true, int32(atoi(m[1]))
	}
	return r
}

// TestEHFrameAgainstLLVMARM64: arm64's C library and C built with the
// cross compiler, with and without frame pointers and with return
// addresses signed (-mbranch-protection=standard), every address compared
// with llvm-dwarfdump-19.
func TestEHFrameAgainstLLVMARM64(t *testing.T) {
	files := map[string]string{
		"libc":  "/usr/aarch64-linux-gnu/lib/libc.so.6",
		"ld.so": "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1",
	}
	for name, args := range map[string][]string{
		"gcc-O2-nofp-pac": {"-O2", "-fomit-frame-pointer", "-mbranch-protection=standard"},
		"gcc-O2-fp":       {"-O2", "-fno-omit-frame-pointer"},
	} {
		files[name] = testfixture.Build(t, testfixture.Spec{Name: "unwindtable-arm64-" + name, Lang: "c",
			Compiler: "aarch64-linux-gnu-gcc", Sources: []string{"unwind/chain.c"}, Args: args})
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			needFile(t, path)
			tab, f := build(t, path)
			if tab.Arch != elf.EM_AARCH64 {
				t.Fatalf("arch %v", tab.Arch)
			}
			checkShape(t, tab)
			fdes := peerFDEs(t, path, "--eh-frame")
			a := compareFDEs(t, tab, fdes, codeOf(f))
			t.Logf("%s: %d FDEs, %d rows: %s; stats %+v", name, len(fdes), len(tab.Rows), a, tab.Stats)
			for _, b := range a.bad {
				t.Error(b)
			}
			if a.addrs == 0 {
				t.Fatal("no addresses compared")
			}
			if tab.Stats.BadFDEs != 0 || tab.Stats.FirstError != "" {
				t.Errorf("malformed entries in a real file: %+v", tab.Stats)
			}
		})
	}
}
