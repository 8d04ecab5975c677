package symtab

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// llvmNames asks llvm-symbolizer for the function of each address, using
// only the file's own tables: no debug directory, no debuginfod.
func llvmNames(t *testing.T, obj string, addrs []uint64) []string {
	t.Helper()
	frames := testfixture.LLVMSymbolize(t, obj, addrs, "--no-inlines", "--no-demangle",
		"--debug-file-directory=/nonexistent", "--no-debuginfod")
	res := make([]string, len(frames))
	for i, f := range frames {
		if len(f) > 0 && f[0].FunctionName != "??" {
			res[i] = f[0].FunctionName
		}
	}
	return res
}

// sampleAddrs picks addresses to compare: each symbol's first, second,
// middle and last byte, one byte past it, plus a regular sweep over the
// executable sections. PLT sections are returned separately.
func sampleAddrs(f *elfx.File, tab *Table, sweep int) (addrs []uint64, plt map[uint64]bool) {
	seen := map[uint64]bool{}
	add := func(a uint64) {
		if !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	tab.All(func(s Symbol) bool {
		add(s.Start)
		add(s.Start + 1)
		add(s.Start + (s.End-s.Start)/2)
		add(s.End - 1)
		add(s.End)
		return true
	})
	plt = map[uint64]bool{}
	var total uint64
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_EXECINSTR != 0 && s.Flags&elf.SHF_ALLOC != 0 {
			total += s.Size
		}
	}
	step := max(total/uint64(sweep), 1)
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_EXECINSTR == 0 || s.Flags&elf.SHF_ALLOC == 0 {
			continue
		}
		for a := s.Addr; a < s.Addr+s.Size; a += step {
			add(a)
		}
		if strings.HasPrefix(s.Name, ".plt") {
			for a := s.Addr; a < s.Addr+s.Size; a++ {
				plt[a] = true
			}
		}
	}
	return addrs, plt
}

type agreement struct {
	total, agree, pltSkipped, padding int
	bad                               []string
}

func compareWithLLVM(t *testing.T, path string, sweep int) agreement {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	addrs, plt := sampleAddrs(f, tab, sweep)
	b := builder{text: execRanges(f)}
	want := llvmNames(t, path, addrs)
	var a agreement
	for i, addr := range addrs {
		if plt[addr] {
			a.pltSkipped++ // llvm has no PLT names; checked against objdump
			continue
		}
		got, _, _, _ := tab.Lookup(addr)
		if got == "" && want[i] == "" {
			continue
		}
		if _, in := b.textAt(addr); !in && got == "" {
			// Alignment padding between executable sections: llvm lets
			// an unsized symbol (_init, _fini) run on to the next symbol;
			// we stop at its section's end by design. Never a real PC.
			a.padding++
			continue
		}
		a.total++
		if got == want[i] {
			a.agree++
		} else if len(a.bad) < 40 {
			a.bad = append(a.bad, fmt.Sprintf("%#x: got %q, llvm %q", addr, got, want[i]))
		}
	}
	return a
}

func TestAgreesWithLLVMSymbolizer(t *testing.T) {
	hello := func(name string, args ...string) string {
		return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"elf/hello.c"}, Args: append([]string{"-O2"}, args...)})
	}
	dir := t.TempDir()
	// A dynsym-only binary: strip --strip-all keeps .dynsym; -rdynamic
	// exports the program's functions into it.
	stripped := filepath.Join(dir, "hello-stripped")
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--strip-all", hello("hello-rdynamic", "-rdynamic"), stripped)
	// Copies of system files, so llvm-symbolizer cannot find their debug
	// files through the original path either.
	bins := []string{hello("hello-O2"), stripped}
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/ls", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		if _, err := os.Stat(p); err != nil {
			testfixture.SkipPart(t, filepath.Base(p), "no %s: %v", p, err)
			continue
		}
		cp := filepath.Join(dir, filepath.Base(p))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		bins = append(bins, cp)
	}
	var tot, agr int
	for _, bin := range bins {
		a := compareWithLLVM(t, bin, 4000)
		tot += a.total
		agr += a.agree
		pct := 100 * float64(a.agree) / float64(max(a.total, 1))
		t.Logf("%s: %d/%d agree (%.2f%%); %d PLT addresses checked against objdump instead, %d inter-section padding addresses left out",
			filepath.Base(bin), a.agree, a.total, pct, a.pltSkipped, a.padding)
		for _, b := range a.bad {
			t.Logf("  %s", b)
		}
		if a.total < 20 {
			t.Errorf("%s: only %d comparable addresses", bin, a.total)
		}
		if pct < 99.5 {
			t.Errorf("%s: agreement %.2f%% < 99.5%%", bin, pct)
		}
	}
	t.Logf("overall: %d/%d agree (%.3f%%)", agr, tot, 100*float64(agr)/float64(max(tot, 1)))
}
