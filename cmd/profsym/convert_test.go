package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/testfixture"
)

// docsPprofTypes reads the pprof sample type of each JFR profile from the
// Output table of docs/jfr.md (profile -> type), so the docs and the
// converter cannot drift apart.
func docsPprofTypes(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "docs", "jfr.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| profile | sample type | period type | pprof sample type |")
	if !ok {
		t.Fatal("docs/jfr.md has no Output table with a pprof sample type column")
	}
	types := map[string]string{}
	row := regexp.MustCompile("^\\| (\\w+) \\|[^|]+\\|[^|]+\\| `(\\w+)` \\|$")
	for _, line := range strings.Split(table, "\n")[2:] {
		m := row.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			break
		}
		types[m[1]] = m[2]
	}
	if len(types) == 0 {
		t.Fatal("no rows in docs/jfr.md's Output table")
	}
	return types
}

func readPprof(t *testing.T, path string) *profile.Profile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sums(p *profile.Profile) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Sample {
		for i, v := range s.Value {
			out[p.SampleType[i].Type] += v
		}
	}
	return out
}

// A recording with cpu, wall and allocation samples converts to pprof with
// the sample types docs/jfr.md names, opening on CPU, and convert reports
// the events each type holds, not the number of distinct stacks.
func TestConvertJFRSampleTypes(t *testing.T) {
	want := docsPprofTypes(t)
	rec := jfrtest.New(1_700_000_000_000_000_000)
	run1 := jfrtest.JavaFrame("com/example/App", "run", 10)
	rec.Sample(jfrtest.DatadogExecutionSample, 10, 1, 300, jfrtest.JavaFrame("com/example/App", "spin", 20), run1)
	rec.Sample(jfrtest.DatadogExecutionSample, 20, 2, 400, jfrtest.JavaFrame("com/example/App", "hash", 30), run1)
	rec.Sample(jfrtest.DatadogMethodSample, 30, 1, 50, jfrtest.JavaFrame("com/example/App", "sleep", 40), run1)
	rec.Alloc(40, 1, "byte[]", 1024, 8, jfrtest.JavaFrame("com/example/App", "alloc", 50), run1)
	dir := t.TempDir()
	in := filepath.Join(dir, "app.jfr")
	if err := os.WriteFile(in, rec.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "app.pb.gz")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"convert", in, "--to", "pprof", "-o", out}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	p := readPprof(t, out)
	var got []string
	for _, st := range p.SampleType {
		got = append(got, st.Type)
	}
	for _, prof := range []string{"cpu", "wall", "alloc"} {
		if !slices.Contains(got, want[prof]) {
			t.Errorf("pprof sample types %v lack %s's %q (docs/jfr.md)", got, prof, want[prof])
		}
	}
	if p.DefaultSampleType != want["cpu"] {
		t.Errorf("default sample type %q, want %q", p.DefaultSampleType, want["cpu"])
	}
	s := sums(p)
	if s[want["cpu"]] != 700 || s[want["wall"]] != 50 {
		t.Errorf("sums %v: want 700 cpu and 50 wall samples", s)
	}
	if !strings.Contains(stderr.String(), "(cpu_samples 700, ") {
		t.Errorf("convert reports %q, want the 700 CPU samples first", stderr.String())
	}
	// The OTLP output reports the same totals.
	stderr.Reset()
	if code := run([]string{"convert", in, "--to", "otlp", "-o", filepath.Join(dir, "app.json")}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "cpu_samples 700, wall_samples 50") {
		t.Errorf("convert --to otlp reports %q", stderr.String())
	}
	// top takes the pprof names too, and gives the same totals.
	for typ, want := range map[string]string{"cpu": "Samples: 700 ", want["cpu"]: "Samples: 700 ", "wall": "Samples: 50 ", want["wall"]: "Samples: 50 "} {
		stdout.Reset()
		if code := run([]string{"top", in, "--type", typ}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), want) {
			t.Errorf("top --type %s: exit %d\n%s", typ, code, stdout.String())
		}
	}
}

// A real JDK 17 recording: go tool pprof opens the converted profile on
// CPU samples, -sample_index accepts every documented name present, and
// the CPU total is what jfr print --json counts.
func TestConvertJDKRecordingOpensOnCPU(t *testing.T) {
	want := docsPprofTypes(t)
	rec := jfrtest.RecordJDK(t, 3000)
	out := filepath.Join(t.TempDir(), "hot.pb.gz")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"convert", rec, "--to", "pprof", "-o", out}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	p := readPprof(t, out)
	documented := map[string]bool{}
	for _, v := range want {
		documented[v] = true
	}
	for _, st := range p.SampleType {
		if !documented[st.Type] {
			t.Errorf("sample type %q is not in docs/jfr.md", st.Type)
		}
	}
	var doc struct {
		Recording struct {
			Events []json.RawMessage `json:"events"`
		} `json:"recording"`
	}
	if err := json.Unmarshal(jfrtest.PrintJSON(t, rec, "jdk.ExecutionSample"), &doc); err != nil {
		t.Fatal(err)
	}
	peer, ours := len(doc.Recording.Events), sums(p)[want["cpu"]]
	if peer == 0 || math.Abs(float64(ours)-float64(peer)) > 0.01*float64(peer) {
		t.Errorf("%s total %d, jfr print --json has %d jdk.ExecutionSample events", want["cpu"], ours, peer)
	}
	m := regexp.MustCompile(`\(` + want["cpu"] + ` (\d+)[,;]`).FindStringSubmatch(stderr.String())
	if m == nil || m[1] != strconv.FormatInt(ours, 10) {
		t.Errorf("convert reports %q, want %d CPU samples", stderr.String(), ours)
	}

	gobin := testfixture.NeedTool(t, "go")
	top, err := exec.Command(gobin, "tool", "pprof", "-top", out).CombinedOutput()
	if err != nil || !strings.Contains(string(top), "Type: "+want["cpu"]) || !strings.Contains(string(top), "Hot.spin") {
		t.Errorf("go tool pprof -top does not open on %s: %v\n%s", want["cpu"], err, top)
	}
	for _, st := range p.SampleType {
		if b, err := exec.Command(gobin, "tool", "pprof", "-top", "-sample_index="+st.Type, out).CombinedOutput(); err != nil {
			t.Errorf("go tool pprof -sample_index=%s: %v\n%s", st.Type, err, b)
		}
	}
	t.Logf("%s; jfr print --json: %d", strings.TrimSpace(stderr.String()), peer)
}

// An empty input is said to be empty, with what was expected, by every
// command that reads profiles; it is not "a corrupt ELF file".
func TestEmptyInput(t *testing.T) {
	dir := t.TempDir()
	empty, blank := filepath.Join(dir, "empty.json"), filepath.Join(dir, "blank.json")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(blank, []byte("\n  \n"), 0o644)
	for _, args := range [][]string{
		{"resolve", empty}, {"resolve", blank}, {"resolve", "-"},
		{"top", empty}, {"top", blank},
		{"convert", empty, "--to", "pprof", "-o", filepath.Join(dir, "out.pb.gz")}, {"convert", blank, "--to", "otlp"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, strings.NewReader(""), &stdout, &stderr)
		msg := stderr.String()
		if code != 1 || !strings.Contains(msg, "is empty: want OTLP profiles JSON") || strings.Contains(msg, "ELF") {
			t.Errorf("profsym %s: exit %d, %q", strings.Join(args, " "), code, msg)
		}
	}
}
