package hotspot_test

import (
	"cmp"
	"fmt"
	"maps"
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

// TestMethodShares runs fixture.Mix (twelve methods computing for
// different shares of the time, two threads) and holds the share of
// profsym's samples each method has on top of the stack (the innermost
// Java frame of samples taken in Java code) to the share of the CPU time
// the fixture measured in it with its own clock: within four standard
// errors, each. The methods are kept out of line on every JDK, and
// inlined into their caller in a second run on JDK 17 and later. A JFR
// recording (jdk.ExecutionSample every millisecond) of the same seconds
// is reported beside it, as a peer.
func TestMethodShares(t *testing.T) {
	// Both sides sample about every millisecond, so that the shares are
	// known to within a point (sampling noise alone puts two estimates of
	// a 20% share from 1,000 samples each 1.8 points apart) in a window
	// of 10 s: the bounds follow the samples (compareTruth), and the
	// fixture's two threads keep both of CI's CPUs busy for the window
	// (at 499 Hz it took 20 s for as many samples).
	h := newHarness(t, sampler.Config{SampleRate: 997, Runtimes: runtimes.Config{HotSpot: true}})
	jar, lib := javaFixtures(t)
	settings := filepath.Join(t.TempDir(), "sample.jfc")
	if err := os.WriteFile(settings, []byte(jfcExecutionSample), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, j := range jdks(t) {
		if j.feature == 26 && os.Getenv("HSJDK") == "" {
			// Between 25 and 27, which are measured, with their layouts
			// (23+'s nmethod) and code path; walked in every mode by
			// TestJavaChains. Its two runs cost CI a minute.
			continue
		}
		for _, inline := range []bool{true, false} {
			if inline && j.feature < 17 {
				// Inlined into their caller on JDK 8 and 11, the twelve
				// loops' PCs are at times described by C2's debug info
				// as another of the twelve (the next call or safepoint it
				// recorded), in JFR's samples and profsym's alike: on
				// JDK 11 m02 took 13.5% of the CPU time and had 3.1% of
				// profsym's samples (and too few of JFR's to be in its
				// ten first), m01 19.6% and 26.1%. There is no known
				// answer to hold a sampler to: only the out-of-line run,
				// where each method is its own nmethod, is made. From
				// JDK 17 on, inlined shares are within 1 point of the
				// clock, and held to it like the out-of-line ones.
				continue
			}
			name := j.name + "/inlined"
			if !inline {
				name = j.name + "/out-of-line"
			}
			t.Run(name, func(t *testing.T) {
				rec := filepath.Join("/tmp/profsym-fixtures", "mix-"+j.name+".jfr")
				host := rec
				if j.root != "" {
					host = testfixture.ChrootFile(j.root, rec)
				}
				if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(host); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
				jfc := settings
				if j.root != "" {
					jfc = testfixture.ChrootCopy(t, j.root, settings)[0]
				}
				jvm := []string{"-XX:StartFlightRecording=filename=" + rec + ",settings=" + jfc}
				// The window starts once C2 has compiled what it is
				// about: each method on its own, or, inlined, the
				// method they are inlined into (4.3 s in here, where a
				// fixed 4 s was waited before).
				want := []compiled{{method: "fixture.Mix::timedRound", level: 4}}
				if !inline {
					jvm = append(jvm, "-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,fixture.Mix::m*")
					want = nil
					for i := 1; i <= 12; i++ {
						want = append(want, compiled{method: fmt.Sprintf("fixture.Mix::m%02d", i), level: 4})
					}
				}
				// The fixture counts its methods' CPU time from when
				// the go file exists to when the stop file does: the
				// window's bounds.
				inside := filepath.Join("/tmp/profsym-fixtures", "mix-"+j.name)
				goFile, stopFile := inside+".go", inside+".stop"
				for _, f := range []string{goFile, stopFile} {
					if err := os.Remove(testfixture.ChrootFile(j.root, f)); err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
				}
				touch := func(f string) {
					if err := os.WriteFile(testfixture.ChrootFile(j.root, f), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				warm := warmup{d: 30 * time.Second, begin: func() { touch(goFile) }}
				jvm, warm.jit = watchJIT(jvm, want)
				cmd := javaCmd(t, j, jar, lib, jvm, "fixture.Mix", "120", "2", goFile, stopFile)
				var stdout strings.Builder
				cmd.Stdout = &stdout
				ours := map[string]float64{}
				var from, to time.Time
				h.sampleJVMAfter(t, cmd, warm, window, 0, true, func(pid int, samples []sampler.Sample) {
					to = time.Now()
					from = to.Add(-window)
					// After the naming, which reads the running JVM's
					// memory; the fixture's count runs that much past the
					// window (the shares hold still: 0.2-0.4 points from
					// the clock in or out of it).
					defer touch(stopFile)
					p, err := h.norm.Refresh(pid)
					if err != nil {
						t.Fatal(err)
					}
					stops := map[string]uint64{}
					defer func() {
						t.Logf("stops of the mix threads: %v; runtimes %+v; unwind %+v", stops, h.s.Runtimes().Stats(), h.u.Stats())
					}()
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
				warm.jit.wait()
				if os.Getenv("HSDEBUG") != "" {
					t.Logf("compiles: %s", warm.jit.compiles())
				}
				theirs := jfrTops(t, host, from, to)
				truth := mixTimes(t, stdout.String())
				compareTruth(t, ours, truth)
				// JFR is the peer, the clock is the reference: where the
				// two samplers differ by more than a point or two, profsym
				// is the one within bounds of the clock. JDK 11's JFR drops
				// the samples of compiled code whose next PcDesc has no
				// scope (JfrGetCallTrace::find_top_frame): out of line it
				// saw 1.6% in m03 where the fixture measured 12.5% and
				// profsym sampled 11.9%. JDK 8's is the same code
				// backported: from run to run its shares moved by 3.6
				// points (m10 5.7% to 8.1%) where profsym's moved by 0.4,
				// and it failed CI at 3.3 points from profsym. JDK 17's
				// and 21's came within 2.8 and 3.9 points of profsym in a
				// run where profsym was within 0.7 of the clock. JFR's
				// shares are reported beside profsym's, not asserted.
				reportJFR(t, ours, theirs)
			})
		}
	}
}

// The sampling window, after the JIT compilers are done.
const window = 10 * time.Second

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
	defer f.Close() //nolint:errcheck // read only
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

// reportJFR logs the shares of the ten methods JFR sees most beside
// profsym's.
func reportJFR(t *testing.T, ours, theirs map[string]float64) {
	t.Helper()
	total := func(m map[string]float64) (n float64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	no, nt := total(ours), total(theirs)
	t.Logf("profsym: %.0f samples on top of Java code, JFR: %.0f", no, nt)
	if nt == 0 {
		return
	}
	names := make([]string, 0, len(theirs))
	for n := range theirs {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(theirs[b], theirs[a]) })
	var worst float64
	for i, n := range names[:min(10, len(names))] {
		po, pt := 100*ours[n]/no, 100*theirs[n]/nt
		worst = max(worst, math.Abs(po-pt))
		t.Logf("%2d %-24s profsym %5.2f%%  JFR %5.2f%%", i+1, n, po, pt)
	}
	t.Logf("JFR's ten first: largest gap %.2f points", worst)
}

// mixTimes reads the nanoseconds fixture.Mix measured in each of its
// twelve methods after the warm-up.
func mixTimes(t *testing.T, out string) map[string]float64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(line, "mix-ns ")
		if !ok {
			continue
		}
		m := map[string]float64{}
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				t.Fatalf("fixture.Mix's times: %q", line)
			}
			m["fixture.Mix."+k] = float64(n)
		}
		if len(m) == 12 {
			return m
		}
	}
	t.Fatalf("fixture.Mix printed no times: %q", out)
	return nil
}

// compareTruth holds profsym's share of each of the twelve methods
// (among the samples on top of one of them) to the share of the time the
// fixture itself measured in it.
func compareTruth(t *testing.T, ours, truth map[string]float64) {
	t.Helper()
	var no, nt float64
	for n, v := range truth {
		no += ours[n]
		nt += v
	}
	if no < 3000 {
		t.Fatalf("too few samples in the twelve methods: %.0f", no)
	}
	names := slices.Sorted(maps.Keys(truth))
	var worst float64
	for _, n := range names {
		po, pt := 100*ours[n]/no, 100*truth[n]/nt
		// Four standard errors of a share pt estimated from no samples
		// (1.46 points for 20% of 12,000, 0.36 for 1%), and a quarter
		// point for what is neither sampling nor walk: the clock reads
		// between the calls and the calls' own entry and exit.
		// Measured with load average 10: every method within 0.44 to 1.12
		// points, out of line on JDK 8 to 27 and inlined on 17 to 27.
		bound := 400*math.Sqrt(pt/100*(1-pt/100)/no) + 0.25
		worst = max(worst, math.Abs(po-pt))
		t.Logf("%-24s profsym %5.2f%%  measured %5.2f%%  bound %.2f", n, po, pt, bound)
		if math.Abs(po-pt) > bound {
			t.Errorf("%s: profsym %.2f%%, the fixture measured %.2f%%: more than %.2f points apart", n, po, pt, bound)
		}
	}
	t.Logf("profsym: %.0f samples in the twelve methods; worst difference %.2f points", no, worst)
}
