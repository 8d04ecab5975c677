package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/otlp/pdict"
)

// viewFixture writes a two-process profile: hot <- main (30 samples in pid
// 1), cold <- main (10 in pid 1), and an unsymbolized frame (5 in pid 2).
func viewFixture(t *testing.T) string {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	loc := func(name string) int32 {
		fn := d.Function(name, name, "x.c", 1)
		return d.Location(pdict.Location{Address: uint64(len(name)), Lines: []pdict.Line{{Function: fn, Line: 3}}})
	}
	hot, cold, mainLoc := loc("hot"), loc("cold"), loc("main")
	m := d.Mapping(pdict.Mapping{File: "/bin/raw"})
	raw := d.Location(pdict.Location{Mapping: m, Address: 0x1234})
	add := func(pid int64, stack []int32, v int64) {
		rp := pd.ResourceProfiles().AppendEmpty()
		rp.Resource().Attributes().PutInt("process.pid", pid)
		s := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples().AppendEmpty()
		s.SetStackIndex(d.Stack(stack))
		s.Values().Append(v)
	}
	add(1, []int32{hot, mainLoc}, 30)
	add(1, []int32{cold, mainLoc}, 10)
	add(2, []int32{raw}, 5)
	var m2 pprofile.JSONMarshaler
	b, err := m2.MarshalProfiles(pd)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "profiles.json")
	os.WriteFile(p, append(b, '\n'), 0o644)
	return p
}

func TestTop(t *testing.T) {
	in := viewFixture(t)
	var out, errb bytes.Buffer
	if code := run([]string{"top", in, "--n", "3"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "Samples: 45") || !strings.HasSuffix(lines[2], "hot") || !strings.HasSuffix(lines[3], "cold") {
		t.Fatalf("top output:\n%s", out.String())
	}
	out.Reset()
	run([]string{"top", in, "--by", "cumulative", "--pid", "1"}, nil, &out, &errb)
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "Samples: 40") || !strings.HasSuffix(lines[2], "main") || strings.Contains(out.String(), "0x1234") {
		t.Fatalf("cumulative, pid 1:\n%s", out.String())
	}
}

func TestConvert(t *testing.T) {
	in := viewFixture(t)
	outPath := filepath.Join(t.TempDir(), "out.pb.gz")
	var errb bytes.Buffer
	if code := run([]string{"convert", in, "--to", "pprof", "-o", outPath}, nil, &errb, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	f, err := os.Open(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range p.Sample {
		total += s.Value[0]
	}
	if total != 45 {
		t.Fatalf("pprof total %d, want 45", total)
	}
}

// TestTopGroupsRawFrames: frames nothing named count for their binary, one
// row per binary (as pprof shows "[liblzma.so.5.4.1]"), so a hot stripped
// library with its samples spread over many addresses leads the table.
func TestTopGroupsRawFrames(t *testing.T) {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	lzma := d.Mapping(pdict.Mapping{File: "/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1"})
	fn := d.Function("main", "main", "x.c", 1)
	named := d.Location(pdict.Location{Address: 1, Lines: []pdict.Line{{Function: fn, Line: 3}}})
	rp := pd.ResourceProfiles().AppendEmpty()
	p := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	for i := 0; i < 40; i++ { // 40 addresses, 2 samples each: 80 in liblzma
		raw := d.Location(pdict.Location{Mapping: lzma, Address: 0x1b000 + uint64(16*i)})
		s := p.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack([]int32{raw, named}))
		s.Values().Append(2)
	}
	s := p.Samples().AppendEmpty() // 10 in main itself
	s.SetStackIndex(d.Stack([]int32{named}))
	s.Values().Append(10)
	var m pprofile.JSONMarshaler
	b, _ := m.MarshalProfiles(pd)
	in := filepath.Join(t.TempDir(), "p.json")
	os.WriteFile(in, append(b, '\n'), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"top", in, "--n", "2"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.HasSuffix(lines[2], "liblzma.so.5.4.1 (no symbols)") || !strings.HasPrefix(strings.TrimSpace(lines[2]), "80 ") {
		t.Fatalf("top output:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "liblzma.so.5.4.1 (no symbols) <- main") {
		t.Fatalf("hottest stacks do not group the library:\n%s", out.String())
	}
}
