package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/testfixture"
)

// A real JDK 17 recording (settings=profile) of a program whose hot method
// is Hot.spin: top shows it first, its callers in the hottest stack, and
// the sample count jfr print --json gives, within 1%.
func TestTopJDKRecording(t *testing.T) {
	rec := jfrtest.RecordJDK(t, 3000)
	var out, errb bytes.Buffer
	if code := run([]string{"top", rec, "--n", "5"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(out.String(), "\n")
	m := regexp.MustCompile(`^Samples: (\d+) \(cpu\)`).FindStringSubmatch(lines[0])
	if m == nil {
		t.Fatalf("top output:\n%s", out.String())
	}
	ours, _ := strconv.Atoi(m[1])
	if !strings.HasSuffix(strings.TrimSpace(lines[2]), " Hot.spin") {
		t.Errorf("hottest function is not Hot.spin:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "Hot.spin <- Hot.work <- Hot.main") {
		t.Errorf("callers of Hot.spin missing:\n%s", out.String())
	}
	var doc struct {
		Recording struct {
			Events []json.RawMessage `json:"events"`
		} `json:"recording"`
	}
	if err := json.Unmarshal(jfrtest.PrintJSON(t, rec, "jdk.ExecutionSample"), &doc); err != nil {
		t.Fatal(err)
	}
	peer := len(doc.Recording.Events)
	if peer == 0 || math.Abs(float64(ours-peer)) > 0.01*float64(peer) {
		t.Errorf("profsym top counts %d samples, jfr print --json %d", ours, peer)
	}
	t.Logf("profsym top: %d samples, jfr print --json: %d", ours, peer)

	// The allocation profile, by the same name docs/jfr.md gives it.
	out.Reset()
	if code := run([]string{"top", rec, "--type", "alloc", "--n", "3"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var allocs struct {
		Recording struct {
			Events []json.RawMessage `json:"events"`
		} `json:"recording"`
	}
	json.Unmarshal(jfrtest.PrintJSON(t, rec, "jdk.ObjectAllocationSample"), &allocs)
	if !strings.HasPrefix(out.String(), "Samples: ") || len(allocs.Recording.Events) > 0 && strings.HasPrefix(out.String(), "Samples: 0 ") {
		t.Errorf("alloc profile (%d allocation samples):\n%s", len(allocs.Recording.Events), out.String())
	}
}

// convert --symbolize names remote frames with the same sources as
// resolve; go tool pprof opens the pprof output; the OTLP output reads back.
func TestConvertJFRSymbolize(t *testing.T) {
	fx := jfrtest.BuildRemoteFixture(t)
	dir := t.TempDir()
	rec := filepath.Join(dir, "remote.jfr")
	os.WriteFile(rec, fx.Recording(1_700_000_000_000_000_000, 3, 4).Bytes(), 0o644)
	dbg := fx.DebugDir(t)

	pb := filepath.Join(dir, "out.pb.gz")
	var out, errb bytes.Buffer
	if code := run([]string{"convert", rec, "--to", "pprof", "-o", pb, "--symbolize", "--debug-file-directory", dbg}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "7 frames resolved") {
		t.Errorf("convert said: %s", errb.String())
	}
	gobin := testfixture.NeedTool(t, "go")
	top, err := exec.Command(gobin, "tool", "pprof", "-top", "-lines", pb).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, top)
	}
	for _, want := range []string{"lib_leaf", "lib.c:"} {
		if !strings.Contains(string(top), want) {
			t.Errorf("go tool pprof -top lacks %q:\n%s", want, top)
		}
	}

	js := filepath.Join(dir, "out.json")
	errb.Reset()
	if code := run([]string{"convert", rec, "--to", "otlp", "-o", js, "--symbolize", "--debug-file-directory", dbg}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"top", js}, nil, &out, &errb); code != 0 {
		t.Fatalf("top exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "Samples: 7 (cpu)") || !strings.Contains(out.String(), "lib_leaf <- lib_mid <- lib_outer <- exe_call <- com.example.Native.call") {
		t.Errorf("top of the OTLP output:\n%s", out.String())
	}
	// Without --symbolize the remote frames stay raw, counted for their
	// library.
	out.Reset()
	run([]string{"top", rec}, nil, &out, &errb)
	if strings.Contains(out.String(), "lib_leaf") || !strings.Contains(out.String(), "libplain.so (no symbols)") {
		t.Errorf("unsymbolized top:\n%s", out.String())
	}
}

func TestTopBadJFR(t *testing.T) {
	dir := t.TempDir()
	good := jfrtest.New(0).Bytes()
	for name, b := range map[string][]byte{"trunc.jfr": good[:len(good)-10], "magic.jfr": append([]byte("FLR\x00"), make([]byte, 10)...)} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, b, 0o644)
		var out, errb bytes.Buffer
		if code := run([]string{"top", p}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "jfr:") {
			t.Errorf("%s: exit %d, %q", name, code, errb.String())
		}
	}
}
