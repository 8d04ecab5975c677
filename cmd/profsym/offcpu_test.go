package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// offCPUFixture writes one process's CPU profile (hot <- main, 30 samples)
// and off_cpu profile (futex_wait <- lock <- main 1.5 s, reason futex;
// read <- main 0.5 s, reason pipe), as the receiver builds them.
func offCPUFixture(t *testing.T) string {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	loc := func(name string) int32 {
		fn := d.Function(name, name, "x.c", 1)
		return d.Location(pdict.Location{Address: uint64(len(name)), Lines: []pdict.Line{{Function: fn, Line: 3}}})
	}
	hot, mainLoc, lock, futex, read := loc("hot"), loc("main"), loc("lock"), loc("futex_wait"), loc("read")
	rp := pd.ResourceProfiles().AppendEmpty()
	rp.Resource().Attributes().PutInt(pframe.AttrPID, 7)
	sp := rp.ScopeProfiles().AppendEmpty()
	typed := func(typ, unit string) pprofile.Profile {
		p := sp.Profiles().AppendEmpty()
		p.SampleType().SetTypeStrindex(d.String(typ))
		p.SampleType().SetUnitStrindex(d.String(unit))
		p.PeriodType().SetTypeStrindex(d.String(typ))
		p.PeriodType().SetUnitStrindex(d.String(unit))
		return p
	}
	cpu := typed("samples", "count")
	cpu.PeriodType().SetTypeStrindex(d.String("cpu"))
	s := cpu.Samples().AppendEmpty()
	s.SetStackIndex(d.Stack([]int32{hot, mainLoc}))
	s.Values().Append(30)
	off := typed(profbuild.TypeOffCPU, profbuild.UnitNanos)
	for _, x := range []struct {
		stack  []int32
		ns     int64
		reason string
	}{{[]int32{futex, lock, mainLoc}, 1500e6, "futex"}, {[]int32{read, mainLoc}, 500e6, "pipe"}} {
		s := off.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack(x.stack))
		s.Values().Append(x.ns)
		s.AttributeIndices().Append(d.AttrStr(pframe.AttrOffCPUReason, x.reason))
	}
	var m pprofile.JSONMarshaler
	b, err := m.MarshalProfiles(pd)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "profiles.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// top shows off_cpu profiles in time, filters on the reason, and convert
// keeps the CPU and off-CPU values apart in one pprof profile.
func TestTopAndConvertOffCPU(t *testing.T) {
	in := offCPUFixture(t)
	var out, errb bytes.Buffer
	if code := run([]string{"top", in}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "Samples: 30 (cpu)") {
		t.Fatalf("default type: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"top", in, "--type", "off_cpu"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(lines[0], "Total: 2s (off_cpu)") || !strings.Contains(lines[2], "1.5s") || !strings.HasSuffix(lines[2], "futex_wait") {
		t.Fatalf("top --type off_cpu:\n%s", out.String())
	}
	out.Reset()
	run([]string{"top", in, "--type", "off_cpu", "--tag", "profsym.off_cpu.reason=pipe"}, nil, &out, &errb)
	if !strings.HasPrefix(out.String(), "Total: 500ms") || strings.Contains(out.String(), "futex_wait") {
		t.Fatalf("top --tag reason=pipe:\n%s", out.String())
	}
	if code := run([]string{"top", in, "--tag", "noequals"}, nil, &out, &errb); code != 2 {
		t.Fatalf("--tag without =: exit %d", code)
	}

	pb := filepath.Join(t.TempDir(), "out.pb.gz")
	if code := run([]string{"convert", in, "--to", "pprof", "-o", pb}, nil, &errb, &errb); code != 0 {
		t.Fatalf("convert: exit %d: %s", code, errb.String())
	}
	f, err := os.Open(pb)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	idx := map[string]int{}
	for i, st := range p.SampleType {
		idx[st.Type+"/"+st.Unit] = i
	}
	oi, ok := idx["off_cpu/nanoseconds"]
	if !ok {
		t.Fatalf("pprof sample types %v lack off_cpu/nanoseconds", p.SampleType)
	}
	var cpu, offNs int64
	reasons := map[string]int64{}
	for _, s := range p.Sample {
		cpu += s.Value[idx["samples/count"]]
		offNs += s.Value[oi]
		if r := s.Label[pframe.AttrOffCPUReason]; len(r) == 1 {
			reasons[r[0]] += s.Value[oi]
		}
	}
	if cpu != 30 || offNs != 2e9 || reasons["futex"] != 1500e6 {
		t.Fatalf("pprof: cpu %d, off_cpu %d ns, by reason %v", cpu, offNs, reasons)
	}
}

// record --off-cpu on a process that sleeps 10 ms at a time: an off_cpu
// profile whose time is the fixture's own, in nanosleep, reason sleep, and
// a wall profile with --wall; `top --type off_cpu` reads it.
func TestRecordOffCPU(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	built := testfixture.Build(t, testfixture.Spec{Name: "offcpu-wait", Lang: "c", Sources: []string{"offcpu/wait.c"},
		Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-pthread"}})
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("off%08x", rand.Uint32())
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	fixture := exec.Command(bin, "sleep", "4")
	var truth bytes.Buffer
	fixture.Stdout = &truth
	if err := fixture.Start(); err != nil {
		t.Fatal(err)
	}
	defer fixture.Wait()
	out := filepath.Join(t.TempDir(), "profile.json")
	var stderr bytes.Buffer
	start := time.Now()
	if code := runRecord([]string{"--duration", "2s", "--comm", "^" + name + "$", "--off-cpu", "--wall",
		"--output", out}, nil, nil, &stderr); code != 0 {
		t.Fatalf("record: exit %d: %s", code, stderr.String())
	}
	recorded := time.Since(start)
	t.Log(strings.TrimSpace(stderr.String()))
	var top bytes.Buffer
	if code := run([]string{"top", out, "--type", "off_cpu", "--tag", "profsym.off_cpu.reason=sleep"}, nil, &top, &stderr); code != 0 {
		t.Fatalf("top: exit %d: %s", code, stderr.String())
	}
	t.Logf("top --type off_cpu:\n%s", firstLines(top.String(), 8))
	f := strings.Fields(top.String())
	if len(f) < 2 || f[0] != "Total:" {
		t.Fatalf("top header %q", firstLines(top.String(), 1))
	}
	total, err := time.ParseDuration(f[1])
	if err != nil {
		t.Fatalf("top header %q: %v", firstLines(top.String(), 1), err)
	}
	// The fixture slept the whole time the sampler ran (it runs 4 s, the
	// recording 2 s of them): its off-CPU time is the recording's length,
	// less its short runs between sleeps.
	if total < time.Duration(0.8*float64(2*time.Second)) || total > recorded {
		t.Errorf("off-CPU time in sleep %v, recording lasted %v", total, recorded)
	}
	var wall bytes.Buffer
	if code := run([]string{"top", out, "--type", "wall"}, nil, &wall, &stderr); code != 0 || !strings.HasPrefix(wall.String(), "Total: ") {
		t.Fatalf("top --type wall: exit %d\n%s", code, wall.String())
	}
}
