package e2e

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// The trace links fixture's requests (testdata/src/gotrace): 100 ms of CPU
// each in a span, 50 ms outside, so about 300 samples in spans at 99 Hz.
const (
	traceRequests   = 30
	traceMinSamples = 200
	traceShare      = 0.99
	// traceSlack is how far a sample's time may fall outside its span's
	// [start, end]: the sampler's clock is CLOCK_BOOTTIME turned into Unix
	// time once, the fixture's is the wall clock.
	traceSlack = 20 * time.Millisecond
)

// traceSpan is one span the fixture printed as it ended.
type traceSpan struct {
	trace, name string
	start, end  uint64
}

type traceRun struct {
	cmd   *exec.Cmd
	pid   int64
	in    io.WriteCloser
	lines chan string
}

func startTraceFixture(t *testing.T, args ...string) *traceRun {
	t.Helper()
	bin := testfixture.Build(t, testfixture.Spec{Name: "gotrace", Lang: "go", Sources: []string{"gotrace"}})
	args = append([]string{strconv.Itoa(traceRequests)}, args...)
	r := &traceRun{cmd: exec.Command(bin, args...), lines: make(chan string, 4*traceRequests+8)}
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r.pid = startLines(t, r.cmd, "gotrace", r.lines)
	r.next(t, "ready", 30*time.Second)
	return r
}

func (r *traceRun) next(t *testing.T, want string, limit time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok || (want != "" && l != want) {
			t.Fatalf("gotrace: got %q (open %v), want %q", l, ok, want)
		}
		return l
	case <-time.After(limit):
		t.Fatalf("gotrace: nothing in %v, want %q", limit, want)
	}
	return ""
}

// work ends the warm-up and returns the spans of the requests, by span id.
func (r *traceRun) work(t *testing.T) map[string]traceSpan {
	t.Helper()
	if _, err := io.WriteString(r.in, "go\n"); err != nil {
		t.Fatal(err)
	}
	r.next(t, "go", 10*time.Second)
	spans := map[string]traceSpan{}
	for {
		l := r.next(t, "", 2*time.Minute)
		if l == "done" {
			return spans
		}
		f := strings.Fields(l)
		if len(f) != 6 || f[0] != "span" {
			t.Fatalf("gotrace: unexpected line %q", l)
		}
		start, _ := strconv.ParseUint(f[3], 10, 64)
		end, _ := strconv.ParseUint(f[4], 10, 64)
		spans[f[2]] = traceSpan{trace: f[1], start: start, end: end, name: f[5]}
	}
}

// checkTraceLinks: nearly every sample in inSpan links to the fixture's
// request span (otel-profiling-go labels a request's samples with its
// local root span) of its own trace, taken while that span was open; no
// sample in outside links to anything.
func checkTraceLinks(t *testing.T, path string, pid int64, spans map[string]traceSpan) {
	t.Helper()
	checkLinks(t, path, pid, spans, "samples", "inSpan", "outside", traceMinSamples)
}

// checkLinks is checkTraceLinks for profile type typ, the fixture's
// functions in and out of spans, and at least least of typ's value in spans.
func checkLinks(t *testing.T, path string, pid int64, spans map[string]traceSpan, typ, inFn, outFn string, least int64) {
	t.Helper()
	checkLinksTo(t, path, pid, spans, "request", typ, "main."+inFn, "main."+outFn, least)
}

// checkLinksTo is checkLinks where the samples in spans must link to the
// span named linkTo of their request, and inFn and outFn are functions'
// whole names.
func checkLinksTo(t *testing.T, path string, pid int64, spans map[string]traceSpan, linkTo, typ, inFn, outFn string, least int64) {
	t.Helper()
	if len(spans) != 2*traceRequests {
		t.Fatalf("the fixture printed %d spans, want %d", len(spans), 2*traceRequests)
	}
	var in, inOK, out, outBad int64
	linked := map[string]bool{}
	bad := map[string]int64{}
	slack := uint64(traceSlack)
	eachSampleOf(t, path, map[int64]bool{pid: true}, func(s sampleOf) {
		if s.typ != typ {
			return
		}
		switch {
		case hasFunc(s.frames, inFn):
			in += s.n
			sp, ok := spans[s.span]
			switch {
			case s.span == "":
				bad[fmt.Sprintf("no link, labels %v, stop=%s", s.labels, s.stop)] += s.n
			case !ok || sp.name != linkTo:
				bad[fmt.Sprintf("link to span %s (%q), not a %s span", s.span, sp.name, linkTo)] += s.n
			case sp.trace != s.trace:
				bad[fmt.Sprintf("span %s with trace %s, want %s", s.span, s.trace, sp.trace)] += s.n
			case s.time+slack < sp.start || s.time > sp.end+slack:
				bad[fmt.Sprintf("span %s open %d-%d, sample at %d", s.span, sp.start, sp.end, s.time)] += s.n
			default:
				inOK += s.n
				linked[s.span] = true
			}
		case hasFunc(s.frames, outFn):
			out += s.n
			if s.span != "" || s.trace != "" {
				outBad += s.n
				bad[fmt.Sprintf("outside linked to %s/%s", s.trace, s.span)] += s.n
			}
		}
	})
	share := 0.0
	if in > 0 {
		share = float64(inOK) / float64(in)
	}
	t.Logf("trace links (%s): %d/%d in spans linked to their %s span (%.1f%%, %d of %d requests seen); %d/%d outside linked",
		typ, inOK, in, linkTo, 100*share, len(linked), traceRequests, outBad, out)
	if in < least {
		t.Errorf("%d %s in %s, want at least %d", in, typ, inFn, least)
	}
	if share < traceShare {
		t.Errorf("%.1f%% of the samples in spans carry their span's link, want >= %.0f%%; the others:\n%s",
			100*share, 100*traceShare, topCounts(bad, 8))
	}
	if outBad > 0 {
		t.Errorf("%d of %d samples outside spans carry a link:\n%s", outBad, out, topCounts(bad, 8))
	}
}

// TestCollectorTraceLinks runs the distribution with config/default.yaml
// beside the traced Go fixture and checks its samples' links.
func TestCollectorTraceLinks(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	c, out := startDefaultCollector(t, bin)
	r := startTraceFixture(t)
	// Warm until the output names the fixture's warm frame: its Go layout
	// was handed to the sampler before that report.
	deadline := time.Now().Add(45 * time.Second)
	for warm := false; !warm && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		eachSampleOf(t, out, map[int64]bool{r.pid: true}, func(s sampleOf) {
			warm = warm || hasFrame(s.frames, "warm")
		})
	}
	spans := r.work(t)
	time.Sleep(2500 * time.Millisecond) // the last reports
	c.stop(t)
	checkTraceLinks(t, out, r.pid, spans)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// TestRecordTraceLinks is TestCollectorTraceLinks through `profsym record
// --symbolize --pid`.
func TestRecordTraceLinks(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	r := startTraceFixture(t)
	out := filepath.Join(t.TempDir(), "rec.json")
	rec := startRecord(t, bin, "record", "--symbolize", "--duration", "5m", "--output", out, "--pid", strconv.FormatInt(r.pid, 10))
	time.Sleep(3 * time.Second)
	spans := r.work(t)
	rec.stop(t)
	if t.Failed() {
		t.Logf("%s", strings.TrimSpace(rec.log.String()))
	}
	checkTraceLinks(t, out, r.pid, spans)
}

// TestRecordTraceLinksOffCPU: the fixture's requests wait in nanosleep(2)
// on their goroutine's thread, and `profsym record --off-cpu` (every wait
// taken) links their off-CPU time to the request span as the CPU samples
// are. The value is waiting time: 30 requests of 100 ms in spans, want at
// least 2 s of it, >= 99% linked to the span open at the wait's start.
func TestRecordTraceLinksOffCPU(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	r := startTraceFixture(t, "offcpu")
	out := filepath.Join(t.TempDir(), "rec.json")
	rec := startRecord(t, bin, "record", "--symbolize", "--off-cpu", "--off-cpu-probability", "1",
		"--duration", "5m", "--output", out, "--pid", strconv.FormatInt(r.pid, 10))
	time.Sleep(3 * time.Second)
	spans := r.work(t)
	rec.stop(t)
	if t.Failed() {
		t.Logf("%s", strings.TrimSpace(rec.log.String()))
	}
	checkLinks(t, out, r.pid, spans, "off_cpu", "blockedInSpan", "blockedOutside", int64(2*time.Second))
}
