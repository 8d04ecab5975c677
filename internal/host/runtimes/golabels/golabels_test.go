package golabels

import (
	"bufio"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/testfixture"
)

// fakeProcs records what a Tracker puts in go_procs.
type fakeProcs struct {
	mu sync.Mutex
	m  map[uint32]bpf.ProfileGoProc
}

func (f *fakeProcs) Put(k, v any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[k.(uint32)] = *v.(*bpf.ProfileGoProc)
	return nil
}

func (f *fakeProcs) Delete(k any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, k.(uint32))
	return nil
}

func TestLayoutFor(t *testing.T) {
	for v, want := range map[string]Layout{
		"go1.19.8": {TLSG: -8, GM: 48, MCurg: 192, GLabels: 360},
		"go1.21.0": {TLSG: -8, GM: 48, MCurg: 192, GLabels: 344},
		"go1.23.1": {TLSG: -8, GM: 48, MCurg: 192, GLabels: 352},
		"go1.24.2": {TLSG: -8, GM: 48, MCurg: 192, GLabels: 352, Slice: true},
		"go1.26.8": {TLSG: -8, GM: 48, MCurg: 184, GLabels: 352, Slice: true},
	} {
		if l, table, err := LayoutFor(v); err != nil || !table || l != want {
			t.Errorf("%s: %+v %v %v, want %+v", v, l, table, err, want)
		}
	}
	if _, table, err := LayoutFor("go1.25.0"); err != nil || table {
		t.Errorf("go1.25: table %v, %v; want DWARF only", table, err)
	}
	for _, v := range []string{"go1.16", "go1.27.0", "devel", ""} {
		if _, _, err := LayoutFor(v); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: %v, want unsupported", v, err)
		}
	}
}

// gos are the Go toolchains here the fixture is built with.
func gos(t *testing.T) map[string]testfixture.Spec {
	t.Helper()
	testfixture.Short(t, "builds Go fixtures")
	specs := map[string]testfixture.Spec{"host": {Name: "golabels", Lang: "go", Sources: []string{"golabels"}}}
	const go119 = "/usr/lib/go-1.19/bin/go"
	if _, err := os.Stat(go119); err == nil {
		specs["go1.19"] = testfixture.Spec{Name: "golabels119", Lang: "go", Sources: []string{"golabels"}, Compiler: go119}
	} else {
		testfixture.SkipOrFail(t, "%s is not installed (golang-1.19-go)", go119)
	}
	return specs
}

// TestOffsetsMatchDWARF checks the table (what stripped binaries get)
// against the DWARF of the fixture built by each Go installed, read with
// the standard library's reader, and the reader used here.
func TestOffsetsMatchDWARF(t *testing.T) {
	for name, spec := range gos(t) {
		t.Run(name, func(t *testing.T) {
			bin := testfixture.Build(t, spec)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			d, err := f.DWARF()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			r := d.Reader()
			for e, err := r.Next(); e != nil && err == nil; e, err = r.Next() {
				name, _ := e.Val(dwarf.AttrName).(string)
				if e.Tag != dwarf.TagStructType || (name != "runtime.g" && name != "runtime.m") {
					continue
				}
				for c, err := r.Next(); c != nil && err == nil && c.Tag != 0; c, err = r.Next() {
					fn, _ := c.Val(dwarf.AttrName).(string)
					off, _ := c.Val(dwarf.AttrDataMemberLoc).(int64)
					got[name+"."+fn] = off
				}
			}
			ef, err := openELF(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			v := goVersion(t, ef)
			l, table, err := LayoutFor(v)
			if err != nil || !table {
				t.Fatalf("%s: %v %v", v, table, err)
			}
			if int64(l.GM) != got["runtime.g.m"] || int64(l.MCurg) != got["runtime.m.curg"] || int64(l.GLabels) != got["runtime.g.labels"] {
				t.Errorf("%s: table %+v, DWARF g.m %d m.curg %d g.labels %d", v, l, got["runtime.g.m"], got["runtime.m.curg"], got["runtime.g.labels"])
			}
			gm, gl, mc, err := offsetsFromDWARF(ef)
			if err != nil || gm != l.GM || gl != l.GLabels || mc != l.MCurg {
				t.Errorf("offsetsFromDWARF: %d %d %d %v", gm, gl, mc, err)
			}
			if s := tlsSlot(ef); s != -8 {
				t.Errorf("TLS slot %d, want -8", s)
			}
			t.Logf("%s: %+v", v, l)
		})
	}
}

// TestTrackerAttach: a running Go fixture gets its go_procs entry, a
// label set pointer that leads nowhere reads as none, and exit removes it.
func TestTrackerAttach(t *testing.T) {
	for name, spec := range gos(t) {
		t.Run(name, func(t *testing.T) {
			bin := testfixture.Build(t, spec)
			cmd := exec.Command(bin, "1")
			out, _ := cmd.StdoutPipe()
			in, _ := cmd.StdinPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
			if l, _ := bufio.NewReader(out).ReadString('\n'); l != "ready\n" {
				t.Fatalf("fixture said %q", l)
			}
			p, err := normalize.New(normalize.Options{}).Process(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			procs := &fakeProcs{m: map[uint32]bpf.ProfileGoProc{}}
			tr := New(Options{Procs: procs, Limits: lim})
			defer tr.Close()
			tr.Attach(p)
			got, ok := procs.m[uint32(p.PID)]
			if !ok || got.TlsG != -8 || got.G_m != 48 || got.G_labels == 0 {
				t.Fatalf("go_procs %+v %v; stats %+v", got, ok, tr.Stats())
			}
			if s := tr.Labels(p.PID, 0xdead0000); s != nil {
				t.Errorf("labels at a wild pointer: %v", s)
			}
			if st := tr.Stats(); st.Attached != 1 || st.Failed != 1 {
				t.Errorf("stats %+v", st)
			}
			tr.Forget(p.PID)
			if _, ok := procs.m[uint32(p.PID)]; ok {
				t.Error("go_procs entry kept after Forget")
			}
			// Not a Go program: nothing.
			self, err := normalize.New(normalize.Options{}).Process(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			self.Mappings = nil
			tr.Attach(self)
			if len(procs.m) != 0 {
				t.Errorf("go_procs %v for a process with no Go executable", procs.m)
			}
		})
	}
}

// A set rewritten at the same address between two reads (as a goroutine's
// set freed and another allocated in its slot) reads as it is now: the
// Tracker keeps no set from one read to the next (profbuild reads each
// once per report). The set is this test's own, in its own memory, laid
// out as runtime/pprof's labelMap.
func TestTrackerReadsAgain(t *testing.T) {
	self, err := normalize.New(normalize.Options{}).Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	procs := &fakeProcs{m: map[uint32]bpf.ProfileGoProc{}}
	tr := New(Options{Procs: procs, Limits: lim})
	defer tr.Close()
	tr.Attach(self)
	if _, ok := procs.m[uint32(self.PID)]; !ok {
		t.Fatalf("this test binary (a Go program) is not attached: %+v", tr.Stats())
	}
	type label struct{ key, value string }
	type labelMap struct{ list []label }
	set := &labelMap{list: []label{{"request", "a" + strings.Repeat("x", 3)}}}
	ptr := uint64(uintptr(unsafe.Pointer(set))) //nolint:gosec // its address, read back through /proc/self/mem
	read := func() string {
		var b []string
		for _, l := range tr.Labels(self.PID, ptr) {
			b = append(b, l.Key+"="+l.Value)
		}
		return strings.Join(b, ",")
	}
	if got := read(); got != "request=axxx" {
		t.Fatalf("first read %q", got)
	}
	set.list = []label{{"request", "b"}, {"span", "c"}}
	if got := read(); got != "request=b,span=c" {
		t.Errorf("after the set changed at its address: %q", got)
	}
	runtime.KeepAlive(set)
}
