package main

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/profsym/profsym/internal/testfixture"
)

// pprofVersion is the github.com/google/pprof version this module requires.
func pprofVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/google/pprof" {
			return f[1]
		}
	}
	t.Fatal("go.mod does not require github.com/google/pprof")
	return ""
}

// pprofCLI builds the real pprof command (not `go tool pprof`, which reads
// DWARF itself and never runs llvm-symbolizer) at the version in go.mod, in
// a scratch module so this module's go.mod and go.sum stay as they are.
// Built once into the fixtures' cache: a temporary directory per run was
// never removed (16 MB a run, 28 of them on this machine).
func pprofCLI(t *testing.T) string {
	t.Helper()
	gotool := testfixture.NeedTool(t, "go")
	version := pprofVersion(t)
	return testfixture.Cached(t, "pprof-"+version, "pprof", func(tmp string) {
		mod := "module pprofcli\n\ngo 1.26\n\nrequire github.com/google/pprof " + version + "\n"
		if err := os.WriteFile(filepath.Join(tmp, "go.mod"), []byte(mod), 0o644); err != nil {
			t.Fatal(err)
		}
		if sum, err := os.ReadFile(filepath.Join(testfixture.Root(t), "go.sum")); err == nil {
			if err := os.WriteFile(filepath.Join(tmp, "go.sum"), sum, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(gotool, "build", "-mod=mod", "-o", filepath.Join(tmp, "pprof"), "github.com/google/pprof")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building pprof: %v\n%s", err, out)
		}
	})
}

// unsymbolized writes a CPU profile of bin with one sample per address and
// no function names, mapped at a PIE base as /proc/PID/maps would show it.
func unsymbolized(t *testing.T, bin string, vaddrs []uint64) string {
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var text *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	if text == nil {
		t.Fatal("no executable segment")
	}
	const base = 0x555555554000
	const page = 0x1000
	m := &profile.Mapping{ID: 1, Start: base + text.Vaddr&^(page-1), Limit: base + (text.Vaddr+text.Memsz+page-1)&^(page-1),
		Offset: text.Off &^ (page - 1), File: bin, BuildID: testfixture.BuildID(t, bin)}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: 1,
		Mapping: []*profile.Mapping{m},
	}
	for i, a := range vaddrs {
		loc := &profile.Location{ID: uint64(i + 1), Mapping: m, Address: base + a}
		p.Location = append(p.Location, loc)
		p.Sample = append(p.Sample, &profile.Sample{Location: []*profile.Location{loc}, Value: []int64{int64(i + 1)}})
	}
	out := filepath.Join(t.TempDir(), "cpu.pb.gz")
	fh, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := p.Write(fh); err != nil {
		t.Fatal(err)
	}
	return out
}

// runPprof runs pprof with PATH holding only a symlink named
// llvm-symbolizer to target, so that it is what pprof runs (with no
// addr2line or nm to fall back on).
func runPprof(t *testing.T, pprof, target string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(target, filepath.Join(dir, "llvm-symbolizer")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pprof, args...)
	cmd.Env = []string{"PATH=" + dir, "HOME=" + t.TempDir(), "PPROF_TMPDIR=" + t.TempDir()}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pprof %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// The real pprof CLI, given an unsymbolized profile, runs a symlink named
// llvm-symbolizer from PATH as "llvm-symbolizer --inlining -demangle=false
// --output-style=JSON": through that symlink profsym answers, and pprof
// prints what it prints with llvm-symbolizer-19 itself.
func TestPprofThroughSymlink(t *testing.T) {
	if runtime.GOOS != "linux" {
		testfixture.SkipOrFail(t, "fixtures are Linux ELF")
	}
	llvmTool := testfixture.NeedTool(t, "llvm-symbolizer-19")
	pprof := pprofCLI(t)
	self := filepath.Join(t.TempDir(), "profsym")
	gotool := testfixture.NeedTool(t, "go")
	if out, err := exec.Command(gotool, "build", "-o", self, ".").CombinedOutput(); err != nil {
		t.Fatalf("building profsym: %v\n%s", err, out)
	}
	bin := fixture(t)
	var vaddrs []uint64
	for _, a := range funcAddrs(t, bin, "hot", "hash_bytes", "sort_and_sum", "main") {
		v, _ := strconv.ParseUint(a, 0, 64)
		vaddrs = append(vaddrs, v)
	}
	prof := unsymbolized(t, bin, vaddrs)
	for _, args := range [][]string{{"-traces"}, {"-raw"}, {"-top", "-lines"}} {
		args = append(args, prof)
		got := runPprof(t, pprof, self, args...)
		want := runPprof(t, pprof, llvmTool, args...)
		if got != want {
			t.Errorf("pprof %v through profsym:\n%s\nthrough llvm-symbolizer-19:\n%s", args, got, want)
		}
		if args[0] == "-traces" {
			t.Logf("pprof -traces through profsym:\n%s", got)
			for _, fn := range []string{"hot", "hash_bytes", "sort_and_sum", "main"} {
				if !strings.Contains(got, fn) {
					t.Errorf("pprof -traces does not name %s:\n%s", fn, got)
				}
			}
		}
	}
}

func TestDispatchByName(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/local/bin/llvm-symbolizer", "--inlining", "-demangle=false"}, "symbolize --inlining -demangle=false"},
		{[]string{"llvm-symbolizer-19", "--obj=x"}, "symbolize --obj=x"},
		{[]string{"/opt/profsym", "top", "f.json"}, "top f.json"},
		{[]string{"profsym"}, ""},
	} {
		if got := strings.Join(dispatch(c.argv), " "); got != c.want {
			t.Errorf("dispatch(%q) = %q, want %q", c.argv, got, c.want)
		}
	}
}
