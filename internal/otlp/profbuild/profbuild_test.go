package profbuild

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/symbolize/kernel"
)

// fakeKernel names one kernel function.
type fakeKernel struct{}

const fakeKernelFunc = 0xffffffff81000000

func (fakeKernel) Lookup(addr uint64) (string, string, uint64, bool) {
	if addr >= fakeKernelFunc && addr < fakeKernelFunc+0x100 {
		return "do_syscall_64", "", fakeKernelFunc, true
	}
	return "", "", 0, false
}

func (fakeKernel) Info() (kernel.Info, error) {
	return kernel.Info{Release: "test", BuildID: "00112233"}, nil
}

//go:noinline
func selfStack() []uint64 {
	pcs := make([]uintptr, 16)
	n := runtime.Callers(1, pcs) // selfStack first: PCs after the first are return addresses
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(pcs[i])
	}
	return out
}

// selfBatch is a batch of this test process's own stack, so that building,
// conversion and symbolization run without eBPF.
func selfBatch() sampler.Batch {
	pcs := selfStack()
	now := time.Now().UnixNano()
	return sampler.Batch{Samples: []sampler.Sample{
		{
			Pid: uint32(os.Getpid()), Tid: 7, Comm: "worker", CPU: 1, UserPCs: pcs,
			KernelPCs: []uint64{fakeKernelFunc + 0x10, fakeKernelFunc + 0x20}, Count: 3, FirstNs: now, LastNs: now,
		},
		// Same stack, same thread and CPU: merged.
		{
			Pid: uint32(os.Getpid()), Tid: 7, Comm: "worker", CPU: 1, UserPCs: pcs,
			KernelPCs: []uint64{fakeKernelFunc + 0x10, fakeKernelFunc + 0x20}, Count: 2, FirstNs: now - 5, LastNs: now,
		},
		{Pid: uint32(os.Getpid()), Tid: 8, Comm: "other", CPU: 0, UserPCs: pcs, Count: 1, FirstNs: now, LastNs: now},
	}}
}

func buildSelf(t *testing.T, opt Options) Report {
	t.Helper()
	opt.Kernel = fakeKernel{}
	b := New(opt)
	return b.Build(selfBatch(), time.Now().Add(-time.Second), time.Now())
}

func TestBuildShape(t *testing.T) {
	r := buildSelf(t, Options{KernelSymbols: true, Logs: true, HostName: "h", KernelRelease: "6.18"})
	if r.Samples != 6 || r.Rows != 2 {
		t.Fatalf("samples %d rows %d, want 6 and 2 (two rows merged)", r.Samples, r.Rows)
	}
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	rp := r.Profiles.ResourceProfiles().At(0)
	for _, k := range []string{pframe.AttrPID, pframe.AttrExeName, pframe.AttrExePath, pframe.AttrHostName, pframe.AttrKernelRelease} {
		if _, ok := rp.Resource().Attributes().Get(k); !ok {
			t.Errorf("resource lacks %s: %v", k, rp.Resource().Attributes().AsRaw())
		}
	}
	p := rp.ScopeProfiles().At(0).Profiles().At(0)
	if v.str(p.SampleType().TypeStrindex()) != "samples" || v.str(p.PeriodType().UnitStrindex()) != "nanoseconds" || p.Period() != int64(time.Second)/99 {
		t.Errorf("sample/period type wrong")
	}
	s := v.samples(t, os.Getpid())
	first := s[0]
	if first.count != 5 || first.attrs[pframe.AttrThreadID] != int64(7) || first.attrs[pframe.AttrThreadName] != "worker" || first.attrs[pframe.AttrCPU] != int64(1) {
		t.Errorf("first sample %+v", first)
	}
	// Kernel leaf first, named, not adjusted; the caller adjusted by one.
	if fn := v.function(first.locs[0]); fn != "do_syscall_64" || first.locs[0].Address() != fakeKernelFunc+0x10 || first.locs[1].Address() != fakeKernelFunc+0x1f {
		t.Errorf("kernel frames %q %#x %#x", fn, first.locs[0].Address(), first.locs[1].Address())
	}
	if file, a := v.mapping(first.locs[0]); file != pframe.FileKernel || a[pframe.AttrBuildIDGNU] != "00112233" {
		t.Errorf("kernel mapping %q %v", file, a)
	}
	user := first.locs[2]
	if file, a := v.mapping(user); file != realPath(t, "/proc/self/exe") || a[pframe.AttrBuildIDGNU] == nil || a[pframe.AttrBuildIDHTL] == nil || a[pframe.AttrBuildIDGo] == nil {
		t.Errorf("user mapping %q %v", file, a)
	}
	if ft := v.attrs(user.AttributeIndices().AsRaw())[pframe.AttrFrameType]; ft != pframe.TypeNative {
		t.Errorf("user frame type %v", ft)
	}
	// Logs: one record per aggregated sample.
	if n := r.Logs.LogRecordCount(); n != 2 {
		t.Fatalf("%d log records, want 2", n)
	}
	lr := r.Logs.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(0)
	a := lr.Attributes().AsRaw()
	if a["eventType"] != "ebpf.CPUSample" || a["sampleWeight"] != int64(5) || a["topFunction"] != "do_syscall_64" || a["stackDepth"] != int64(len(first.locs)) {
		t.Errorf("log attributes %v", a)
	}
	var frames []map[string]any
	if err := json.Unmarshal([]byte(a["frames"].(string)), &frames); err != nil || len(frames) != len(first.locs) {
		t.Fatalf("frames %v: %v", a["frames"], err)
	}
	if frames[0]["frameType"] != "kernel" || frames[2]["buildId"] == nil {
		t.Errorf("frames %v", frames[:3])
	}
	if !strings.HasPrefix(lr.Body().Str(), "profbuild.test[") && !strings.Contains(lr.Body().Str(), "]: do_syscall_64") {
		t.Errorf("body %q", lr.Body().Str())
	}
}

func TestFilter(t *testing.T) {
	tg, err := CompileTarget(nil, "^nomatch$", "")
	if err != nil {
		t.Fatal(err)
	}
	r := buildSelf(t, Options{Filter: &Filter{Targets: []Target{tg}}})
	if r.Rows != 0 || r.Filtered != 6 {
		t.Fatalf("rows %d filtered %d, want 0 and 6", r.Rows, r.Filtered)
	}
	tg, _ = CompileTarget([]int{os.Getpid()}, "", "")
	if r := buildSelf(t, Options{Filter: &Filter{Targets: []Target{tg}}}); r.Rows != 2 {
		t.Fatalf("pid filter: rows %d", r.Rows)
	}
	tg, _ = CompileTarget(nil, "", "/")
	if r := buildSelf(t, Options{Filter: &Filter{Targets: []Target{tg}}}); r.Rows != 2 {
		t.Fatalf("cgroup prefix /: rows %d", r.Rows)
	}
}

// Symbolizing the built profile on the host names this test's functions,
// and the pprof conversion keeps them.
func TestSymbolizeAndPprof(t *testing.T) {
	r := buildSelf(t, Options{KernelSymbols: true})
	sym, err := otlpsym.New(otlpsym.Options{
		Demangle: true, Inlines: true, Lines: true,
		Locate: locate.Config{Order: []string{locate.SourceProc, locate.SourceLocal, locate.SourceDebugDirs}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sym.Close()
	st := sym.Profiles(context.Background(), r.Profiles)
	ok, failed := st.Resolved, st.Unresolved
	if ok == 0 {
		t.Fatalf("nothing resolved (%v failed)", failed)
	}
	pp, err := ToPprof(r.Profiles)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := pp.Write(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range back.Sample[0].Location {
		for _, ln := range l.Line {
			names = append(names, ln.Function.Name)
		}
	}
	chain := strings.Join(names, ";")
	for _, want := range []string{"do_syscall_64", "selfStack", "selfBatch", "buildSelf", "TestSymbolizeAndPprof"} {
		if !strings.Contains(chain, want) {
			t.Errorf("pprof stack %s lacks %s", chain, want)
		}
	}
	if back.Sample[0].NumLabel[pframe.AttrThreadID][0] != 7 || back.Sample[0].Label[pframe.AttrThreadName][0] != "worker" {
		t.Errorf("labels %v %v", back.Sample[0].Label, back.Sample[0].NumLabel)
	}
	if back.Sample[0].Value[0] != 5 || back.SampleType[0].Type != "cpu_samples" || back.DefaultSampleType != "cpu_samples" {
		t.Errorf("values %v types %v", back.Sample[0].Value, back.SampleType)
	}
	t.Logf("%d resolved, raw: %v; stack %s", ok, failed, chain)
}

func TestToPprofEmpty(t *testing.T) {
	if _, err := ToPprof(pprofile.NewProfiles()); err != nil {
		t.Fatal(err)
	}
}

// A PC the walker marked exact (the interrupted PC after a signal frame) is
// not stepped back into a call like a return address: its location is at
// the PC itself, and the same PC as a caller is one byte lower.
func TestExactUserPC(t *testing.T) {
	pcs := selfStack()
	now := time.Now().UnixNano()
	batch := sampler.Batch{Samples: []sampler.Sample{
		{Pid: uint32(os.Getpid()), Tid: 7, CPU: 1, UserPCs: pcs, UserExact: []uint8{2}, Count: 1, FirstNs: now, LastNs: now},
		{Pid: uint32(os.Getpid()), Tid: 8, CPU: 1, UserPCs: pcs, Count: 1, FirstNs: now, LastNs: now},
	}}
	r := New(Options{Kernel: fakeKernel{}}).Build(batch, time.Now().Add(-time.Second), time.Now())
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	s := v.samples(t, os.Getpid())
	if len(s) != 2 {
		t.Fatalf("%d samples", len(s))
	}
	exact, caller := s[0].locs[2].Address(), s[1].locs[2].Address()
	if s[0].attrs[pframe.AttrThreadID] != int64(7) {
		exact, caller = caller, exact
	}
	if exact != caller+1 {
		t.Errorf("the exact PC's location %#x, the same PC as a caller %#x: want one byte apart", exact, caller)
	}
	if a, b := s[0].locs[1].Address(), s[1].locs[1].Address(); a != b {
		t.Errorf("an unmarked caller moved: %#x vs %#x", a, b)
	}
}
