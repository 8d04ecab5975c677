package otlpsym

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/testfixture"
)

var cSources = []string{"engine/c/main.c", "engine/c/hash.c", "engine/c/sort.c"}

func fixture(t *testing.T, name string, args ...string) string {
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: cSources, Args: append([]string{"-O2", "-g"}, args...)})
}

// inside returns an address in the middle of function name.
func inside(t *testing.T, path, name string) uint64 {
	start, size := testfixture.Func(t, path, name)
	return start + size/2
}

type fileIDs struct{ gnu, htl string }

func idsOf(t *testing.T, path string) fileIDs {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out fileIDs
	if b, err := buildid.GNU(f); err == nil {
		out.gnu = buildid.HexString(b)
	}
	out.htl, _ = buildid.HTLHashOf(f)
	return out
}

type rawFrame struct {
	file  string
	ids   fileIDs
	addr  uint64
	ftype string
}

// rawProfile builds a profile in the frame format: one sample whose stack is
// frames (leaf first), each a raw location in its own file's mapping.
func rawProfile(frames ...rawFrame) (pprofile.Profiles, []int32) {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	var locs []int32
	for _, f := range frames {
		var attrs []int32
		if f.ids.gnu != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDGNU, f.ids.gnu))
		}
		if f.ids.htl != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDHTL, f.ids.htl))
		}
		mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x100000, File: f.file, Attrs: attrs})
		ft := f.ftype
		if ft == "" {
			ft = frame.TypeNative
		}
		locs = append(locs, d.Location(pdict.Location{Mapping: mi, Address: f.addr, Attrs: []int32{d.AttrStr(frame.AttrFrameType, ft)}}))
	}
	rp := pd.ResourceProfiles().AppendEmpty()
	p := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	s := p.Samples().AppendEmpty()
	s.SetStackIndex(d.Stack(locs))
	s.Values().Append(7)
	return pd, locs
}

// names returns the function names of a location's lines, innermost first.
func names(pd pprofile.Profiles, loc int32) []string {
	d := pd.Dictionary()
	l := d.LocationTable().At(int(loc))
	var out []string
	for _, ln := range l.Lines().All() {
		fn := d.FunctionTable().At(int(ln.FunctionIndex()))
		out = append(out, d.StringTable().At(int(fn.NameStrindex())))
	}
	return out
}

func reasonOf(pd pprofile.Profiles, loc int32) string {
	d := pdict.New(pd.Dictionary())
	v, ok := d.FindAttr(pd.Dictionary().LocationTable().At(int(loc)).AttributeIndices(), frame.AttrError)
	if !ok {
		return ""
	}
	return v.Str()
}

// engineNames is the ground truth: the engine on the unstripped binary.
func engineNames(t *testing.T, path string, addr uint64) []string {
	r := symbolize.New(symbolize.DefaultOptions())
	defer r.Close()
	res := r.Symbolize(context.Background(), path, "", []uint64{addr})
	var out []string
	for _, f := range res[0].Frames {
		out = append(out, f.Function)
	}
	if len(out) == 0 {
		t.Fatalf("engine cannot resolve %#x in %s: %v", addr, path, res[0].Err)
	}
	return out
}

func defaults() Options {
	return Options{Demangle: true, Inlines: true, Lines: true}
}

// newSym builds a Symbolizer or fails the test.
func newSym(t testing.TB, opt Options) *Symbolizer {
	t.Helper()
	s, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func checkSamples(t *testing.T, pd pprofile.Profiles) {
	t.Helper()
	s := pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0).Samples()
	if s.Len() != 1 || s.At(0).Values().At(0) != 7 {
		t.Fatalf("samples changed: %d samples", s.Len())
	}
}

func TestLocalBinary(t *testing.T) {
	bin := fixture(t, "otlpsym-local")
	hot, hash := inside(t, bin, "hot"), inside(t, bin, "hash_bytes")
	pd, locs := rawProfile(rawFrame{bin, idsOf(t, bin), hot, ""}, rawFrame{bin, idsOf(t, bin), hash, ""})
	s := newSym(t, defaults())
	st := s.Profiles(context.Background(), pd)
	if st.Resolved != 2 {
		t.Fatalf("resolved %d, want 2 (stats %+v)", st.Resolved, st)
	}
	for i, a := range []uint64{hot, hash} {
		if got, want := names(pd, locs[i]), engineNames(t, bin, a); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("location %d: %v, want %v", i, got, want)
		}
	}
	checkSamples(t, pd)
	m := pd.Dictionary().MappingTable().At(1)
	d := pdict.New(pd.Dictionary())
	for _, k := range []string{frame.AttrHasFunctions, frame.AttrHasFilenames, frame.AttrHasLineNumbers} {
		if v, ok := d.FindAttr(m.AttributeIndices(), k); !ok || !v.Bool() {
			t.Errorf("mapping lacks %s=true", k)
		}
	}
	// The same batch again is answered from the result cache.
	pd2, _ := rawProfile(rawFrame{bin, idsOf(t, bin), hot, ""})
	if st := s.Profiles(context.Background(), pd2); st.CacheHits != 1 || st.Resolved != 1 {
		t.Errorf("second batch: %+v", st)
	}
}

// A stripped binary on the host is paired with its debug file found by
// build id; by build id alone (the process's file gone), the debug file
// suffices.
func TestStrippedWithDebugDir(t *testing.T) {
	bin := fixture(t, "otlpsym-split", "-Wl,--build-id")
	stripped, debug := testfixture.SplitDebug(t, bin, false)
	ids := idsOf(t, stripped)
	dir := t.TempDir()
	p := filepath.Join(dir, ".build-id", ids.gnu[:2], ids.gnu[2:]+".debug")
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.Rename(debug, p); err != nil {
		t.Fatal(err)
	}
	hot := inside(t, bin, "hot")
	want := engineNames(t, bin, hot)
	for _, file := range []string{stripped, "/gone/away/binary"} {
		pd, locs := rawProfile(rawFrame{file, ids, hot, ""})
		opt := defaults()
		opt.Locate.DebugDirs = []string{dir}
		s := newSym(t, opt)
		s.Profiles(context.Background(), pd)

		if got := names(pd, locs[0]); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v (reason %q)", file, got, want, reasonOf(pd, locs[0]))
		}
	}
}

// Unresolvable frames keep their address and say why; samples flow on.
func TestReasons(t *testing.T) {
	bin := fixture(t, "otlpsym-reasons")
	other := fixture(t, "otlpsym-other", "-DOTHER=1", "-O1")
	hot := inside(t, bin, "hot")
	ids := idsOf(t, bin)
	cases := []struct {
		name   string
		frame  rawFrame
		reason string
	}{
		{"unknown build id", rawFrame{"/nonexistent", fileIDs{gnu: "0123456789abcdef0123456789abcdef01234567"}, 0x1234, ""}, "no_debug_info"},
		{"local file is another build", rawFrame{other, ids, hot, ""}, "build_id_mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pd, locs := rawProfile(tc.frame)
			s := newSym(t, Options{Inlines: true, Lines: true, Locate: locate.Config{Order: []string{locate.SourceLocal, locate.SourceDebugDirs}, DebugDirs: []string{t.TempDir()}}})
			st := s.Profiles(context.Background(), pd)
			if got := reasonOf(pd, locs[0]); got != tc.reason {
				t.Errorf("reason %q, want %q (stats %+v)", got, tc.reason, st)
			}
			if l := pd.Dictionary().LocationTable().At(int(locs[0])); l.Address() != tc.frame.addr || l.Lines().Len() != 0 {
				t.Errorf("raw frame changed: address %#x lines %d", l.Address(), l.Lines().Len())
			}
			checkSamples(t, pd)
		})
	}
}

// Profiles shaped like the upstream OpenTelemetry eBPF profiler's: a binary
// without GNU build id is known by its htlhash only; frames of other types
// (already named by the profiler) pass through.
func TestUpstreamShape(t *testing.T) {
	bin := fixture(t, "otlpsym-nobuildid", "-Wl,--build-id=none")
	ids := idsOf(t, bin)
	if ids.gnu != "" {
		t.Fatalf("fixture has a build id %s", ids.gnu)
	}
	hot := inside(t, bin, "hot")
	pd, locs := rawProfile(rawFrame{bin, fileIDs{htl: ids.htl}, hot, ""}, rawFrame{bin, fileIDs{htl: ids.htl}, hot + 1, "kernel"})
	s := newSym(t, defaults())
	st := s.Profiles(context.Background(), pd)
	if got, want := names(pd, locs[0]), engineNames(t, bin, hot); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("htlhash frame: %v, want %v (stats %+v)", got, want, st)
	}
	if n := len(names(pd, locs[1])); n != 0 || st.Skipped != 1 {
		t.Errorf("kernel frame was touched: %d lines, skipped %d", n, st.Skipped)
	}
}

// A Datadog-style remote frame: "<remote>", build id as system name, offset
// from the image base as file name.
func TestRemoteFrame(t *testing.T) {
	bin := fixture(t, "otlpsym-remote", "-Wl,--build-id")
	ids := idsOf(t, bin)
	dir := t.TempDir()
	p := filepath.Join(dir, ".build-id", ids.gnu[:2], ids.gnu[2:]+".debug")
	os.MkdirAll(filepath.Dir(p), 0o755)
	data, _ := os.ReadFile(bin)
	os.WriteFile(p, data, 0o644)
	hot := inside(t, bin, "hot")

	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	fn := d.Function(remoteMethod, ids.gnu, fmt.Sprintf("0x%x", hot), 0) // PIE: base 0
	loc := d.Location(pdict.Location{Lines: []pdict.Line{{Function: fn}}})
	opt := defaults()
	opt.Locate.DebugDirs = []string{dir}
	s := newSym(t, opt)
	st := s.Profiles(context.Background(), pd)
	if got, want := names(pd, loc), engineNames(t, bin, hot); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("remote frame: %v, want %v (stats %+v)", got, want, st)
	}
}

// ProfileEvent logs get topFunction, stackPath and stackTrace.
func TestLogs(t *testing.T) {
	bin := fixture(t, "otlpsym-logs")
	ids := idsOf(t, bin)
	hot, main := inside(t, bin, "hot"), inside(t, bin, "main")
	frames, _ := json.Marshal([]LogFrame{
		{BuildID: ids.gnu, Address: hot, File: bin, FrameType: "native"},
		{BuildID: ids.gnu, Address: main, File: bin, FrameType: "native"},
		{Address: 0xffffffff81000000, FrameType: "kernel", Function: "do_syscall_64"},
	})
	ld := plog.NewLogs()
	lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	lr.Attributes().PutStr("frames", string(frames))
	lr.Attributes().PutStr("comm", "fixture")
	s := newSym(t, defaults())
	s.Logs(context.Background(), ld)
	a := lr.Attributes()
	top, _ := a.Get(LogAttrTopFunction)
	path, _ := a.Get(LogAttrStackPath)
	trace, _ := a.Get(LogAttrStackTrace)
	if top.Str() != engineNames(t, bin, hot)[0] {
		t.Errorf("topFunction %q", top.Str())
	}
	var tf []TraceFrame
	if err := json.Unmarshal([]byte(trace.Str()), &tf); err != nil || len(tf) < 3 {
		t.Fatalf("stackTrace %q: %v", trace.Str(), err)
	}
	if last := tf[len(tf)-1]; last.Function != "do_syscall_64" || tf[0].File == "" || tf[0].Line == 0 {
		t.Errorf("stackTrace %+v", tf)
	}
	t.Logf("stackPath: %s", path.Str())
	_ = hex.EncodeToString
}

func FuzzParseLogFrames(f *testing.F) {
	f.Add(`[{"buildId":"ab","address":1,"frameType":"native"}]`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, s string) { ParseLogFrames(s, DefaultMaxFramesJSON, DefaultMaxLogFrames) })
}

// A raw kernel frame (the agent ran with kernel_symbols off): the mapping
// carries the vmlinux build id and the run-time _stext; the address is a
// run-time one. A binary with an _stext symbol stands in for vmlinux.
func TestKernelSource(t *testing.T) {
	vmlinux := testfixture.Build(t, testfixture.Spec{Name: "fake-vmlinux", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id", "-DKERNEL_LIKE"}})
	id := testfixture.BuildID(t, vmlinux)
	dir := t.TempDir()
	p := filepath.Join(dir, ".build-id", id[:2], id[2:]+".debug")
	os.MkdirAll(filepath.Dir(p), 0o755)
	data, _ := os.ReadFile(vmlinux)
	os.WriteFile(p, data, 0o644)
	stext, _ := testfixture.Func(t, vmlinux, "_stext")
	hot := inside(t, vmlinux, "hot")
	const runStext = 0xffffffff9a000000 // KASLR moved it here
	addr := runStext + (hot - stext)

	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	mi := d.Mapping(pdict.Mapping{Start: runStext, Limit: runStext + 0x1000000, File: "[kernel.kallsyms]",
		Attrs: []int32{d.AttrStr(frame.AttrBuildIDGNU, id)}})
	loc := d.Location(pdict.Location{Mapping: mi, Address: addr, Attrs: []int32{d.AttrStr(frame.AttrFrameType, frame.TypeKernel)}})
	opt := defaults()
	opt.Locate.DebugDirs = []string{dir}
	s := newSym(t, opt)
	st := s.Profiles(context.Background(), pd)
	if got := names(pd, loc); len(got) == 0 || got[len(got)-1] != "hot" {
		t.Fatalf("kernel frame: %v (stats %+v, reason %q)", got, st, reasonOf(pd, loc))
	}
	// Without the kernel source the frame passes through.
	pd2 := pprofile.NewProfiles()
	d2 := pdict.New(pd2.Dictionary())
	mi2 := d2.Mapping(pdict.Mapping{Start: runStext, File: "[kernel.kallsyms]", Attrs: []int32{d2.AttrStr(frame.AttrBuildIDGNU, id)}})
	loc2 := d2.Location(pdict.Location{Mapping: mi2, Address: addr, Attrs: []int32{d2.AttrStr(frame.AttrFrameType, frame.TypeKernel)}})
	opt.Locate.Order = []string{locate.SourceDebugDirs}
	s2 := newSym(t, opt)
	if st := s2.Profiles(context.Background(), pd2); st.Skipped != 1 || len(names(pd2, loc2)) != 0 {
		t.Errorf("kernel source off: %+v", st)
	}
}
