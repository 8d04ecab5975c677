package symbolizationprocessor

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/profsym/profsym/internal/locate"
)

// F8's latency: a debug file that trickles in from a slow server used to
// hold every batch naming its build id for the whole timeout (10 s), until
// the download ended. Now a batch waits for it at most fetch_wait: the
// healthy frames of the same batch are named, the slow one flows on
// pending, later batches do not wait for it at all, and once the file has
// arrived the next batch names it.
func TestSlowDownloadDoesNotHoldBatches(t *testing.T) {
	a, b, c := buildVariant(t, 11), buildVariant(t, 12), buildVariant(t, 13)
	dd := t.TempDir()
	aDebug, _ := os.ReadFile(a.debug)
	os.MkdirAll(filepath.Join(dd, ".build-id", a.id[:2]), 0o755)
	os.WriteFile(filepath.Join(dd, ".build-id", a.id[:2], a.id[2:]+".debug"), aDebug, 0o644)
	bDebug, _ := os.ReadFile(b.debug)
	cDebug, _ := os.ReadFile(c.debug)
	var bReqs atomic.Int64
	url := loopServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/buildid/" + c.id + "/debuginfo":
			w.Write(cDebug)
		case "/buildid/" + b.id + "/debuginfo":
			// The whole file over about 3 s, in 30 pieces.
			bReqs.Add(1)
			w.Header().Set("Content-Length", strconv.Itoa(len(bDebug)))
			piece := len(bDebug)/30 + 1
			for off := 0; off < len(bDebug); off += piece {
				w.Write(bDebug[off:min(off+piece, len(bDebug))])
				w.(http.Flusher).Flush()
				select {
				case <-time.After(100 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	})
	h := newHarness(t, func(cfg *Config) {
		cfg.Sources = []string{locate.SourceDebugDirs, locate.SourceDebuginfod}
		cfg.DebugDirectories = []string{dd}
		cfg.Debuginfod.URLs = []string{url}
		cfg.FetchWait = 300 * time.Millisecond
	})
	wait, timeout := h.cfg.FetchWait, h.cfg.Timeout

	batch := func(name string, maxTook time.Duration) []outcome {
		t.Helper()
		start := time.Now()
		got := h.run(t, profile(a, b, c))
		took := time.Since(start)
		t.Logf("%s: %v: %+v", name, took.Round(time.Millisecond), got)
		if took > maxTook {
			t.Errorf("%s took %v; fetch_wait %v, timeout %v", name, took, wait, timeout)
		}
		if got[0].name != "hot" || got[2].name != "hot" {
			t.Errorf("%s: healthy frames %+v %+v, want hot", name, got[0], got[2])
		}
		return got
	}
	// First sight of b: the batch gives its download fetch_wait.
	if got := batch("first batch", 2*wait); got[1].reason != "pending" {
		t.Errorf("slow frame %+v, want pending", got[1])
	}
	// The download is now older than fetch_wait: later batches do not wait.
	if got := batch("second batch", wait); got[1].reason != "pending" {
		t.Errorf("slow frame %+v, want pending", got[1])
	}
	if n := h.value(t, "otelcol_symbolization_debuginfod_downloads_in_flight"); n != 1 {
		t.Errorf("downloads_in_flight %d, want 1", n)
	}
	if n := h.reasonCount(t, "otelcol_symbolization_frames_unresolved", "pending"); n != 2 {
		t.Errorf("frames_unresolved{reason=pending} %d, want 2", n)
	}
	// Once the file has arrived, a batch names it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		time.Sleep(200 * time.Millisecond)
		got := batch("later batch", wait)
		if got[1].name == "hot" {
			break
		}
		if got[1].reason != "pending" || time.Now().After(deadline) {
			t.Fatalf("slow frame %+v, want pending until named", got[1])
		}
	}
	if n := h.value(t, "otelcol_symbolization_debuginfod_downloads_in_flight"); n != 0 {
		t.Errorf("downloads_in_flight %d after the download, want 0", n)
	}
	if n := bReqs.Load(); n != 1 {
		t.Errorf("the slow file was requested %d times, want once", n)
	}
}

// reasonCount reads one reason's count of a counter with a reason attribute.
func (h *harness) reasonCount(t *testing.T, name, reason string) int64 {
	t.Helper()
	m, err := h.tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value("reason"); ok && strings.EqualFold(v.AsString(), reason) {
			n += dp.Value
		}
	}
	return n
}
