package addrmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

const sample = `55d0c7a4c000-55d0c7a4e000 r--p 00000000 08:01 1311755                    /usr/bin/cat
55d0c7a4e000-55d0c7a53000 r-xp 00002000 08:01 1311755                    /usr/bin/cat
55d0c8000000-55d0c8021000 rw-p 00000000 00:00 0                          [heap]
7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 
7f1c2b000000-7f1c2b001000 r-xp 00001000 fd:02 42                         /tmp/my dir/lib with spaces.so (deleted)
7f1c2c000000-7f1c2c001000 rw-s 00000000 00:05 99                         /dev/zero (deleted)
7f1c2d000000-7f1c2d001000 r--p 00000000 00:00 0                          [anon:glibc malloc]
7ffc1b9f2000-7ffc1b9f4000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`

func TestParseMaps(t *testing.T) {
	var got []Mapping
	if err := ParseMaps(strings.NewReader(sample), func(m Mapping) error { got = append(got, m); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []Mapping{
		{Start: 0x55d0c7a4c000, End: 0x55d0c7a4e000, Perms: Read, DevMajor: 8, DevMinor: 1, Inode: 1311755, Path: "/usr/bin/cat"},
		{Start: 0x55d0c7a4e000, End: 0x55d0c7a53000, Offset: 0x2000, Perms: Read | Exec, DevMajor: 8, DevMinor: 1, Inode: 1311755, Path: "/usr/bin/cat"},
		{Start: 0x55d0c8000000, End: 0x55d0c8021000, Perms: Read | Write, Path: "[heap]"},
		{Start: 0x7f1c2a000000, End: 0x7f1c2a021000, Perms: Read | Write},
		{Start: 0x7f1c2b000000, End: 0x7f1c2b001000, Offset: 0x1000, Perms: Read | Exec, DevMajor: 0xfd, DevMinor: 2, Inode: 42, Path: "/tmp/my dir/lib with spaces.so", Deleted: true},
		{Start: 0x7f1c2c000000, End: 0x7f1c2c001000, Perms: Read | Write | Shared, DevMinor: 5, Inode: 99, Path: "/dev/zero", Deleted: true},
		{Start: 0x7f1c2d000000, End: 0x7f1c2d001000, Perms: Read, Path: "[anon:glibc malloc]"},
		{Start: 0x7ffc1b9f2000, End: 0x7ffc1b9f4000, Perms: Read | Exec, Path: "[vdso]"},
		{Start: 0xffffffffff600000, End: 0xffffffffff601000, Perms: Exec, Path: "[vsyscall]"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %+v\nwant %+v", i+1, got[i], want[i])
		}
	}
	if !got[0].IsFile() || got[2].IsFile() || got[3].IsFile() || got[7].IsFile() {
		t.Error("IsFile")
	}
	if got[5].Perms.String() != "rw-s" || got[1].Perms.String() != "r-xp" {
		t.Errorf("Perms.String: %s %s", got[5].Perms, got[1].Perms)
	}
}

func TestParseMapsErrors(t *testing.T) {
	for _, in := range []string{
		"zzzz-1000 r-xp 00000000 00:00 0\n",
		"2000-1000 r-xp 00000000 00:00 0\n",
		"1000-2000 rxp 00000000 00:00 0\n",
		"1000-2000 r-xq 00000000 00:00 0\n",
		"1000-2000 r-xp 00000000 0000 0\n",
		"1000-2000 r-xp 00000000 00:00\n",
		"1000-2000 r-xp 00000000 00:00 x\n",
		"1000-2000 r-xp 11111111111111111 00:00 0\n",
		"1000-2000 r-xp 0 00:00 0 /" + strings.Repeat("a", MaxLineLen) + "\n",
	} {
		err := ParseMaps(strings.NewReader(in), func(Mapping) error { return nil })
		if !errors.Is(err, frame.ErrCorruptFile) {
			t.Errorf("%.60q: err = %v", in, err)
		}
	}
	// fn's error is passed through; a last line without newline is parsed.
	stop := errors.New("stop")
	n := 0
	err := ParseMaps(strings.NewReader("1000-2000 r-xp 0 00:00 0 /a\n3000-4000 r-xp 0 00:00 0 /b"), func(m Mapping) error {
		n++
		if m.Path == "/b" {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 {
		t.Fatalf("err = %v after %d", err, n)
	}
}

func TestParseSelfMaps(t *testing.T) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		testfixture.SkipOrFail(t, "no /proc: %v", err)
	}
	defer f.Close()
	exe, _ := os.Executable()
	sawExe, sawVdso := false, false
	err = ParseMaps(f, func(m Mapping) error {
		sawExe = sawExe || m.Path == exe
		sawVdso = sawVdso || m.Path == "[vdso]"
		return nil
	})
	if err != nil || !sawExe || !sawVdso {
		t.Fatalf("err %v, exe %v, vdso %v", err, sawExe, sawVdso)
	}
}

func TestFileOffsetToVaddr(t *testing.T) {
	// lld's default x86-64 layout: the RX segment's Vaddr is its Off plus
	// one page, so one bias per segment is needed.
	lld := []elfx.Segment{
		{Off: 0, Vaddr: 0, Filesz: 0x5e0},
		{Off: 0x5e0, Vaddr: 0x15e0, Filesz: 0x150},
		{Off: 0x730, Vaddr: 0x2730, Filesz: 0x1d8},
	}
	// A non-PIE executable: first segment at 0x400000.
	exec := []elfx.Segment{{Off: 0, Vaddr: 0x400000, Filesz: 0x1000}, {Off: 0x1000, Vaddr: 0x401000, Filesz: 0x2000}}
	cases := []struct {
		segs []elfx.Segment
		off  uint64
		want uint64
		ok   bool
	}{
		{lld, 0x5e0, 0x15e0, true},
		{lld, 0x72f, 0x172f, true},
		{lld, 0x730, 0x2730, true},
		{lld, 0x100, 0x100, true},
		{lld, 0x908, 0, false},
		{exec, 0x1234, 0x401234, true},
		{exec, 0x3000, 0, false},
		{nil, 0, 0, false},
	}
	for _, c := range cases {
		got, ok := FileOffsetToVaddr(c.segs, c.off)
		if got != c.want || ok != c.ok {
			t.Errorf("off %#x: %#x %v, want %#x %v", c.off, got, ok, c.want, c.ok)
		}
	}
	m := Mapping{Start: 0x7f0000001000, End: 0x7f0000002000, Offset: 0x1000}
	if v, ok := ProcessToVaddr(m, exec, 0x7f0000001234); !ok || v != 0x401234 {
		t.Errorf("ProcessToVaddr = %#x %v", v, ok)
	}
	if _, ok := ProcessToVaddr(m, exec, 0x7f0000002000); ok {
		t.Error("address past mapping converted")
	}
	if ReturnAddressAdjust(0x1000) != 0xfff || ReturnAddressAdjust(0) != 0 {
		t.Error("ReturnAddressAdjust")
	}
}

// runFixture starts the sleeper, returns the address it printed for
// profsym_target and its maps, then lets it exit.
func runFixture(t *testing.T, bin string) (uint64, []Mapping) {
	t.Helper()
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close() // the fixture exits when stdin closes
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading fixture output: %v", err)
	}
	addr, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "0x"), 16, 64)
	if err != nil {
		t.Fatalf("fixture printed %q", line)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var maps []Mapping
	if err := ParseMaps(f, func(m Mapping) error { maps = append(maps, m); return nil }); err != nil {
		t.Fatal(err)
	}
	return addr, maps
}

func TestRealProcess(t *testing.T) {
	type variant struct {
		name string
		args []string
		lld  bool
	}
	variants := []variant{
		{"pie", []string{"-O1", "-fPIE", "-pie"}, false},
		{"pie-separate-code", []string{"-O1", "-fPIE", "-pie", "-Wl,-z,separate-code"}, false},
		{"pie-noseparate-code", []string{"-O1", "-fPIE", "-pie", "-Wl,-z,noseparate-code"}, false},
		{"no-pie", []string{"-O1", "-no-pie", "-fno-pie"}, false},
		// ET_DYN whose first segment is not at 0, as prelinked libraries.
		{"pie-based", []string{"-O1", "-fPIE", "-pie", "-Wl,-Ttext-segment=0x10000000"}, false},
		{"lld", []string{"-O1", "-fPIE", "-pie", "-fuse-ld=lld", "-B/usr/lib/llvm-19/bin"}, true},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			if v.lld {
				if _, err := os.Stat("/usr/lib/llvm-19/bin/ld.lld"); err != nil {
					testfixture.SkipOrFail(t, "ld.lld (lld-19) not installed")
				}
			}
			bin := testfixture.Build(t, testfixture.Spec{Name: "sleeper-" + v.name, Lang: "c", Sources: []string{"elf/sleeper.c"}, Args: v.args})
			f, err := elfx.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var want uint64
			syms, _ := f.Symbols()
			for _, s := range syms {
				if s.Name == "profsym_target" {
					want = s.Value
				}
			}
			if want == 0 {
				t.Fatal("no profsym_target symbol")
			}
			segs := f.Loads()
			addr, maps := runFixture(t, bin)
			real, _ := filepath.EvalSymlinks(bin)
			var hit *Mapping
			for i := range maps {
				if addr >= maps[i].Start && addr < maps[i].End {
					hit = &maps[i]
				}
			}
			if hit == nil || (hit.Path != bin && hit.Path != real) || hit.Perms&Exec == 0 {
				t.Fatalf("address %#x in mapping %+v", addr, hit)
			}
			got, ok := ProcessToVaddr(*hit, segs, addr)
			if !ok || got != want {
				t.Fatalf("ProcessToVaddr(%#x in %+v) = %#x %v; st_value %#x; segments %+v", addr, *hit, got, ok, want, segs)
			}
			t.Logf("%s: runtime %#x -> %#x (mapping offset %#x, segments %d, first vaddr %#x)", v.name, addr, got, hit.Offset, len(segs), segs[0].Vaddr)
		})
	}
}

func FuzzParseMaps(f *testing.F) {
	f.Add([]byte(sample))
	if b, err := os.ReadFile("/proc/self/maps"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		err := ParseMaps(strings.NewReader(string(data)), func(m Mapping) error {
			n++
			if m.End < m.Start {
				t.Fatalf("end < start: %+v", m)
			}
			return nil
		})
		if err != nil && !errors.Is(err, frame.ErrCorruptFile) {
			t.Fatalf("unexpected error: %v", err)
		}
		if n > len(data)/10+1 {
			t.Fatalf("%d mappings from %d bytes", n, len(data))
		}
	})
}

// TestQueryExec: PROCMAP_QUERY reports the executable mappings the maps
// text does, for this process and a child, or says the kernel lacks it.
// Only [vsyscall], the legacy page outside every process's mappings that the
// text lists last, is not reported.
func TestQueryExec(t *testing.T) {
	if runtime.GOOS != "linux" {
		testfixture.SkipOrFail(t, "PROCMAP_QUERY is Linux's")
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(50 * time.Millisecond) // past exec
	for _, pid := range []int{os.Getpid(), cmd.Process.Pid} {
		path := fmt.Sprintf("/proc/%d/maps", pid)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var got, want []Mapping
		err = QueryExec(f, func(m Mapping) error { got = append(got, m); return nil })
		f.Close()
		if errors.Is(err, ErrQueryUnsupported) {
			testfixture.SkipOrFail(t, "kernel without PROCMAP_QUERY (Linux 6.11+): %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := ParseMaps(bytes.NewReader(text), func(m Mapping) error {
			if m.Perms&Exec != 0 && m.Path != "[vsyscall]" {
				want = append(want, m)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 || !slices.Equal(got, want) {
			t.Fatalf("pid %d:\nquery %+v\ntext  %+v", pid, got, want)
		}
	}
}
