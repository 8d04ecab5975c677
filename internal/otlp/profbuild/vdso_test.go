package profbuild

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// vdsoMapping finds pid's [vdso] in /proc/PID/maps.
func vdsoMapping(t testing.TB, pid int) *normalize.Mapping {
	t.Helper()
	start, end, ok := findMapping(t, pid, func(_, path string) bool { return path == "[vdso]" })
	if !ok {
		testfixture.SkipOrFail(t, "pid %d maps no [vdso]", pid)
		return nil
	}
	return &normalize.Mapping{Start: start, End: end, Path: "[vdso]"}
}

// vdsoBytes reads pid's vdso image as the builder does.
func vdsoBytes(t testing.TB, pid int, m *normalize.Mapping) []byte {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, m.End-m.Start)
	if _, err := f.ReadAt(b, int64(m.Start)); err != nil {
		t.Fatal(err)
	}
	return b
}

// The vdso of this process and of another one, read through /proc/PID/mem
// as the builder reads it, names every exported vdso function as
// llvm-symbolizer-19 names it in the same image, saved to a file.
func TestVDSONamesAgreeWithLLVM(t *testing.T) {
	llvm := testfixture.NeedTool(t, "llvm-symbolizer-19")
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	var cache vdsoImages
	for _, pid := range []int{os.Getpid(), child.Process.Pid} {
		m := vdsoMapping(t, pid)
		img, err := cache.image("/proc", pid, m)
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		raw := vdsoBytes(t, pid, m)
		path := filepath.Join(t.TempDir(), "vdso.so")
		os.WriteFile(path, raw, 0o644)
		ef, err := elf.NewFile(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		syms, _ := ef.DynamicSymbols()
		var addrs []string
		var ours []string
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Size < 2 {
				continue
			}
			// An address inside each function, as an image offset.
			off := s.Value + 1
			vaddr, ok := img.vaddr(off)
			name, _, _, found := img.tab.Lookup(vaddr)
			if !ok || !found {
				t.Errorf("pid %d: no name at %#x (%s)", pid, off, s.Name)
				continue
			}
			addrs = append(addrs, fmt.Sprintf("%#x", vaddr))
			ours = append(ours, name)
		}
		if len(ours) == 0 {
			t.Fatalf("pid %d: no functions in the vdso", pid)
		}
		out, err := exec.Command(llvm, append([]string{"--obj=" + path, "--no-inlines", "--functions=linkage"}, addrs...)...).Output()
		if err != nil {
			t.Fatal(err)
		}
		var theirs []string
		for _, block := range strings.Split(strings.TrimSpace(string(out)), "\n\n") {
			theirs = append(theirs, strings.SplitN(block, "\n", 2)[0])
		}
		for i := range ours {
			if i >= len(theirs) || ours[i] != theirs[i] {
				t.Errorf("pid %d %s: we name %q, llvm-symbolizer %q", pid, addrs[i], ours[i], theirs)
			}
		}
		if img.buildID == "" {
			t.Errorf("pid %d: the vdso has no build id", pid)
		}
		t.Logf("pid %d: vdso %d bytes, build id %s: %s", pid, len(raw), img.buildID, strings.Join(ours, " "))
	}
	if len(cache.byHash) != 1 {
		t.Errorf("two 64-bit processes, %d parsed images", len(cache.byHash))
	}
}

// A mapping larger than any vdso is not read; hostile bytes are an error,
// not a panic.
func TestVDSOBounds(t *testing.T) {
	var cache vdsoImages
	m := &normalize.Mapping{Start: 0x10000, End: 0x10000 + maxVDSOBytes + 4096, Path: "[vdso]"}
	if _, err := cache.image("/proc", os.Getpid(), m); err == nil {
		t.Error("a 132 KiB [vdso] was read")
	}
	for _, b := range [][]byte{nil, []byte("\x7fELF"), bytes.Repeat([]byte{0xff}, 8192)} {
		if _, err := parseVDSO(b); err == nil {
			t.Errorf("parsed %d hostile bytes", len(b))
		}
	}
}

func FuzzParseVDSO(f *testing.F) {
	m := vdsoMapping(f, os.Getpid())
	f.Add(vdsoBytes(f, os.Getpid(), m))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > maxVDSOBytes {
			return
		}
		img, err := parseVDSO(b)
		if err != nil {
			return
		}
		for off := uint64(0); off < uint64(len(b)); off += 64 {
			if v, ok := img.vaddr(off); ok {
				img.tab.Lookup(v)
			}
		}
	})
}

// Sampled for real: this process spinning in time.Now (the vdso's
// clock_gettime) gets leaf frames on its [vdso] mapping named, with the
// image's build id on the mapping.
func TestVDSOFramesNamed(t *testing.T) {
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99})
	end := time.Now().Add(2 * time.Second)
	var sink int64
	for time.Now().Before(end) {
		sink += time.Now().UnixNano() & 1
	}
	// The samples taken before this process's unwind tables were built
	// wait as stack copies until they are, and join the report then: under
	// -race beside other packages the build outlasted the spin (stop 35's
	// CI: no sample of this process in the report).
	deadline := time.Now().Add(time.Minute)
	for u := h.s.Unwinder(); u != nil && u.CopiesPending(os.Getpid()) > 0 && time.Now().Before(deadline); {
		if err := h.b.Stage(h.s, h.start); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := h.collect(t)
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	var inVDSO, named int64
	names := map[string]bool{}
	for _, s := range v.samples(t, os.Getpid()) {
		leaf := s.locs[0]
		file, attrs := v.mapping(leaf)
		if file != "[vdso]" {
			continue
		}
		inVDSO += s.count
		if leaf.Lines().Len() > 0 && attrs[pframe.AttrBuildIDGNU] != nil {
			named += s.count
			fi := leaf.Lines().At(0).FunctionIndex()
			names[v.dict.StringTable().At(int(v.dict.FunctionTable().At(int(fi)).NameStrindex()))] = true
		}
	}
	t.Logf("%d samples with a [vdso] leaf, %d named: %v; failures %v (sink %d)", inVDSO, named, names, r.Failures, sink)
	if inVDSO == 0 {
		t.Fatal("no sample had its leaf in the vdso")
	}
	if named != inVDSO {
		t.Errorf("%d of %d [vdso] leaves named", named, inVDSO)
	}
}
