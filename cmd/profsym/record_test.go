package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

func TestRecordFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--output", "x", "--format", "svg"},
		{"--output", "x", "--pid", "abc"},
		{"--output", "x", "--comm", "("},
		{"--output", "x", "--sample-rate", "0"},
		{"--output", "x", "extra"},
		{"--output", "x", "--unwinding", "dwarf"},
		{"--output", "x", "--wall"},
		{"--output", "x", "--off-cpu", "--off-cpu-probability", "2"},
		{"--output", "x", "--off-cpu", "--off-cpu-min-wait", "-1s"},
		{"--output", "x", "--off-cpu", "--unwinding", "frame_pointers"},
	} {
		var stderr bytes.Buffer
		if code := runRecord(args, nil, nil, &stderr); code != 2 {
			t.Errorf("record %q: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

// recordFixture records the C fixture's hot loop with the given format.
// Other tests run the same fixture at the same time, so this one runs a
// copy under a name of its own (its comm) and selects it by that name.
func recordFixture(t *testing.T, format string, extra ...string) (string, int) {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	built := testfixture.Build(t, testfixture.Spec{Name: "sampler-hot", Lang: "c",
		Sources: []string{"sampler/hot.c"}, Args: []string{"-O1", "-g", "-fno-omit-frame-pointer"}})
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("rec%08x", rand.Uint32()) // within comm's 15 bytes
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	fixture := exec.Command(bin, "3")
	if err := fixture.Start(); err != nil {
		t.Fatal(err)
	}
	defer fixture.Wait()
	out := filepath.Join(t.TempDir(), "profile."+format)
	args := append([]string{"--duration", "2s", "--comm", "^" + name + "$", "--output", out, "--format", format}, extra...)
	var stderr bytes.Buffer
	if code := runRecord(args, nil, nil, &stderr); code != 0 {
		t.Fatalf("record: exit %d: %s", code, stderr.String())
	}
	t.Log(strings.TrimSpace(stderr.String()))
	return out, fixture.Process.Pid
}

func TestRecordOTLPJSON(t *testing.T) {
	out, pid := recordFixture(t, "otlp-json")
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles(b)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, rp := range pd.ResourceProfiles().All() {
		v, _ := rp.Resource().Attributes().Get(pframe.AttrPID)
		if v.Int() == int64(pid) {
			found = true
		} else {
			t.Errorf("pid %d recorded although --comm selects only the fixture", v.Int())
		}
	}
	if !found {
		t.Fatalf("fixture pid %d not in the profile", pid)
	}
}

// go tool pprof must open the file, and with --symbolize show the hot
// function and its callers by name.
func TestRecordPprofSymbolized(t *testing.T) {
	gotool := testfixture.NeedTool(t, "go")
	out, _ := recordFixture(t, "pprof", "--symbolize")
	top, err := exec.Command(gotool, "tool", "pprof", "-top", out).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof -top: %v\n%s", err, top)
	}
	traces, err := exec.Command(gotool, "tool", "pprof", "-traces", out).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof -traces: %v\n%s", err, traces)
	}
	t.Logf("pprof -top:\n%s", firstLines(string(top), 12))
	// No "middle": hot is a leaf without a frame of its own at -O1, so a
	// frame-pointer walk goes from hot straight to middle's caller.
	for _, want := range []string{"hot", "outer", "main"} {
		if !strings.Contains(string(traces), want) {
			t.Errorf("pprof -traces lacks %s", want)
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// TestRecordSourcesDebuginfod: with DEBUGINFOD_URLS set, as Debian and
// Fedora hosts set it, record --symbolize asks those servers too, and a
// frame of a binary only a server has is named.
func TestRecordSourcesDebuginfod(t *testing.T) {
	if lc, c, err := recordSources(""); err != nil || c != nil || slices.Contains(lc.Order, locate.SourceDebuginfod) {
		t.Fatalf("DEBUGINFOD_URLS unset: %v %v %v", lc.Order, c, err)
	}
	bin := testfixture.Build(t, testfixture.Spec{Name: "record-debuginfod", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=recorddebuginfod"}})
	id := testfixture.BuildID(t, bin)
	served := t.TempDir()
	b, _ := os.ReadFile(bin)
	os.WriteFile(filepath.Join(served, "hot"), b, 0o755)
	srv := testfixture.StartDebuginfod(t, served, id+"/debuginfo")
	defer srv.Stop()
	lc, client, err := recordSources(srv.URL)
	if err != nil || client == nil || !slices.Contains(lc.Order, locate.SourceDebuginfod) {
		t.Fatalf("DEBUGINFOD_URLS=%s: %v %v", srv.URL, lc.Order, err)
	}
	defer client.Close()
	sym, err := otlpsym.New(otlpsym.Options{Demangle: true, Inlines: true, Lines: true, Locate: lc, FetchWait: otlpsym.DefaultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer sym.Close()
	start, size := testfixture.Func(t, bin, "main")
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	m := d.Mapping(pdict.Mapping{File: "/gone/hot", Attrs: []int32{d.AttrStr(pframe.AttrBuildIDGNU, id)}})
	loc := d.Location(pdict.Location{Mapping: m, Address: start + size/2, Attrs: []int32{d.AttrStr(pframe.AttrFrameType, pframe.TypeNative)}})
	s := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples().AppendEmpty()
	s.SetStackIndex(d.Stack([]int32{loc}))
	s.Values().Append(1)
	if st := sym.Profiles(context.Background(), pd); st.Resolved != 1 {
		t.Fatalf("the frame of a binary only the server has: %+v", st)
	}
}
