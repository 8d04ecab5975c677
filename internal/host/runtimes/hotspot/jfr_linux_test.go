package hotspot_test

import (
	"cmp"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestAgreesWithJFR runs fixture.Mix (twelve methods computing for
// different shares of the time, two threads) with a JFR recording
// (jdk.ExecutionSample every 10 ms, settings=profile) and compares, over
// the same seconds, the share of samples each method has on top of the
// stack: profsym's (the innermost Java frame of samples taken in Java
// code) against JFR's. The ten methods JFR sees most must agree within 3
// percentage points each.
func TestAgreesWithJFR(t *testing.T) {
	// Both sides sample as often as they can, so that the shares are
	// known to within a point (sampling noise alone puts two estimates of
	// a 20% share from 1,000 samples each 1.8 points apart).
	h := newHarness(t, sampler.Config{SampleRate: 499, Runtimes: runtimes.Config{HotSpot: true}})
	jar, lib := javaFixtures(t)
	settings := filepath.Join(t.TempDir(), "sample.jfc")
	if err := os.WriteFile(settings, []byte(jfcExecutionSample), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, j := range jdks(t) {
		t.Run(j.name, func(t *testing.T) {
			rec := filepath.Join("/tmp/profsym-fixtures", "mix-"+j.name+".jfr")
			host := rec
			if j.root != "" {
				host = testfixture.ChrootFile(j.root, rec)
			}
			if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
				t.Fatal(err)
			}
			os.Remove(host)
			jfc := settings
			if j.root != "" {
				jfc = testfixture.ChrootCopy(t, j.root, settings)[0]
			}
			cmd := javaCmd(t, j, jar, lib, []string{"-XX:StartFlightRecording=filename=" + rec + ",settings=" + jfc},
				"fixture.Mix", strconv.Itoa(int((window+warm)/time.Second)+3), "2")
			ours := map[string]float64{}
			var from, to time.Time
			h.sampleJVM(t, cmd, warm, window, true, func(pid int, samples []sampler.Sample) {
				to = time.Now()
				from = to.Add(-window)
				p, err := h.norm.Refresh(pid)
				if err != nil {
					t.Fatal(err)
				}
				stops := map[string]uint64{}
				defer func() { t.Logf("stops of the mix threads: %v; runtimes %+v", stops, h.s.Runtimes().Stats()) }()
				for _, s := range samples {
					if !strings.HasPrefix(s.Comm, "mix-") {
						continue
					}
					stops[s.Stop.String()] += s.Count
					fs := h.frames(p, s)
					if os.Getenv("HSDEBUG") != "" && len(fs) > 0 {
						t.Logf("%d x %s", s.Count, describe(fs))
					}
					if len(fs) > 0 && fs[0].java && fs[0].err == nil {
						ours[fs[0].name] += float64(s.Count)
					}
				}
			})
			theirs := jfrTops(t, host, from, to)
			// JDK 11's JFR drops the samples of compiled code whose next
			// PcDesc has no scope (JfrGetCallTrace::find_top_frame):
			// with -XX:-Inline it sees 0.2% in m07 where profsym, naming
			// the nmethod the PC is in, sees 8.8%, and every other share
			// grows to make up. Inlined, that moves a method or two by up
			// to 4 points from run to run, while 17 and 21 agree within
			// 2. JDK 11 is reported, not held to the bound.
			compareShares(t, ours, theirs, j.name != "jdk11")
		})
	}
}

// The sampling window, after the JIT compilers are done.
const (
	warm   = 4 * time.Second
	window = 20 * time.Second
)

// jfcExecutionSample records jdk.ExecutionSample alone, every millisecond
// (JDKs sample less often than asked when the machine is busy).
const jfcExecutionSample = `<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="profsym" description="jdk.ExecutionSample only">
  <event name="jdk.ExecutionSample">
    <setting name="enabled">true</setting>
    <setting name="period">1 ms</setting>
  </event>
</configuration>
`

// jfrTops counts the top frames of the recording's jdk.ExecutionSample
// events of the mix threads in [from, to].
func jfrTops(t *testing.T, path string, from, to time.Time) map[string]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	var first, last int64
	defer func() {
		t.Logf("JFR samples from %v to %v, window %v to %v", time.Unix(0, first).Format(time.StampMilli), time.Unix(0, last).Format(time.StampMilli), from.Format(time.StampMilli), to.Format(time.StampMilli))
	}()
	err = jfr.Parse(f, st.Size(), jfr.Options{}, jfr.Visitor{Sample: func(c *jfr.Chunk, s *jfr.Sample) error {
		if s.Kind == jfr.KindCPU {
			if first == 0 || s.Time < first {
				first = s.Time
			}
			last = max(last, s.Time)
		}
		if s.Kind != jfr.KindCPU || s.Time < from.UnixNano() || s.Time > to.UnixNano() {
			return nil
		}
		th, _ := c.Thread(s.Thread)
		st, ok := c.Stack(s.Stack)
		if !strings.HasPrefix(th.JavaName, "mix-") || !ok || len(st.Frames) == 0 {
			return nil
		}
		m, _ := c.Method(st.Frames[0].Method)
		out[frame.JavaMethod(c.ClassName(m.Class), c.Symbol(m.Name))]++
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// compareShares checks the ten methods theirs has most of (only logs
// them unless strict).
func compareShares(t *testing.T, ours, theirs map[string]float64, strict bool) {
	t.Helper()
	total := func(m map[string]float64) (n float64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	no, nt := total(ours), total(theirs)
	t.Logf("profsym: %.0f samples on top of Java code, JFR: %.0f", no, nt)
	if no < 300 || nt < 300 {
		t.Fatalf("too few samples to compare: profsym %.0f, JFR %.0f", no, nt)
	}
	names := make([]string, 0, len(theirs))
	for n := range theirs {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(theirs[b], theirs[a]) })
	for i, n := range names[:min(10, len(names))] {
		po, pt := 100*ours[n]/no, 100*theirs[n]/nt
		t.Logf("%2d %-24s profsym %5.2f%%  JFR %5.2f%%", i+1, n, po, pt)
		if math.Abs(po-pt) > 3 && strict {
			t.Errorf("%s: profsym %.2f%%, JFR %.2f%%: more than 3 points apart", n, po, pt)
		}
	}
}
