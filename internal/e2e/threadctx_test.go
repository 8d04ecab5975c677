package e2e

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// The OpenTelemetry thread context (OTEP 4947) end to end: the fixture
// (testdata/src/threadctx, a C writer of otel_thread_ctx_v1 made for the
// test: no SDK that publishes it can be installed here) runs the trace
// links fixture's requests, publishing each request's "compute" span while
// it spins in in_span and nothing in outside. Nearly every in_span sample
// must link to the compute span open at its time, and none in outside.

// threadCtxRun starts a variant of the fixture publishing in style
// ("point" or "flag").
func threadCtxRun(t *testing.T, variant, style string) *traceRun {
	t.Helper()
	bin := testfixture.ThreadCtx(t)[variant]
	r := &traceRun{cmd: exec.Command(bin, strconv.Itoa(traceRequests), style), lines: make(chan string, 4*traceRequests+8)}
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r.pid = startLines(t, r.cmd, "threadctx", r.lines)
	if l := r.next(t, "", 30*time.Second); !strings.HasPrefix(l, "tls ") {
		t.Fatalf("threadctx: first line %q, want tls OFFSET", l)
	}
	r.next(t, "ready", 30*time.Second)
	return r
}

func checkThreadCtx(t *testing.T, path string, pid int64, spans map[string]traceSpan) {
	t.Helper()
	checkLinksTo(t, path, pid, spans, "compute", "samples", "in_span", "outside", traceMinSamples)
}

// TestCollectorThreadContext runs the distribution with
// config/default.yaml and thread_context enabled beside the fixture built
// with the variable in the program (pointer style) and in a library reached
// through TLSDESC (valid-flag style).
func TestCollectorThreadContext(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	for _, c := range []struct{ variant, style string }{
		{testfixture.ThreadCtxExe, "point"},
		{testfixture.ThreadCtxTLSDESC, "flag"},
	} {
		t.Run(c.variant+"-"+c.style, func(t *testing.T) {
			col, out := startDefaultCollector(t, bin, "yaml:receivers::profiling::thread_context::enabled: true")
			r := threadCtxRun(t, c.variant, c.style)
			time.Sleep(3 * time.Second) // the fixture is seen and its variable placed
			spans := r.work(t)
			time.Sleep(2500 * time.Millisecond) // the last reports
			col.stop(t)
			checkThreadCtx(t, out, r.pid, spans)
			if t.Failed() {
				t.Logf("collector log (tail):\n%s", tail(col.log.String(), 4000))
			}
		})
	}
}

// TestRecordThreadContext is TestCollectorThreadContext through `profsym
// record --symbolize --thread-context --pid`, with the variable in a
// library reached through the initial-exec model.
func TestRecordThreadContext(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	r := threadCtxRun(t, testfixture.ThreadCtxInitialEx, "point")
	out := filepath.Join(t.TempDir(), "rec.json")
	rec := startRecord(t, bin, "record", "--symbolize", "--thread-context", "--duration", "5m", "--output", out,
		"--pid", strconv.FormatInt(r.pid, 10))
	time.Sleep(3 * time.Second)
	spans := r.work(t)
	rec.stop(t)
	checkThreadCtx(t, out, r.pid, spans)
	if t.Failed() {
		t.Logf("%s", strings.TrimSpace(rec.log.String()))
	}
}

// TestRecordThreadContextOff: without --thread-context the same program's
// samples carry no link (the switch is what reads the variable).
func TestRecordThreadContextOff(t *testing.T) {
	checkNoLinks(t, "point")
}

// TestRecordThreadContextHostile: a publisher whose pointer leads to an
// unmapped page, or to a record not marked valid, gets no link on its
// samples, and loses none of them: every one is there, its stack whole.
func TestRecordThreadContextHostile(t *testing.T) {
	checkNoLinks(t, "wild", "--thread-context")
}

// checkNoLinks records the fixture publishing in style with `profsym
// record` and flags, and wants its in_span samples whole and unlinked.
func checkNoLinks(t *testing.T, style string, flags ...string) {
	t.Helper()
	bin := needBuilt(t, "profsym", "build")
	r := threadCtxRun(t, testfixture.ThreadCtxExe, style)
	out := filepath.Join(t.TempDir(), "rec.json")
	args := append([]string{"record", "--symbolize", "--duration", "5m", "--output", out, "--pid", strconv.FormatInt(r.pid, 10)}, flags...)
	rec := startRecord(t, bin, args...)
	time.Sleep(3 * time.Second)
	r.work(t)
	rec.stop(t)
	var in, linked, cut int64
	eachSampleOf(t, out, map[int64]bool{r.pid: true}, func(s sampleOf) {
		if s.typ != "samples" || !hasFunc(s.frames, "in_span") {
			return
		}
		in += s.n
		if s.span != "" {
			linked += s.n
		}
		if s.stop != "" || !hasFunc(s.frames, "main") {
			cut += s.n
		}
	})
	t.Logf("%s %v: %d samples in in_span, %d linked, %d not whole", style, flags, in, linked, cut)
	// 30 requests of 100 ms of CPU at 99 Hz: 297 samples, a few fewer
	// when a request starts or ends between two ticks.
	if in < traceMinSamples || linked != 0 || cut != 0 {
		t.Errorf("%d samples in in_span, %d linked, %d not whole; want at least %d, none linked, all whole", in, linked, cut, traceMinSamples)
	}
}
