package threadctx

import (
	"bufio"
	"debug/elf"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/testfixture"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeProcs records what a Tracker puts in tctx_procs.
type fakeProcs struct {
	mu sync.Mutex
	m  map[uint32]int64
}

func (f *fakeProcs) Put(k, v any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[k.(uint32)] = v.(*bpf.ProfileTctxProc).TlsOff
	return nil
}

func (f *fakeProcs) Delete(k any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, k.(uint32))
	return nil
}

func (f *fakeProcs) get(pid int) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[uint32(pid)]
	return v, ok
}

// startFixture runs a variant and returns its pid and the offset it
// reports of its own variable ("tls N").
func startFixture(t *testing.T, bin string) (int, int64) {
	t.Helper()
	cmd := exec.Command(bin, "1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	var off int64
	for lines.Scan() {
		l := lines.Text()
		if v, ok := strings.CutPrefix(l, "tls "); ok {
			off, _ = strconv.ParseInt(v, 10, 64)
		}
		if l == "ready" {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return cmd.Process.Pid, off
		}
	}
	t.Fatalf("%s: no ready line", bin)
	return 0, 0
}

// TestOffsetMatchesProgram: for each way a program reaches the variable,
// the offset the Tracker hands the BPF program is the one the program's
// own code uses (&otel_thread_ctx_v1 - the thread pointer).
func TestOffsetMatchesProgram(t *testing.T) {
	testfixture.Short(t, "builds and runs C fixtures")
	for variant, bin := range testfixture.ThreadCtx(t) {
		t.Run(variant, func(t *testing.T) {
			pid, want := startFixture(t, bin)
			if want >= 0 || want%8 != 0 {
				t.Fatalf("the fixture reports offset %d", want)
			}
			p, err := normalize.New(normalize.Options{}).Process(pid)
			if err != nil {
				t.Fatal(err)
			}
			procs := &fakeProcs{m: map[uint32]int64{}}
			tr := New(Options{Procs: procs})
			defer tr.Close()
			tr.Attach(p)
			got, ok := procs.get(pid)
			if !ok || got != want {
				t.Fatalf("tctx_procs[%d] = %d (%v), want %d; stats %+v", pid, got, ok, want, tr.Stats())
			}
			if st := tr.Stats(); st.Attached != 1 || len(st.Refused) != 0 || tr.Reading() != 1 {
				t.Errorf("stats %+v, reading %d", st, tr.Reading())
			}
			tr.Forget(pid)
			if _, ok := procs.get(pid); ok || tr.Reading() != 0 {
				t.Error("the entry outlived Forget")
			}
		})
	}
}

// TestInspectModels: what each variant's file says of the variable.
func TestInspectModels(t *testing.T) {
	testfixture.Short(t, "builds C fixtures")
	bins := testfixture.ThreadCtx(t)
	for variant, bin := range bins {
		f, err := elfx.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		w, found, err := Inspect(f, true)
		_ = f.Close()
		switch {
		case variant == testfixture.ThreadCtxExe:
			if !found || err != nil || w.How != Static || w.Offset != -64 {
				t.Errorf("%s: %+v %v %v, want static at -64", variant, w, found, err)
			}
		case found || err != nil:
			t.Errorf("%s: the program itself publishes nothing, got %+v %v %v", variant, w, found, err)
		}
	}
	for variant, want := range map[string]How{testfixture.ThreadCtxTLSDESC: GOTDescriptor, testfixture.ThreadCtxInitialEx: GOTOffset} {
		so := soOf(t, bins[variant])
		f, err := elfx.Open(so)
		if err != nil {
			t.Fatal(err)
		}
		w, found, err := Inspect(f, false)
		_ = f.Close()
		if !found || err != nil || w.How != want || w.Slot == 0 {
			t.Errorf("%s: %+v %v %v, want how %d", variant, w, found, err, want)
		}
	}
}

// soOf is the library a variant's program needs by path.
func soOf(t *testing.T, bin string) string { return soOfF(t, bin) }

func soOfF(t testing.TB, bin string) string {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.Contains(l, "libotelctx") {
			return l
		}
	}
	t.Fatalf("%s needs no libotelctx: %v", bin, libs)
	return ""
}

func TestResolve(t *testing.T) {
	for _, c := range []struct {
		w      Where
		w0, w1 uint64
		want   int64
		ok     bool
	}{
		{Where{How: Static, Offset: -64}, 0, 0, -64, true},
		{Where{How: GOTOffset}, uint64(0xffffffffffffff78), 0, -136, true},
		{Where{How: GOTDescriptor}, 0x7f0000001000, uint64(0xffffffffffffff78), -136, true},
		// Dynamic TLS: the argument is a pointer, not an offset.
		{Where{How: GOTDescriptor}, 0x7f0000001000, 0x55aa00001000, 0, false},
		// Not relocated, misaligned, out of any static block.
		{Where{How: GOTOffset}, 0, 0, 0, false},
		{Where{How: GOTOffset}, uint64(0xfffffffffffffffc), 0, 0, false},
		{Where{How: GOTOffset}, uint64(1<<64 - 1<<30), 0, 0, false},
		{Where{}, 0, 0, 0, false},
		// arm64: above the thread pointer, past its 16-byte TCB.
		{Where{How: Static, Offset: 192, Above: true}, 0, 0, 192, true},
		{Where{How: GOTOffset, Above: true}, 200, 0, 200, true},
		{Where{How: GOTDescriptor, Above: true}, 0xffff00001000, 200, 200, true},
		{Where{How: GOTDescriptor, Above: true}, 0xffff00001000, 0xaaaa00001000, 0, false},
		{Where{How: GOTOffset, Above: true}, 8, 0, 0, false},
		{Where{How: GOTOffset, Above: true}, uint64(0xffffffffffffff78), 0, 0, false},
	} {
		got, err := Resolve(c.w, c.w0, c.w1)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("Resolve(%+v, %#x, %#x) = %d, %v; want %d ok %v", c.w, c.w0, c.w1, got, err, c.want, c.ok)
		}
		if !c.ok && c.w.How == GOTDescriptor && !errors.Is(err, ErrUnsupported) {
			t.Errorf("dynamic TLS: %v, want unsupported", err)
		}
	}
}

func TestStaticOffset(t *testing.T) {
	for _, c := range []struct {
		memsz, align, vaddr uint64
		want                int64
	}{
		{8, 8, 0x3dc8, 8},
		{136, 64, 0x3dc0, 192},
		{112, 64, 0x3dc0, 128},
		// The first byte off the alignment (vaddr % align = 8): glibc
		// keeps that offset within the block.
		{16, 32, 0x1008, 24},
		{40, 32, 0x1008, 56},
	} {
		got, ok := staticOffset(c.memsz, c.align, c.vaddr)
		if !ok || got != c.want {
			t.Errorf("staticOffset(%d, %d, %#x) = %d %v, want %d", c.memsz, c.align, c.vaddr, got, ok, c.want)
		}
	}
	if _, ok := staticOffset(8, 24, 0); ok {
		t.Error("alignment 24 accepted")
	}
	for _, c := range []struct {
		align, vaddr uint64
		want         int64
	}{
		{8, 0x10dc8, 16},
		{64, 0x10dc0, 64},
		// First byte 8 past a 32-byte alignment: glibc keeps it so.
		{32, 0x10008, 40},
	} {
		got, ok := staticOffsetAbove(c.align, c.vaddr)
		if !ok || got != c.want {
			t.Errorf("staticOffsetAbove(%d, %#x) = %d %v, want %d", c.align, c.vaddr, got, ok, c.want)
		}
	}
}

// TestRetryUntilLoaded: a library not relocated yet is looked at again;
// Close stops the retries (goleak checks the timers' goroutines).
func TestRetryUntilLoaded(t *testing.T) {
	procs := &fakeProcs{m: map[uint32]int64{}}
	tr := New(Options{Procs: procs, ProcRoot: t.TempDir(), RetryEvery: time.Millisecond, Retries: 3})
	m := &normalize.Mapping{Start: 0x1000, End: 0x2000, Path: "/lib/x.so", File: &normalize.FileInfo{ID: normalize.FileID{}}}
	tr.place(1234, m, fileResult{w: Where{How: GOTOffset, Slot: 0x10}, found: true}, 0)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st := tr.Stats(); st.Refused["not_loaded"] == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if st := tr.Stats(); st.Refused["not_loaded"] != 1 || st.Attached != 0 {
		t.Errorf("stats %+v, want one not_loaded after the retries", st)
	}
	tr.Close()
}
