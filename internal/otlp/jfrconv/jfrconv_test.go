package jfrconv_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// frameView is one location as a test reads it.
type frameView struct {
	typ, name, file string
	line            int64
	addr            uint64
	buildID, base   string
	mapFile         string
}

// stacks returns every sample's frames (leaf first) of the profile whose
// period type is kind, with their values.
func stacks(pd pprofile.Profiles, kind string) ([][]frameView, []int64) {
	d := pdict.New(pd.Dictionary())
	dict := pd.Dictionary()
	var out [][]frameView
	var vals []int64
	for _, rp := range pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				if d.Str(p.PeriodType().TypeStrindex()) != kind {
					continue
				}
				for _, s := range p.Samples().All() {
					var fs []frameView
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						fv := frameView{addr: loc.Address()}
						if v, ok := d.FindAttr(loc.AttributeIndices(), frame.AttrFrameType); ok {
							fv.typ = v.Str()
						}
						if mi := loc.MappingIndex(); mi > 0 {
							m := dict.MappingTable().At(int(mi))
							fv.mapFile = d.Str(m.FilenameStrindex())
							if v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGNU); ok {
								fv.buildID = v.Str()
							}
							if v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrAddressBase); ok {
								fv.base = v.Str()
							}
						}
						if n := loc.Lines().Len(); n > 0 {
							ln := loc.Lines().At(0) // innermost
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							fv.name, fv.file, fv.line = d.Str(fn.NameStrindex()), d.Str(fn.FilenameStrindex()), ln.Line()
						}
						fs = append(fs, fv)
					}
					out = append(out, fs)
					vals = append(vals, s.Values().At(0))
				}
			}
		}
	}
	return out, vals
}

func TestConvertFrames(t *testing.T) {
	const id = "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b"
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.Library(jfrtest.Library{Name: "/opt/libx.so", BuildID: id})
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	display := jfrtest.Frame{Method: id + ".<remote>", Signature: "(0x2000)", Type: jfrtest.NativeRemote, BCI: -19, Modifiers: 0x100}
	bad := jfrtest.RemoteFrame("../../etc/passwd", 0x10)
	r.Sample(jfrtest.DatadogExecutionSample, 10, 1, 2, jfrtest.RemoteFrame(id, 0x1a2b), display, jfrtest.NativeFrame("JNI_Call"), java)
	r.Sample(jfrtest.DatadogExecutionSample, 20, 1, 1, bad, java)
	r.Sample(jfrtest.DatadogMethodSample, 30, 2, 5, java)
	r.Alloc(40, 2, "byte[]", 100, 3, java)
	pd, st, err := jfrconv.ConvertBytes(r.Bytes(), jfrconv.Options{Resource: map[string]any{"service.name": "svc"}})
	if err != nil {
		t.Fatal(err)
	}
	if pd.ResourceProfiles().Len() != 1 || pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().Len() != 3 {
		t.Fatalf("want one resource with cpu, wall and alloc profiles")
	}
	if v, _ := pd.ResourceProfiles().At(0).Resource().Attributes().Get("service.name"); v.Str() != "svc" {
		t.Errorf("service.name %q", v.Str())
	}
	cpu, vals := stacks(pd, "cpu")
	if len(cpu) != 2 {
		t.Fatalf("%d cpu samples", len(cpu))
	}
	s := cpu[0]
	if vals[0] != 2 {
		s, vals[0], vals[1] = cpu[1], vals[1], vals[0]
	}
	if vals[0] != 2 || vals[1] != 1 {
		t.Errorf("values %v", vals)
	}
	want := []frameView{
		{typ: "native", addr: 0x1a2b, buildID: id, base: "image", mapFile: "/opt/libx.so"}, // leaf: the PC itself
		{typ: "native", addr: 0x1fff, buildID: id, base: "image", mapFile: "/opt/libx.so"}, // caller: return address - 1
		{typ: "native", name: "JNI_Call"},
		{typ: "jvm", name: "com.example.App.run", line: 42},
	}
	if len(s) != len(want) {
		t.Fatalf("frames %+v", s)
	}
	for i := range want {
		if s[i] != want[i] {
			t.Errorf("frame %d: %+v, want %+v", i, s[i], want[i])
		}
	}
	if st.RemoteFrames != 2 || st.InvalidRemote != 1 {
		t.Errorf("stats %+v", st)
	}
	if wall, v := stacks(pd, "wall"); len(wall) != 1 || v[0] != 5 {
		t.Errorf("wall %v %v", wall, v)
	}
	if alloc, v := stacks(pd, "space"); len(alloc) != 1 || v[0] != 300 {
		t.Errorf("alloc %v %v", alloc, v)
	}
}

// The Datadog profiler's context attributes become sample attributes, and
// samples that differ only in them stay apart.
func TestContextAttributes(t *testing.T) {
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.ContextAttributes = []string{"http.route", "tenant"}
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	r.SampleWith(jfrtest.DatadogExecutionSample, 10, 1, 1, map[string]string{"http.route": "/cart"}, java)
	r.SampleWith(jfrtest.DatadogExecutionSample, 20, 1, 1, map[string]string{"http.route": "/cart"}, java)
	r.SampleWith(jfrtest.DatadogExecutionSample, 30, 1, 1, map[string]string{"http.route": "/pay", "tenant": "acme"}, java)
	r.Sample(jfrtest.DatadogExecutionSample, 40, 1, 1, java)
	pd, _, err := jfrconv.ConvertBytes(r.Bytes(), jfrconv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := pdict.New(pd.Dictionary())
	got := map[string]int64{}
	for _, s := range pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0).Samples().All() {
		var kv []string
		for _, ai := range s.AttributeIndices().All() {
			k, v, _ := d.Attr(ai)
			if !strings.HasPrefix(k, "thread.") {
				kv = append(kv, k+"="+v.AsString())
			}
		}
		got[strings.Join(kv, ",")] += s.Values().At(0)
	}
	want := map[string]int64{"http.route=/cart": 2, "http.route=/pay,tenant=acme": 1, "": 1}
	if len(got) != len(want) {
		t.Fatalf("samples by attributes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("samples by attributes %v, want %v", got, want)
		}
	}
}

// Remote frames from a real process, through a shared library, a library
// whose .text is linked far from its file offset, and a non-PIE
// executable, all stripped: after symbolization every frame has the
// function, file and line llvm-symbolizer-19 gives for the same address.
func TestRemoteFramesSymbolized(t *testing.T) {
	fx := jfrtest.BuildRemoteFixture(t)
	dbg := fx.DebugDir(t)
	// The processor on the host (stripped files where the recording says,
	// debug files by build id), and on a gateway with debug files only.
	for _, sources := range [][]string{{locate.SourceLocal, locate.SourceDebugDirs}, {locate.SourceDebugDirs}} {
		t.Run(strings.Join(sources, "+"), func(t *testing.T) { remoteSymbolized(t, fx, dbg, sources) })
	}
}

func remoteSymbolized(t *testing.T, fx *jfrtest.RemoteFixture, dbg string, sources []string) {
	pd, st, err := jfrconv.ConvertBytes(fx.Recording(1_700_000_000_000_000_000, 3, 4).Bytes(), jfrconv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.RemoteFrames == 0 {
		t.Fatal("no remote frames")
	}
	// The processor's symbolizer, with only a debug directory: the stripped
	// files are where the recording says, the debug files by build id.
	sym, err := otlpsym.New(otlpsym.Options{Locate: locate.Config{Order: sources, DebugDirs: []string{dbg}}, Demangle: true, Inlines: true, Lines: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sym.Close()
	res := sym.Profiles(context.Background(), pd)
	// Eight frames, seven locations: both stacks return into exe_call at
	// the same place.
	if len(res.Unresolved) > 0 || res.Resolved != 7 {
		t.Errorf("resolved %d, unresolved %v", res.Resolved, res.Unresolved)
	}
	got, _ := stacks(pd, "cpu")
	if len(got) != len(fx.Stacks) {
		t.Fatalf("%d samples, want %d", len(got), len(fx.Stacks))
	}
	byObj := map[*jfrtest.RemoteObject][]uint64{}
	for _, st := range fx.Stacks {
		for _, f := range st {
			byObj[f.Obj] = append(byObj[f.Obj], f.ELFAddr)
		}
	}
	truth := map[uint64]testfixture.LLVMFrame{}
	for o, addrs := range byObj {
		for i, fr := range testfixture.LLVMSymbolize(t, o.Unstrip, addrs) {
			truth[addrs[i]<<8|uint64(len(o.Name))] = fr[0]
		}
	}
	checked := 0
	for _, fs := range got {
		// Which fixture stack is this: match by the leaf's function and
		// the mapping's file.
		var want []jfrtest.RemoteFrameInfo
		for _, st := range fx.Stacks {
			if fs[0].mapFile == st[0].Obj.Path {
				want = st
			}
		}
		if want == nil {
			t.Fatalf("sample %+v matches no fixture stack", fs)
		}
		for i, w := range want {
			g := fs[i]
			llvm := truth[w.ELFAddr<<8|uint64(len(w.Obj.Name))]
			if g.name == "" || g.name != llvm.FunctionName || filepath.Base(g.file) != filepath.Base(llvm.FileName) || g.line != int64(llvm.Line) {
				t.Errorf("%s frame %d (offset %#x, ELF %#x): got %s %s:%d, llvm-symbolizer %s %s:%d",
					w.Obj.Name, i, w.Offset, w.ELFAddr, g.name, g.file, g.line, llvm.FunctionName, llvm.FileName, llvm.Line)
			}
			checked++
		}
		if n := len(fs); fs[n-1].name != "com.example.Main.main" || fs[n-2].name != "com.example.Native.call" {
			t.Errorf("java frames %+v", fs[n-2:])
		}
	}
	if checked != 8 {
		t.Errorf("checked %d frames", checked)
	}
	// The non-PIE executable's frames really needed the image base: its
	// offset is not its ELF address.
	exe := fx.Stacks[0][3]
	if exe.Offset == exe.ELFAddr+1 || !strings.HasPrefix(llvmName(truth, exe), "exe_call") {
		t.Errorf("exe frame: offset %#x, ELF %#x, %q", exe.Offset, exe.ELFAddr, llvmName(truth, exe))
	}
}

func llvmName(truth map[uint64]testfixture.LLVMFrame, f jfrtest.RemoteFrameInfo) string {
	return truth[f.ELFAddr<<8|uint64(len(f.Obj.Name))].FunctionName
}
