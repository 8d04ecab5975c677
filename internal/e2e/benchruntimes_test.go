package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/testfixture"
)

// make bench-runtimes: profsym and the upstream OpenTelemetry eBPF
// profiler (github.com/open-telemetry/opentelemetry-ebpf-profiler) side by
// side on the same JChain and pychain.py fixture processes, each fixture's
// whole-named-chain share in each one's output. The target:
// profsym's share >= upstream's on every case upstream can walk.
//
// Upstream exports OTLP over gRPC; a second otelcol-profsym (otlp receiver,
// file exporter, no symbolization: upstream names its interpreter frames
// itself) writes what it sends to a file of its own. Upstream's OTLP, as
// read by eachSampleOf, carries what checkChains needs: process.pid on the
// resource, thread.name (the comm) and per-sample timestamps, and
// profile.frame.type jvm / cpython. Its Python frames are named as
// profsym's (function, co_filename, line); its Java frames' function is
// the demangled method, "void e2e.JChain.hotLoop(long)", normalized here
// to profsym's "e2e.JChain.hotLoop" before javaWhole checks it. Its native
// frames are unsymbolized (no lines): raw frames, which neither check
// counts. Its samples carry timestamps and no values (one timestamp an
// event); eachSampleOf wants a value and windows by the first timestamp,
// so upstreamSamples splits them into one-valued samples of one timestamp
// each before anything reads them.

// upstreamSinkConfig receives upstream's OTLP and writes it out as is.
const upstreamSinkConfig = `receivers:
  otlp:
    protocols:
      grpc:
        endpoint: ${env:PROFSYM_UPSTREAM_OTLP}
exporters:
  file:
    path: ${env:PROFSYM_OUTPUT}
extensions:
  health_check:
    endpoint: ${env:PROFSYM_HEALTH_ENDPOINT}
service:
  extensions: [health_check]
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file]
`

// TestBenchRuntimesVsUpstream is a benchmark run by make bench-runtimes,
// not a CI test: it needs the upstream profiler's binary
// (PROFSYM_UPSTREAM), takes minutes of both cores, and its figures go to
// notes, so it skips unless PROFSYM_UPSTREAM is set. It
// is Test-shaped because the fixture helpers take *testing.T.
//
// The fixtures run in two phases, the JVMs (javaJDKs in both modes;
// JAVAE2E=jdk17,jdk8-sid,... picks JDKs), then the Pythons (pyInterps),
// under both profilers at once. Each fixture warms until both outputs name
// its warm frame (or 90 s, then it is noted), does its measured work, and
// its samples stamped from "go" to "done" (the JVM's main thread only) are
// counted in each output.
func TestBenchRuntimesVsUpstream(t *testing.T) {
	up := os.Getenv("PROFSYM_UPSTREAM")
	if up == "" {
		t.Skip("PROFSYM_UPSTREAM not set: a benchmark, make bench-runtimes runs it")
	}
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	if _, err := os.Stat(up); err != nil {
		t.Fatalf("PROFSYM_UPSTREAM: %v", err)
	}
	if _, err := os.Stat("/sys/kernel/tracing/events"); err != nil {
		// Upstream attaches to tracepoints through tracefs.
		if out, err := exec.Command("mount", "-t", "tracefs", "tracefs", "/sys/kernel/tracing").CombinedOutput(); err != nil {
			t.Fatalf("mounting tracefs: %v %s", err, out)
		}
	}

	prof, profOut := startDefaultCollector(t, bin)
	sink, upOut, otlp := startUpstreamSink(t, bin)
	agent := startUpstream(t, up, otlp, upOut)
	t.Logf("outputs: profsym %s, upstream %s", profOut, upOut)

	type phase struct {
		kind      string
		runs      []*pyRun
		typ, warm string
		check     func(up bool) benchCheck
	}
	jm, pm := javaMarks(t), pyMarks(t)
	javaCheck := func(up bool) benchCheck {
		c := benchCheck{
			keep:  func(s sampleOf) bool { return s.thread == javaMainComm },
			off:   func(f []userFrame) bool { return javaOffChain(f, jm) },
			whole: func(r *pyRun, f []userFrame) (bool, string) { return javaWhole(f, r.depth, r.virtual, jm) },
		}
		if up {
			c.prep = upstreamJava
		}
		return c
	}
	pyCheck := func(bool) benchCheck {
		return benchCheck{whole: func(r *pyRun, f []userFrame) (bool, string) { return pyWhole(f, r.script, r.depth, pm) }}
	}
	var rows []benchRow
	var warmNotes []string
	for _, p := range []phase{
		{kind: "Java", typ: "jvm", warm: javaWarmFrame, check: javaCheck},
		{kind: "Python", typ: "cpython", warm: "warm", check: pyCheck},
	} {
		if p.kind == "Java" {
			p.runs = startJavas(t, strconv.Itoa(pyChainSeconds), false) // it counts main threads
		} else {
			var runs []*pyRun
			for _, it := range pyInterps(t) {
				runs = append(runs, startPy(t, it))
			}
			p.runs = runs
		}
		began := time.Now()
		warmNotes = append(warmNotes, warmBoth(t, p.runs, p.typ, p.warm, profOut, upOut)...)
		t.Logf("%s: warm-up %v", p.kind, time.Since(began).Round(time.Second))
		waitPy(t, p.runs)
		time.Sleep(2500 * time.Millisecond) // the last reports of both
		for _, r := range p.runs {
			rows = append(rows, benchRow{name: r.it.name, r: r, prof: p.check(false), up: p.check(true)})
			// Free the CPU and memory of the done fixtures for the next phase.
			r.cmd.Process.Kill()
		}
	}
	agent.stop(t)
	time.Sleep(1500 * time.Millisecond) // upstream's last export
	sink.stop(t)
	prof.stop(t)

	var b strings.Builder
	fmt.Fprintf(&b, "bench-runtimes %s (profsym vs upstream %s)\n", time.Now().UTC().Format(time.RFC3339), up)
	fmt.Fprintf(&b, "%-20s %-20s %-20s %-20s %s\n", "fixture", "profsym whole/total", "upstream whole/total",
		"upstream chain-only", "off-chain profsym/upstream")
	var behind []string
	upSplit := upstreamSamples(t, upOut)
	for _, row := range rows {
		pc := benchCount(t, profOut, row.r, row.prof)
		uc := benchCount(t, upSplit, row.r, row.up)
		fmt.Fprintf(&b, "%-20s %-20s %-20s %-20s %d/%d\n", row.name, benchShare(pc.whole, pc.total),
			benchShare(uc.whole, uc.total), benchShare(uc.chain, uc.total), pc.off, uc.off)
		t.Logf("%s (pid %d): profsym %d/%d, upstream %d/%d (chain-only %d)", row.name, row.r.pid,
			pc.whole, pc.total, uc.whole, uc.total, uc.chain)
		if len(pc.bad) > 0 {
			t.Logf("  profsym's others (leaf first):\n%s", topCounts(pc.bad, 4))
		}
		if len(uc.bad) > 0 {
			t.Logf("  upstream's others (leaf first):\n%s", topCounts(uc.bad, 4))
		}
		// Held against upstream's better figure, chain-only.
		if uc.chain > 0 && pc.total > 0 && float64(pc.whole)/float64(pc.total) < float64(uc.chain)/float64(uc.total) {
			behind = append(behind, row.name)
		}
	}
	for _, n := range warmNotes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if len(behind) > 0 {
		fmt.Fprintf(&b, "profsym behind upstream (chain-only): %s\n", strings.Join(behind, ", "))
	} else {
		fmt.Fprintf(&b, "profsym >= upstream (chain-only) on every case upstream walks\n")
	}
	t.Logf("\n%s", b.String())
	res := filepath.Join(testfixture.Root(t), "_build", "bench-runtimes.txt")
	if err := os.WriteFile(res, []byte(b.String()), 0o644); err != nil {
		t.Errorf("writing %s: %v", res, err)
	}
	if t.Failed() {
		t.Logf("upstream's log (tail):\n%s", tail(agent.log.String(), 4000))
	}
}

// benchCheck says what is counted of a fixture's samples in one output.
type benchCheck struct {
	keep  func(s sampleOf) bool                        // the samples counted (nil: all)
	prep  func(f []userFrame) []userFrame              // the frames as profsym names them (nil: as is)
	off   func(f []userFrame) bool                     // a whole walk of the fixture's code outside the chain
	whole func(r *pyRun, f []userFrame) (bool, string) // whether f holds the chain, else what it holds
}

// benchRow is one fixture's line of the table, with what is counted in
// each output.
type benchRow struct {
	name     string
	r        *pyRun
	prof, up benchCheck
}

func benchShare(whole, total int64) string {
	if total == 0 {
		return "0/0"
	}
	return fmt.Sprintf("%d/%d %.1f%%", whole, total, 100*float64(whole)/float64(total))
}

// benchCounts is one fixture's samples of its measured work in one output.
type benchCounts struct {
	total, whole int64
	chain        int64            // whole once the frames below the chain's root are cut off
	off          int64            // walks of code outside the chain, not in total
	bad          map[string]int64 // the others, by what they hold
}

// benchCount counts r's samples of its measured work in the output at
// path. Samples whole walks of the fixture's own code outside the chain
// (JChain.main reading its CPU clock between calls) are counted apart,
// in both outputs: they say nothing of either walker. chain forgives
// frames below the root (upstream's "<interpreter trampoline>" entry
// frame of 3.12, an unnamed one on 3.14), which profsym's check does not.
func benchCount(t *testing.T, path string, r *pyRun, c benchCheck) benchCounts {
	t.Helper()
	n := benchCounts{bad: map[string]int64{}}
	eachSampleOf(t, path, map[int64]bool{r.pid: true}, func(s sampleOf) {
		if s.time < r.goNs || s.time > r.doneNs || c.keep != nil && !c.keep(s) {
			return
		}
		f := s.frames
		if c.prep != nil {
			f = c.prep(f)
		}
		if c.off != nil && c.off(f) {
			n.off += s.n
			return
		}
		n.total += s.n
		ok, desc := c.whole(r, f)
		if ok {
			n.whole += s.n
		} else {
			n.bad[desc] += s.n
		}
		if ok {
			n.chain += s.n
		} else if ok, _ := c.whole(r, belowRootCut(f)); ok {
			n.chain += s.n
		}
	})
	return n
}

// belowRootCut returns frames up to the chain's root (its outermost
// frame, Python's <module> or Java's main), dropping what lies below it.
func belowRootCut(frames []userFrame) []userFrame {
	for i, f := range frames {
		if f.typ == "cpython" && f.fn == pyChain[len(pyChain)-1] || f.typ == "jvm" && f.fn == javaClass+"."+javaChain[len(javaChain)-1] {
			return frames[:i+1]
		}
	}
	return frames
}

// javaOffChain says whether frames are a whole walk of JChain.main outside
// the chain: every Java frame named, none of the chain's callees, the
// outermost main on a line not marked as the chain's.
func javaOffChain(frames []userFrame, marks map[string][]int64) bool {
	var root *userFrame
	for i, f := range frames {
		if f.typ != "jvm" {
			continue
		}
		if f.raw || slices.ContainsFunc(javaChain[:len(javaChain)-1], func(m string) bool { return f.fn == javaClass+"."+m }) {
			return false
		}
		if f.path != "" {
			root = &frames[i]
		}
	}
	return root != nil && root.fn == javaClass+"."+javaChain[len(javaChain)-1] && !slices.Contains(marks[javaChain[len(javaChain)-1]], root.line)
}

// upstreamJava returns frames with upstream's Java function names
// ("void e2e.JChain.hotLoop(long)") as profsym gives them
// ("e2e.JChain.hotLoop"): the class-qualified method without its return
// type and parameters.
func upstreamJava(frames []userFrame) []userFrame {
	out := make([]userFrame, len(frames))
	for i, f := range frames {
		if f.typ == "jvm" && !f.raw {
			f.fn = upstreamJavaName(f.fn)
		}
		out[i] = f
	}
	return out
}

func upstreamJavaName(fn string) string {
	if i := strings.IndexByte(fn, '('); i >= 0 {
		fn = fn[:i]
	}
	if i := strings.LastIndexByte(fn, ' '); i >= 0 {
		fn = fn[i+1:]
	}
	return fn
}

// warmBoth waits until both outputs name each fixture's warm frame (of
// type typ) and has each start its measured work then; after 90 s the
// rest start anyway, noted: a profiler that never named a fixture walks
// none of its chain either, which the table shows.
func warmBoth(t *testing.T, runs []*pyRun, typ, warm, profOut, upOut string) []string {
	t.Helper()
	type seen struct{ prof, up bool }
	pending := map[int64]*seen{}
	byPid := map[int64]*pyRun{}
	for _, r := range runs {
		pending[r.pid], byPid[r.pid] = &seen{}, r
	}
	named := func(path string, up bool) {
		pids := map[int64]bool{}
		for pid := range pending {
			pids[pid] = true
		}
		eachSampleOf(t, path, pids, func(s sampleOf) {
			st := pending[s.pid]
			if st == nil {
				return
			}
			for _, f := range s.frames {
				fn := f.fn
				if up && typ == "jvm" {
					fn = upstreamJavaName(fn)
				}
				if f.typ == typ && fn == warm {
					if up {
						st.up = true
					} else {
						st.prof = true
					}
				}
			}
		})
	}
	deadline := time.Now().Add(90 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		named(profOut, false)
		named(upstreamSamples(t, upOut), true)
		for pid, st := range pending {
			if st.prof && st.up {
				byPid[pid].start(t)
				delete(pending, pid)
			}
		}
	}
	var notes []string
	for pid, st := range pending {
		r := byPid[pid]
		var by []string
		if !st.prof {
			by = append(by, "profsym")
		}
		if !st.up {
			by = append(by, "upstream")
		}
		notes = append(notes, fmt.Sprintf("%s (pid %d): warm frame not named in 90 s by %s", r.it.name, pid, strings.Join(by, ", ")))
		r.start(t)
	}
	return notes
}

// startUpstreamSink runs an otelcol-profsym that writes the OTLP profiles
// upstream sends it to a file; it returns it, the file's path and its
// OTLP gRPC endpoint.
func startUpstreamSink(t *testing.T, bin string) (*collector, string, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "upstream-sink.yaml")
	if err := os.WriteFile(cfg, []byte(upstreamSinkConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "upstream.json")
	otlp := fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(t))
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_UPSTREAM_OTLP=" + otlp,
	}
	return startCollector(t, bin, "upstream-sink", env, cfg), out, otlp
}

// upstreamAgent is the running upstream profiler.
type upstreamAgent struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	exited chan struct{}
}

// startUpstream runs the upstream profiler at profsym's settings (99 Hz,
// reports every second, on-CPU only) sending to the sink, and waits until
// its first profiles are in the sink's file.
func startUpstream(t *testing.T, bin, endpoint, sinkOut string) *upstreamAgent {
	t.Helper()
	a := &upstreamAgent{log: new(syncBuffer), exited: make(chan struct{})}
	a.cmd = exec.Command(bin, "-collection-agent", endpoint, "-disable-tls",
		"-reporter-interval", "1s", "-samples-per-second", "99", "-off-cpu-threshold", "0")
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() { a.stop(t) })
	deadline := time.Now().Add(90 * time.Second)
	for {
		if fi, err := os.Stat(sinkOut); err == nil && fi.Size() > 0 {
			return a
		}
		select {
		case <-a.exited:
			t.Fatalf("upstream exited (%v) before its first profiles:\n%s", a.cmd.ProcessState, a.log.String())
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no profiles from upstream in 90 s:\n%s", tail(a.log.String(), 4000))
		}
	}
}

// stop ends upstream with SIGINT, as a user's ^C.
func (a *upstreamAgent) stop(t *testing.T) {
	select {
	case <-a.exited:
		return
	default:
	}
	a.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		<-a.exited
		t.Logf("upstream did not stop within 30 s of SIGINT: killed")
	}
}

// upstreamSamples rewrites upstream's profiles file at path for
// eachSampleOf: every sample without values becomes one sample of value 1
// per timestamp. It returns the new file's path.
func upstreamSamples(t *testing.T, path string) string {
	t.Helper()
	out := path + ".split.json"
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	var um pprofile.JSONUnmarshaler
	var m pprofile.JSONMarshaler
	var w bytes.Buffer
	for _, line := range bytes.Split(b, []byte("\n")) {
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			continue // blank, or being written
		}
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					ss := p.Samples()
					for i, n := 0, ss.Len(); i < n; i++ {
						s := ss.At(i)
						if s.Values().Len() > 0 {
							continue
						}
						ts := s.TimestampsUnixNano().AsRaw()
						if len(ts) == 0 {
							s.Values().Append(1)
							continue
						}
						for _, tn := range ts[1:] {
							c := ss.AppendEmpty()
							s.CopyTo(c)
							c.TimestampsUnixNano().FromRaw([]uint64{tn})
							c.Values().FromRaw([]int64{1})
						}
						s.TimestampsUnixNano().FromRaw(ts[:1])
						s.Values().FromRaw([]int64{1})
					}
				}
			}
		}
		j, err := m.MarshalProfiles(pd)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(j)
		w.WriteByte('\n')
	}
	if err := os.WriteFile(out, w.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
