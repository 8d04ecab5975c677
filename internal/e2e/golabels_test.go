package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// The Go labels fixture's measured work, CPU seconds per function (about
// 300 samples at 99 Hz each), and what a pass takes: nearly every sample
// of labelled carries request=a, and none of unlabelled carries any label.
const (
	goLabelsSeconds    = 3
	goLabelsMinSamples = 200
	goLabelsShare      = 0.99
)

// goLabelsBuild is one build of testdata/src/golabels.
type goLabelsBuild struct {
	name string
	spec testfixture.Spec
}

// goLabelsBuilds: the host's Go, Go 1.19 (golang-1.19-go; the label set
// was a map then, a slice since 1.24), and the host's Go stripped (no
// DWARF, no symbols: the offsets come from the table).
func goLabelsBuilds(t *testing.T) []goLabelsBuild {
	t.Helper()
	const go119 = "/usr/lib/go-1.19/bin/go"
	if _, err := os.Stat(go119); err != nil {
		testfixture.SkipOrFail(t, "%s is not installed (apt-get install golang-1.19-go)", go119)
	}
	src := []string{"golabels"}
	return []goLabelsBuild{
		{"go-host", testfixture.Spec{Name: "golabels", Lang: "go", Sources: src}},
		{"go1.19", testfixture.Spec{Name: "golabels119", Lang: "go", Sources: src, Compiler: go119}},
		{"go-host-stripped", testfixture.Spec{Name: "golabels-stripped", Lang: "go", Sources: src, Args: []string{"-ldflags=-s -w"}}},
	}
}

// goLabelsRun is one running fixture.
type goLabelsRun struct {
	name  string
	cmd   *exec.Cmd
	pid   int64
	in    io.WriteCloser
	lines chan string
}

func startGoLabels(t *testing.T, b goLabelsBuild) *goLabelsRun {
	t.Helper()
	bin := testfixture.Build(t, b.spec)
	r := &goLabelsRun{name: b.name, cmd: exec.Command(bin, strconv.Itoa(goLabelsSeconds)), lines: make(chan string, 8)}
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r.pid = startLines(t, r.cmd, r.name, r.lines)
	r.expect(t, "ready", 30*time.Second)
	return r
}

func (r *goLabelsRun) expect(t *testing.T, word string, limit time.Duration) {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok || l != word {
			t.Fatalf("%s: got %q (open %v), want %q", r.name, l, ok, word)
		}
	case <-time.After(limit):
		t.Fatalf("%s: no %q in %v", r.name, word, limit)
	}
}

// work ends the warm-up and waits for the measured work to end.
func goLabelsWork(t *testing.T, runs []*goLabelsRun) {
	t.Helper()
	for _, r := range runs {
		if _, err := io.WriteString(r.in, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range runs {
		r.expect(t, "go", 10*time.Second)
	}
	for _, r := range runs {
		r.expect(t, "done", 2*time.Minute)
	}
}

// hasFrame says whether frames hold main.<fn>.
func hasFrame(frames []userFrame, fn string) bool {
	return hasFunc(frames, "main."+fn)
}

// hasFunc says whether a frame is in the function named fn.
func hasFunc(frames []userFrame, fn string) bool {
	for _, f := range frames {
		if f.fn == fn {
			return true
		}
	}
	return false
}

// frameNames lists the first n frames' functions, leaf first.
func frameNames(frames []userFrame, n int) string {
	var names []string
	for i, f := range frames {
		if i == n {
			names = append(names, "...")
			break
		}
		names = append(names, f.fn)
	}
	return "[" + strings.Join(names, " ") + "]"
}

// checkGoLabels holds every fixture's samples in the profiles at path to
// goLabelsMinSamples and goLabelsShare.
func checkGoLabels(t *testing.T, path string, runs []*goLabelsRun) {
	t.Helper()
	var summary []string
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			var in, inOK, out, outBad int64
			bad := map[string]int64{}
			eachSampleOf(t, path, map[int64]bool{r.pid: true}, func(s sampleOf) {
				switch {
				case hasFrame(s.frames, "labelled"):
					in += s.n
					if len(s.labels) == 1 && s.labels["request"] == "a" {
						inOK += s.n
					} else {
						bad[fmt.Sprintf("labelled %v stop=%s thread=%s %s", s.labels, s.stop, s.thread, frameNames(s.frames, 12))] += s.n
					}
				case hasFrame(s.frames, "unlabelled"):
					out += s.n
					if len(s.labels) > 0 {
						outBad += s.n
						bad[fmt.Sprintf("unlabelled %v", s.labels)] += s.n
					}
				}
			})
			share := 0.0
			if in > 0 {
				share = float64(inOK) / float64(in)
			}
			summary = append(summary, fmt.Sprintf("%-17s labelled %4d/%4d %.1f%%  unlabelled with labels %d/%d",
				r.name, inOK, in, 100*share, outBad, out))
			if in < goLabelsMinSamples || out < goLabelsMinSamples {
				t.Errorf("%d samples in labelled, %d in unlabelled, want at least %d each", in, out, goLabelsMinSamples)
			}
			if share < goLabelsShare {
				t.Errorf("%.1f%% of %d samples in labelled carry request=a, want >= %.0f%%; the others:\n%s",
					100*share, in, 100*goLabelsShare, topCounts(bad, 8))
			}
			if outBad > 0 {
				t.Errorf("%d of %d samples in unlabelled carry labels:\n%s", outBad, out, topCounts(bad, 8))
			}
		})
	}
	t.Logf("go labels:\n%s", strings.Join(summary, "\n"))
}

// TestCollectorGoLabels runs the distribution with config/default.yaml
// (go_labels on by default), starts the fixtures after it, waits until
// the output holds each one's warm-up, and checks the labels of the
// measured work.
func TestCollectorGoLabels(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	builds := goLabelsBuilds(t)
	root := testfixture.Root(t)
	out := filepath.Join(t.TempDir(), "profiles.json")
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	prom := testfixture.FreePort(t)
	overlay := filepath.Join(t.TempDir(), "telemetry.yaml")
	if err := os.WriteFile(overlay, []byte(telemetryOverlay(prom)), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t, bin, "collector", env, filepath.Join(root, "config", "default.yaml"), overlay)
	runs := make([]*goLabelsRun, len(builds))
	for i, b := range builds {
		runs[i] = startGoLabels(t, b)
	}
	// The warm-up lasts until the output names each fixture's warm
	// frame: the process was read (and its Go layout handed to the
	// sampler) before that report was built.
	pending := map[int64]bool{}
	for _, r := range runs {
		pending[r.pid] = true
	}
	deadline := time.Now().Add(45 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		eachSampleOf(t, out, pending, func(s sampleOf) {
			if hasFrame(s.frames, "warm") {
				delete(pending, s.pid)
			}
		})
	}
	if len(pending) > 0 {
		t.Errorf("no warm frame of %v in 45 s", pending)
	}
	goLabelsWork(t, runs)
	time.Sleep(2500 * time.Millisecond) // the last reports
	// Each fixture is one Go process whose labels are read (the host's
	// other Go programs may add to it); none is refused for its build.
	m := scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", prom))
	if n := m["otelcol_receiver_profiling_go_labels_processes"]; n < float64(len(runs)) {
		t.Errorf("go_labels_processes %v, want at least the %d fixtures", n, len(runs))
		for k, v := range m {
			if strings.Contains(k, "go_labels") {
				t.Logf("%s %v", k, v)
			}
		}
	}
	t.Logf("go labels metrics: processes %v, refused unsupported %v unreadable %v, unread sets %v",
		m["otelcol_receiver_profiling_go_labels_processes"],
		m[`otelcol_receiver_profiling_go_labels_refused{reason="unsupported"}`],
		m[`otelcol_receiver_profiling_go_labels_refused{reason="unreadable"}`],
		m["otelcol_receiver_profiling_go_labels_unread"])
	c.stop(t)
	checkGoLabels(t, out, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// TestRecordGoLabels runs `profsym record --symbolize --pid ...` over the
// fixtures started before it, warms them for 3 s of its sampling, and
// checks the labels of the measured work in its output.
func TestRecordGoLabels(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	builds := goLabelsBuilds(t)
	runs := make([]*goLabelsRun, len(builds))
	for i, b := range builds {
		runs[i] = startGoLabels(t, b)
	}
	out := filepath.Join(t.TempDir(), "rec.json")
	args := []string{"record", "--symbolize", "--duration", "5m", "--output", out}
	for _, r := range runs {
		args = append(args, "--pid", strconv.FormatInt(r.pid, 10))
	}
	rec := startRecord(t, bin, args...)
	log := rec.log
	time.Sleep(3 * time.Second)
	goLabelsWork(t, runs)
	rec.stop(t)
	t.Logf("%s", strings.TrimSpace(log.String()))
	checkGoLabels(t, out, runs)
}
