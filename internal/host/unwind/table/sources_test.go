package table_test

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

// debugFrameBin builds the C fixture with CFI in .debug_frame only (the
// startup objects still bring a little .eh_frame).
func debugFrameBin(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{Name: "unwindtable-debugframe", Lang: "c", Sources: []string{cfiSrc},
		Args: []string{"-O2", "-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"}})
}

// TestDebugFrame covers .debug_frame as the only source (the .eh_frame
// sections removed) and as the filler of what .eh_frame leaves.
func TestDebugFrame(t *testing.T) {
	bin := debugFrameBin(t)
	only := filepath.Join(t.TempDir(), "only-debug-frame")
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", bin, only)
	for _, tc := range []struct {
		name, path, source string
	}{
		{"only", only, "debug_frame"},
		{"mixed", bin, "eh_frame+debug_frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab, f := build(t, tc.path)
			checkShape(t, tab)
			if tab.Source != tc.source {
				t.Fatalf("source %q, want %q", tab.Source, tc.source)
			}
			fdes := peerFDEs(t, tc.path, "--debug-frame")
			if tc.name == "mixed" {
				fdes = append(fdes, peerFDEs(t, tc.path, "--eh-frame")...)
				slices.SortFunc(fdes, func(a, b peerFDE) int { return cmp.Compare(a.start, b.start) })
			}
			a := compareFDEs(t, tab, fdes, codeOf(f))
			for _, b := range a.bad {
				t.Error(b)
			}
			if a.addrs < 1000 {
				t.Fatalf("only %d addresses compared", a.addrs)
			}
			t.Logf("%s: %s", tc.name, a)
			checkGaps(t, tab, fdes, f.File)
		})
	}
}

// stripSectionHeaders writes a copy of bin whose section header table is
// gone, as in core dumps and some packed binaries: .eh_frame must be found
// through PT_GNU_EH_FRAME and .eh_frame_hdr.
func stripSectionHeaders(t testing.TB, bin string) string {
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if b[elf.EI_CLASS] != byte(elf.ELFCLASS64) {
		t.Fatal("64-bit only")
	}
	le := binary.LittleEndian
	le.PutUint64(b[0x28:], 0) // e_shoff
	le.PutUint16(b[0x3c:], 0) // e_shnum
	le.PutUint16(b[0x3e:], 0) // e_shstrndx
	out := filepath.Join(t.TempDir(), filepath.Base(bin)+".noshdr")
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNoSectionHeaders(t *testing.T) {
	bins := map[string]string{"libc": libc, "ld.so": ldso}
	for name, p := range cFixtures(t) {
		if name == "gcc-O2-nofp" || name == "g++-O2" || name == "rust-O2" {
			bins[name] = p
		}
	}
	for name, bin := range bins {
		t.Run(name, func(t *testing.T) {
			needFile(t, bin)
			want, _ := build(t, bin)
			got, f := build(t, stripSectionHeaders(t, bin))
			if len(f.Sections) != 0 {
				t.Fatal("section headers still there")
			}
			if got.Source != "eh_frame" || !slices.Equal(got.Rows, want.Rows) {
				t.Fatalf("without section headers: %s, %d rows; with: %s, %d rows", got.Source, len(got.Rows), want.Source, len(want.Rows))
			}
		})
	}
}

// TestHandWrittenCFI checks the rows of the fixture's assembly, whose CFI
// was written to exercise each rule, against what the rule means.
func TestHandWrittenCFI(t *testing.T) {
	fx := cFixtures(t)
	for _, name := range []string{"gcc-O2-nofp", "clang19-O2"} {
		bin := fx[name]
		t.Run(name, func(t *testing.T) {
			tab, _ := build(t, bin)
			fn := func(sym string) uint64 {
				a, _ := testfixture.Func(t, bin, sym)
				return a
			}
			at := func(sym string, off uint64) table.Row {
				r, ok := tab.Lookup(fn(sym) + off)
				if !ok {
					t.Fatalf("%s+%d: no row", sym, off)
				}
				r.PC = 0
				return r
			}
			normal := func(cfa table.CFARule, off int32) table.Row {
				return table.Row{Kind: table.KindNormal, CFA: cfa, CFAOffset: off, RAOffset: -8}
			}
			withFP := func(r table.Row, off int32) table.Row { r.FPSaved, r.FPOffset = true, off; return r }
			fb := table.Row{Kind: table.KindFallback}
			for _, c := range []struct {
				sym  string
				off  uint64
				want table.Row
			}{
				{"cfi_frame", 0, normal(table.CFASP, 8)},
				{"cfi_frame", 1, normal(table.CFASP, 16)},                        // push %rbx: a callee-saved register changes nothing we use
				{"cfi_frame", 2, withFP(normal(table.CFASP, 24), -24)},           // push %rbp
				{"cfi_frame", 5, withFP(normal(table.CFAFP, 24), -24)},           // mov %rsp, %rbp
				{"cfi_frame", 12, normal(table.CFASP, 16)},                       // early return path, after pop %rbp
				{"cfi_frame", 14, withFP(normal(table.CFAFP, 24), -24)},          // restore_state
				{"cfi_frame", 14 + 300 + 4 + 70000 + 1, normal(table.CFASP, 16)}, // after advance_loc4
				{"cfi_ra_in_reg", 1, fb},                                         // RA in %rdi
				{"cfi_ra_in_reg", 2, normal(table.CFASP, 8)},                     // pushed back
				{"cfi_cfa_expr", 4, fb},                                          // CFA = *(rsp+16)
				{"cfi_cfa_expr", 5, normal(table.CFASP, 32)},                     // back to rsp+32
				{"cfi_plt", 0, table.Row{Kind: table.KindNormal, CFA: table.CFAPLT, RAOffset: -8}},
				{"cfi_plt", 16, fb},                                       // threshold 10: not the PLT we know
				{"cfi_fp_rules", 1, withFP(normal(table.CFASP, 16), -16)}, // GNU_args_size ignored
				{"cfi_fp_rules", 2, fb},                                   // val_offset rbp
				{"cfi_fp_rules", 3, fb},                                   // rbp at an expression
				{"cfi_fp_rules", 4, withFP(normal(table.CFASP, 16), -16)},
				{"cfi_outermost", 0, table.Row{Kind: table.KindEnd}},
				{"cfi_outermost", 3, table.Row{Kind: table.KindEnd}},
				{"cfi_sigframe", 0, table.Row{Kind: table.KindSignal}},
				{"cfi_restore_plain", 0, table.Row{Kind: table.KindSignal}}, // CFI without 'S': by its bytes
				{"nocfi_plain", 0, fb},
				{"nocfi_restore_rt", 0, table.Row{Kind: table.KindSignal}},          // found by its bytes
				{"nocfi_restore_rt", ^uint64(0), table.Row{Kind: table.KindSignal}}, // the nop before it
				{"nocfi_restore_rt", 9, fb},
			} {
				if got := at(c.sym, c.off); got != c.want {
					t.Errorf("%s%+d: got %+v, want %+v", c.sym, int64(c.off), got, c.want)
				}
			}
			// Offsets beyond 16 bits stay exact here; the BPF encoding decides.
			start, size := testfixture.Func(t, bin, "big_frame")
			large := false
			for pc := start; pc < start+size; pc++ {
				if r, _ := tab.Lookup(pc); r.Kind == table.KindNormal && r.CFAOffset > 70000 {
					large = true
				}
			}
			if !large {
				t.Error("big_frame: no row with its 70000-byte frame")
			}
		})
	}
}

// TestVDSO builds the table of this process's vdso, an ELF image that
// exists only in memory, read from /proc/self/mem as the sampler would, and
// compares it with the peer on a copy of the image.
func TestVDSO(t *testing.T) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		testfixture.SkipOrFail(t, "no /proc: %v", err)
	}
	var lo, hi uint64
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.HasSuffix(line, "[vdso]") {
			if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err != nil {
				t.Fatal(err)
			}
		}
	}
	if hi <= lo {
		testfixture.SkipOrFail(t, "no vdso mapped")
	}
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	img := make([]byte, hi-lo)
	if _, err := mem.ReadAt(img, int64(lo)); err != nil {
		t.Fatal(err)
	}
	f, err := elfx.NewFile(img)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := table.Build(f, table.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, tab)
	path := filepath.Join(t.TempDir(), "vdso.so")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	a := compareFDEs(t, tab, peerFDEs(t, path, "--eh-frame"), codeOf(f))
	for _, b := range a.bad {
		t.Error(b)
	}
	t.Logf("vdso: %s, %d rows: %s", tab.Source, len(tab.Rows), a)
}
