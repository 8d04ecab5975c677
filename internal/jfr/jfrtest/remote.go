package jfrtest

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// RemoteObject is one binary of the remote-frame fixture.
type RemoteObject struct {
	Name     string // plain, moved, exe
	Path     string // the stripped file the process ran
	Unstrip  string // the file as built, with DWARF (llvm-symbolizer's input)
	Debug    string // its separate debug file
	BuildID  string
	Base     uint64 // image base in the process: start of its first mapping with file offset 0
	LoadBias uint64
}

// RemoteFrameInfo is one recorded frame: where it ran and what a profiler with
// remotesym=true would write for it.
type RemoteFrameInfo struct {
	Obj    *RemoteObject
	PC     uint64 // run-time address (a return address for callers)
	Offset uint64 // PC - image base: the remote frame's signature
	// ELFAddr is the address llvm-symbolizer takes for this frame, found
	// the other way, through /proc/PID/maps and the PT_LOAD that holds the
	// file offset (minus 1 for callers).
	ELFAddr uint64
	Caller  bool
}

// RemoteFixture is a real process's stacks through three kinds of ELF
// file: a shared library, a shared library whose .text is linked at an
// address far from its file offset, and a non-PIE executable.
type RemoteFixture struct {
	Objects []*RemoteObject
	Stacks  [][]RemoteFrameInfo // leaf first: lib_leaf, lib_mid, lib_outer, exe_call
	PID     int
}

// BuildRemoteFixture compiles testdata/src/jfr/remote, strips the results
// (keeping their debug files), runs the stripped executable on the stripped
// libraries and reads back the PCs it recorded and its /proc/PID/maps.
func BuildRemoteFixture(t testing.TB) *RemoteFixture {
	t.Helper()
	flags := []string{"-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-Wl,--build-id"}
	plain := testfixture.Build(t, testfixture.Spec{Name: "libplain.so", Lang: "c", Sources: []string{"jfr/remote/lib.c"},
		Args: append([]string{"-shared", "-fPIC"}, flags...)})
	moved := testfixture.Build(t, testfixture.Spec{Name: "libmoved.so", Lang: "c", Sources: []string{"jfr/remote/lib.c"},
		Args: append([]string{"-shared", "-fPIC", "-Wl,--section-start=.text=0x40000"}, flags...)})
	exe := testfixture.Build(t, testfixture.Spec{Name: "remotemain", Lang: "c", Sources: []string{"jfr/remote/main.c"},
		Args: append(append([]string{"-no-pie"}, flags...), "-ldl")})
	fx := &RemoteFixture{}
	objs := map[string]*RemoteObject{}
	for _, o := range []struct{ name, path string }{{"plain", plain}, {"moved", moved}, {"exe", exe}} {
		stripped, debug := testfixture.SplitDebug(t, o.path, false)
		ro := &RemoteObject{Name: o.name, Path: stripped, Unstrip: o.path, Debug: debug, BuildID: testfixture.BuildID(t, o.path)}
		fx.Objects = append(fx.Objects, ro)
		objs[stripped] = ro
	}
	cmd := exec.Command(fx.Objects[2].Path, fx.Objects[0].Path, fx.Objects[1].Path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	fx.PID = cmd.Process.Pid
	type rec struct {
		lib string
		pcs []uint64
	}
	var recs []rec
	sc := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer deadline.Stop()
	for len(recs) < 2 && sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 {
			t.Fatalf("fixture printed %q", sc.Text())
		}
		r := rec{lib: f[0]}
		for _, s := range f[1:] {
			v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
			if err != nil {
				t.Fatalf("fixture printed %q", sc.Text())
			}
			r.pcs = append(r.pcs, v)
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 {
		t.Fatalf("fixture printed %d lines", len(recs))
	}
	maps := readMaps(t, fx.PID)
	for _, ro := range fx.Objects {
		for _, m := range maps {
			if m.path == ro.Path && m.offset == 0 {
				ro.Base = m.start
				ro.LoadBias = m.start - loadVaddr0(t, ro.Unstrip)
				break
			}
		}
		if ro.Base == 0 {
			t.Fatalf("%s is not mapped with file offset 0 in pid %d", ro.Path, fx.PID)
		}
	}
	for _, r := range recs {
		var st []RemoteFrameInfo
		for i, pc := range r.pcs {
			m := findMap(maps, pc)
			if m == nil || objs[m.path] == nil {
				t.Fatalf("pc %#x is in no fixture mapping", pc)
			}
			o := objs[m.path]
			fi := RemoteFrameInfo{Obj: o, PC: pc, Offset: pc - o.Base, Caller: i > 0}
			fi.ELFAddr = elfAddr(t, o.Unstrip, pc-m.start+m.offset)
			if fi.Caller {
				fi.ELFAddr--
			}
			st = append(st, fi)
		}
		fx.Stacks = append(fx.Stacks, st)
	}
	return fx
}

// Recording writes the fixture's stacks as a Datadog-profiler recording:
// remote frames under a Java caller, with a jdk.NativeLibrary event (build
// id, load bias) per object. Each stack is sampled weights[i] times.
func (fx *RemoteFixture) Recording(startNanos int64, weights ...int64) *Recording {
	r := New(startNanos)
	for _, o := range fx.Objects {
		r.Library(Library{Name: o.Path, Base: o.Base, Top: o.Base + 0x100000, BuildID: o.BuildID, LoadBias: o.LoadBias})
	}
	for i, st := range fx.Stacks {
		var frames []Frame
		for _, f := range st {
			frames = append(frames, RemoteFrame(f.Obj.BuildID, f.Offset))
		}
		frames = append(frames, JavaFrame("com/example/Native", "call", 12), JavaFrame("com/example/Main", "main", 5))
		w := int64(1)
		if i < len(weights) {
			w = weights[i]
		}
		r.Sample(DatadogExecutionSample, int64(i+1)*1e6, 100+int64(i), w, frames...)
	}
	return r
}

// DebugDir returns a .build-id tree holding the fixture's debug files.
func (fx *RemoteFixture) DebugDir(t testing.TB) string {
	dir := t.TempDir()
	for _, o := range fx.Objects {
		d := filepath.Join(dir, ".build-id", o.BuildID[:2])
		os.MkdirAll(d, 0o755)
		copyFile(t, o.Debug, filepath.Join(d, o.BuildID[2:]+".debug"))
	}
	return dir
}

func copyFile(t testing.TB, from, to string) {
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
}

type mapping struct {
	start, end, offset uint64
	path               string
}

func readMaps(t testing.TB, pid int) []mapping {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []mapping
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		se := strings.SplitN(f[0], "-", 2)
		s, _ := strconv.ParseUint(se[0], 16, 64)
		e, _ := strconv.ParseUint(se[1], 16, 64)
		o, _ := strconv.ParseUint(f[2], 16, 64)
		out = append(out, mapping{start: s, end: e, offset: o, path: f[5]})
	}
	return out
}

func findMap(maps []mapping, pc uint64) *mapping {
	for i := range maps {
		if pc >= maps[i].start && pc < maps[i].end {
			return &maps[i]
		}
	}
	return nil
}

// elfAddr maps a file offset to the ELF address through the PT_LOAD
// segment that holds it.
func elfAddr(t testing.TB, path string, off uint64) uint64 {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr
		}
	}
	t.Fatalf("%s: no PT_LOAD holds file offset %#x", path, off)
	return 0
}

func loadVaddr0(t testing.TB, path string) uint64 {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Off == 0 {
			return p.Vaddr
		}
	}
	return 0
}
