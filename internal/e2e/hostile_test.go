package e2e

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"go.yaml.in/yaml/v3"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// The "done when" of issue 10, end to end: a gateway (the distribution
// binary with the Helm chart's rendered configuration and environment,
// GOMEMLIMIT included, inside a memory cgroup of the chart's container
// limit) is fed batches that mix every hostile case with healthy frames.
// It must stay alive within its memory, never open a file outside the
// directories it is configured with (every open is recorded with strace),
// and name the healthy frames of those same batches.
func TestGatewayHostileInput(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "a memory cgroup and strace need root")
	}
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	strace := testfixture.NeedTool(t, "strace")
	work := t.TempDir()
	dirs := map[string]string{}
	for _, d := range []string{"root", "debug", "symbols", "cache", "out", "served"} {
		dirs[d] = filepath.Join(work, d)
		os.MkdirAll(dirs[d], 0o755)
	}

	// Healthy binaries: one in the local root (with DWARF), one stripped
	// whose debug file is in the debug directory, one stripped whose debug
	// file only a real debuginfod serves.
	healthy := map[string]healthyBin{}
	for i, name := range []string{"alpha", "beta", "gamma"} {
		full := testfixture.Build(t, testfixture.Spec{Name: "hostile-" + name, Lang: "c", Sources: []string{"processor/prog.c"},
			Args: []string{"-O2", "-g", "-Wl,--build-id", fmt.Sprintf("-DSEED=%d", 41+i)}})
		start, size := testfixture.Func(t, full, "hot")
		h := healthyBin{id: testfixture.BuildID(t, full), addr: start + size/2}
		switch name {
		case "alpha":
			copyFile(t, full, filepath.Join(dirs["root"], "bin", "alpha"))
			h.file = "/bin/alpha"
		case "beta":
			_, debug := testfixture.SplitDebug(t, full, false)
			copyFile(t, debug, filepath.Join(dirs["debug"], ".build-id", h.id[:2], h.id[2:]+".debug"))
			h.file = "/usr/bin/beta"
		case "gamma":
			_, debug := testfixture.SplitDebug(t, full, false)
			copyFile(t, debug, filepath.Join(dirs["served"], "gamma.debug"))
			h.file = "/usr/bin/gamma"
		}
		healthy[name] = h
	}
	longBin, longName := longNameBin(t, dirs["symbols"])
	longStart, longSize := testfixture.Func(t, longBin, longName)

	// Traps: what an escape would reach. Each carries the identity of a
	// real program, so a frame that reached one would be named.
	decoy := testfixture.Build(t, testfixture.Spec{Name: "hostile-decoy", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id", "-DSEED=49"}})
	outside := filepath.Join(work, "outside")
	copyFile(t, decoy, outside)
	secret := filepath.Join(work, "secret")
	copyFile(t, decoy, secret)
	decoyHTL := htlhash(t, decoy)
	decoyStart, decoySize := testfixture.Func(t, decoy, "hot")
	decoyAddr := decoyStart + decoySize/2

	// Hostile files in the local root and the symbol directory: FIFOs,
	// sparse 1 TiB files, a link to /etc/shadow, a link out of the folder.
	for _, d := range []string{filepath.Join(dirs["root"], "bin"), dirs["symbols"]} {
		os.MkdirAll(d, 0o755)
		if err := syscall.Mkfifo(filepath.Join(d, "fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		huge := filepath.Join(d, "huge")
		copyFile(t, decoy, huge)
		if err := os.Truncate(huge, 1<<40); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("/etc/shadow", filepath.Join(dirs["root"], "bin", "evil"))
	os.Symlink(secret, filepath.Join(dirs["symbols"], "link"))

	real := testfixture.StartDebuginfod(t, dirs["served"], healthy["gamma"].id+"/debuginfo")

	// The chart, rendered with its defaults, pointed at this test's folders
	// and ports, and the local source over a root (as a gateway given a
	// host mount would run it).
	vals := renderValues{
		health: testfixture.FreePort(t), metrics: testfixture.FreePort(t),
		grpc: testfixture.FreePort(t), http: testfixture.FreePort(t), dirs: dirs,
	}
	hostile := newHostileServer(t)
	vals.urls = []string{hostile.URL, real.URL}
	gw := renderGateway(t, root, vals)
	t.Logf("chart: memory limit %d MiB, GOMEMLIMIT %s, max_decompressed_bytes %d MiB, cache max_bytes %d MiB, timeout %v, fetch_wait %v",
		gw.limit>>20, gw.env["GOMEMLIMIT"], gw.maxDecompressed>>20, gw.maxBytes>>20, gw.timeout, gw.fetchWait)
	// Zlib bombs that each inflate to just within the per-file limit (four:
	// together well past the container), one whose three sections claim
	// 2 GiB each, a body that never ends and one that trickles.
	bombs := hostile.bombs(t, 4, gw.maxDecompressed-(1<<20))
	overclaim := hostile.overclaim(t)
	endless, trickle := hostile.endless(), hostile.trickle()

	cg := testfixture.NewMemoryCgroup(t, gw.limit)
	trace := filepath.Join(work, "opens.trace")
	argv := cg.Wrap(append([]string{strace, "-f", "-qq", "-ttt", "-s", "4096", "-e", "trace=open,openat,openat2,creat,execve", "-o", trace, "--", bin}, gw.args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = gw.environ
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.Dir = work
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
	})
	if err := waitHealthy(fmt.Sprintf("http://127.0.0.1:%d", vals.health), exited); err != nil {
		t.Fatalf("the gateway did not become healthy: %v\n%s", err, log.String())
	}
	pid := tracee(t, cmd.Process.Pid)

	// Memory, sampled throughout.
	var mem memWatch
	stopWatch := mem.watch(pid, cg)

	cases := []hostileCase{
		{name: "alpha (local)", file: healthy["alpha"].file, gnu: healthy["alpha"].id, addr: healthy["alpha"].addr, want: "hot"},
		{name: "beta (debug directory)", file: healthy["beta"].file, gnu: healthy["beta"].id, addr: healthy["beta"].addr, want: "hot"},
		{name: "gamma (debuginfod)", file: healthy["gamma"].file, gnu: healthy["gamma"].id, addr: healthy["gamma"].addr, want: "hot"},
		{name: "500 KB name", file: "/usr/bin/long", gnu: testfixture.BuildID(t, longBin), addr: longStart + longSize/2, want: "NNNN"},
		{name: "1 MiB build id", file: "/case/huge-id", gnu: strings.Repeat("ab", 1<<19), addr: 0x1000, reasons: "invalid_build_id"},
		{name: "../ build id", file: "/case/dotdot-id", gnu: "..//../../../../etc/passwd", addr: 0x1000, reasons: "invalid_build_id"},
		{name: "/../ file name", file: "/../../outside", htl: decoyHTL, addr: decoyAddr, reasons: "no_debug_info"},
		{name: "link to /etc/shadow", file: "/bin/evil", htl: randomHex(16), addr: 0x1000, reasons: "no_debug_info"},
		{name: "/proc/self/environ", file: "/proc/self/environ", htl: randomHex(16), addr: 0x1000, reasons: "no_debug_info"},
		{name: "FIFO", file: "/bin/fifo", htl: randomHex(16), addr: 0x1000, reasons: "invalid_path"},
		{name: "sparse 1 TiB", file: "/bin/huge", htl: randomHex(16), addr: 0x1000, reasons: "limit_exceeded"},
		{name: "2 GiB claims", file: "/case/overclaim", gnu: overclaim, addr: 0x1000, reasons: "limit_exceeded timeout pending"},
		{name: "endless body", file: "/case/endless", gnu: endless, addr: 0x1000, reasons: "pending timeout limit_exceeded fetch_failed",
			final: "timeout limit_exceeded fetch_failed"},
		{name: "trickling body", file: "/case/trickle", gnu: trickle, addr: 0x1000, reasons: "pending timeout limit_exceeded fetch_failed"},
	}
	for i, id := range bombs {
		cases = append(cases, hostileCase{name: fmt.Sprintf("zlib bomb %d", i), file: fmt.Sprintf("/case/bomb%d", i), gnu: id, addr: 0x1000,
			reasons: "corrupt_file no_debug_info limit_exceeded timeout pending", final: "corrupt_file no_debug_info"})
	}

	// Batches as an agent sends them, until one names every healthy frame
	// (the debuginfod one may be pending in the first), at least four went,
	// and the work batches stopped waiting for (downloads, bombs inflating)
	// has settled in the background, every frame but the trickling one at
	// its final reason: memory is watched throughout.
	url := fmt.Sprintf("http://127.0.0.1:%d/v1development/profiles", vals.http)
	firstBatch := time.Now()
	var batches, refused int
	var slowest time.Duration
	deadline := time.Now().Add(3 * time.Minute)
	allNamed, settled := false, false
	var unsettled []string
	for n := 1; time.Now().Before(deadline) && (n <= 4 || !allNamed || !settled); n++ {
		if n > 1 {
			time.Sleep(500 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) != nil {
			t.Errorf("the gateway died at batch %d", n)
			break
		}
		start := time.Now()
		status, err := send(url, hostileBatch(n, cases))
		took := time.Since(start)
		slowest = max(slowest, took)
		if err != nil || status != http.StatusOK {
			refused++
			t.Logf("batch %d: %v, HTTP %d after %v", n, err, status, took)
			time.Sleep(time.Second) // an agent retries
			continue
		}
		batches++
		got := readOutcomes(t, filepath.Join(dirs["out"], "profiles.jsonl"), n)
		allNamed = true
		for _, c := range cases[:4] {
			allNamed = allNamed && got[c.file].named(c.want)
		}
		unsettled = nil
		for _, c := range cases {
			r := got[c.file].reason
			if c.gnu != trickle && (r == "pending" || c.final != "" && !strings.Contains(" "+c.final+" ", " "+r+" ")) {
				unsettled = append(unsettled, c.name)
			}
		}
		wasSettled := settled
		settled = len(unsettled) == 0
		t.Logf("batch %d: %v; healthy named: %v; trickling body %s; unsettled: %v", n, took.Round(time.Millisecond), allNamed,
			got["/case/trickle"].reason, unsettled)
		if n == 1 || allNamed && (n <= 4 || settled && !wasSettled) {
			checkOutcomes(t, n, cases, got, allNamed)
		}
	}
	if !settled {
		t.Errorf("not settled after %v: %v", time.Since(firstBatch).Round(time.Second), unsettled)
	}
	// The telemetry a user alerts on shows the trickling download.
	metrics := scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", vals.metrics))
	inFlight, oldest := metrics["otelcol_symbolization_debuginfod_downloads_in_flight"], metrics["otelcol_symbolization_debuginfod_oldest_download"]
	t.Logf("telemetry: %v downloads in flight, the oldest for %.0f s; frames pending %v, unresolved by limit_exceeded %v",
		inFlight, oldest, metrics[`otelcol_symbolization_frames_unresolved{reason="pending"}`],
		metrics[`otelcol_symbolization_frames_unresolved{reason="limit_exceeded"}`])
	if inFlight < 1 || oldest < gw.fetchWait.Seconds() {
		t.Errorf("telemetry does not show the trickling download: in flight %v, oldest %v s", inFlight, oldest)
	}
	rss := stopWatch()

	// Stop as Kubernetes would; the gateway must go cleanly.
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("the gateway exited with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("the gateway did not stop within 60 s of SIGTERM")
	}
	_, cgPeak, oomKills := cg.Stats()
	t.Logf("%d batches accepted, %d refused, slowest %v; RSS start %d MiB, peak %d MiB (VmHWM %d MiB); cgroup peak %d MiB of %d MiB; OOM kills %d",
		batches, refused, slowest.Round(time.Millisecond), rss.start>>20, rss.peak>>20, rss.hwm>>20, cgPeak>>20, gw.limit>>20, oomKills)

	if !allNamed {
		t.Errorf("no batch named every healthy frame within 3 minutes\ngateway log:\n%s", tail(log.String(), 4000))
	}
	if oomKills != 0 || rss.hwm >= gw.limit {
		t.Errorf("the gateway ran out of its %d MiB: OOM kills %d, VmHWM %d MiB", gw.limit>>20, oomKills, rss.hwm>>20)
	}
	// Within its budget: the caches' bound plus what it held before the
	// first batch, with 20% slack (the fleet-size tests' margin).
	if budget := rss.start + gw.budget*12/10; rss.hwm > budget {
		t.Errorf("VmHWM %d MiB over the start %d MiB + caches' budget %d MiB + 20%%", rss.hwm>>20, rss.start>>20, gw.budget>>20)
	}
	// The trickling and endless bodies, and the bombs' inflating, go on in
	// the background: no batch waits for them longer than fetch_wait, so
	// none takes the batch timeout (before: every batch took it, 10 s).
	if slowest >= gw.timeout/2 {
		t.Errorf("a batch took %v; the batch timeout is %v, fetch_wait %v", slowest, gw.timeout, gw.fetchWait)
	}
	if n := dirSize(dirs["cache"]); n > gw.maxCacheBytes {
		t.Errorf("the debuginfod cache holds %d MiB, over its %d MiB", n>>20, gw.maxCacheBytes>>20)
	}
	checkOpens(t, trace, work, pid, firstBatch, []string{dirs["root"], dirs["debug"], dirs["symbols"], dirs["cache"], dirs["out"], gw.config},
		[]string{outside, secret})
}

type healthyBin struct {
	id, file string
	addr     uint64
}

// hostileCase is one frame of the batch and what must become of it: named
// with a function starting with want, or left raw with one of reasons.
type hostileCase struct {
	name, file, gnu, htl string
	addr                 uint64
	want, reasons        string
	// final, if set, are the reasons the frame ends with once the work
	// batches stopped waiting for is done (a bomb refused while another
	// inflates, limit_exceeded, is tried again until it has inflated).
	final string
}

type outcome struct {
	fn, reason, incomplete string
	line                   int64
	seen                   bool
}

func (o outcome) named(prefix string) bool { return strings.HasPrefix(o.fn, prefix) }

func checkOutcomes(t *testing.T, batch int, cases []hostileCase, got map[string]outcome, final bool) {
	t.Helper()
	var summary []string
	for _, c := range cases {
		o := got[c.file]
		summary = append(summary, fmt.Sprintf("%s: %s", c.name, strings.TrimSpace(fmt.Sprintf("%.12s %s %s", o.fn, o.reason, o.incomplete))))
		switch {
		case !o.seen:
			t.Errorf("batch %d, %s: frame not in the output", batch, c.name)
		case c.want != "" && final:
			if !o.named(c.want) || len(o.fn) > frame.DefaultMaxNameBytes {
				t.Errorf("batch %d, %s: named %.40q (%d bytes), reason %q; want %s", batch, c.name, o.fn, len(o.fn), o.reason, c.want)
			}
			if c.want == "hot" && o.line == 0 {
				t.Errorf("batch %d, %s: no line", batch, c.name)
			}
		case c.want == "":
			if o.fn != "" || !strings.Contains(" "+c.reasons+" ", " "+o.reason+" ") {
				t.Errorf("batch %d, %s: named %.40q, reason %q; want raw with one of %s", batch, c.name, o.fn, o.reason, c.reasons)
			}
		}
	}
	t.Logf("batch %d: %s", batch, strings.Join(summary, "; "))
}

// hostileBatch is one profile: a sample per case and one stack with every
// case, each frame in a mapping of its own, under one process resource.
func hostileBatch(n int, cases []hostileCase) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	rp := pd.ResourceProfiles().AppendEmpty()
	rp.Resource().Attributes().PutInt(frame.AttrPID, 4242)
	rp.Resource().Attributes().PutInt("test.batch", int64(n))
	prof := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	native := d.AttrStr(frame.AttrFrameType, frame.TypeNative)
	var all []int32
	for _, c := range cases {
		var attrs []int32
		if c.gnu != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDGNU, c.gnu))
		}
		if c.htl != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDHTL, c.htl))
		}
		mi := d.Mapping(pdict.Mapping{Start: 0x400000, Limit: 0x800000, File: c.file, Attrs: attrs})
		li := d.Location(pdict.Location{Mapping: mi, Address: c.addr, Attrs: []int32{native}})
		all = append(all, li)
		s := prof.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack([]int32{li}))
		s.Values().Append(1)
	}
	s := prof.Samples().AppendEmpty()
	s.SetStackIndex(d.Stack(all))
	s.Values().Append(1)
	return pd
}

// scrape reads a Prometheus text endpoint: series (name and labels as
// printed) to value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("metrics: %v", err)
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func send(url string, pd pprofile.Profiles) (int, error) {
	body, err := pprofileotlp.NewExportRequestFromProfiles(pd).MarshalProto()
	if err != nil {
		return 0, err
	}
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Post(url, "application/x-protobuf", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// readOutcomes finds batch n in the gateway's output: per mapping file
// name, what became of its location.
func readOutcomes(t *testing.T, path string, n int) map[string]outcome {
	t.Helper()
	out := map[string]outcome{}
	b, _ := os.ReadFile(path)
	var um pprofile.JSONUnmarshaler
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			continue
		}
		mine := false
		for _, rp := range pd.ResourceProfiles().All() {
			if v, ok := rp.Resource().Attributes().Get("test.batch"); ok && v.Int() == int64(n) {
				mine = true
			}
		}
		if !mine {
			continue
		}
		d := pdict.New(pd.Dictionary())
		dict := pd.Dictionary()
		for i, loc := range dict.LocationTable().All() {
			if i == 0 {
				continue
			}
			m := dict.MappingTable().At(int(loc.MappingIndex()))
			o := outcome{seen: true}
			if v, ok := d.FindAttr(loc.AttributeIndices(), frame.AttrError); ok {
				o.reason = v.Str()
			}
			if v, ok := d.FindAttr(loc.AttributeIndices(), frame.AttrIncomplete); ok {
				o.incomplete = v.Str()
			}
			if loc.Lines().Len() > 0 {
				ln := loc.Lines().At(loc.Lines().Len() - 1)
				o.fn = d.Str(dict.FunctionTable().At(int(ln.FunctionIndex())).NameStrindex())
				o.line = loc.Lines().At(0).Line()
			}
			out[d.Str(m.FilenameStrindex())] = o
		}
	}
	return out
}

// renderValues are the test's overrides of the chart's defaults.
type renderValues struct {
	health, metrics, grpc, http int
	dirs                        map[string]string
	urls                        []string
}

// gatewayRun is the rendered chart as the test runs it.
type gatewayRun struct {
	config, output                           string
	args, environ                            []string
	env                                      map[string]string
	limit, maxBytes, maxDecompressed, budget int64
	maxCacheBytes                            int64
	timeout, fetchWait                       time.Duration
}

func renderGateway(t *testing.T, root string, v renderValues) gatewayRun {
	t.Helper()
	helm := testfixture.Helm(t)
	work := filepath.Dir(v.dirs["root"])
	values := fmt.Sprintf(`
healthCheck: {port: %d}
telemetry: {metricsPort: %d}
agent: {enabled: false}
# The symbol store (a StatefulSet the gateway reads over HTTP) is not under
# test here, and its scratch path is the pod's, not this test's tree.
symbols: {enabled: false}
gateway:
  # The hostile agent here holds the intake token (a compromised agent
  # does): what is under test is what it sends, so the intake is open.
  auth: {enabled: false}
  listen: 127.0.0.1:%d
  httpListen: 127.0.0.1:%d
  cache: {mountPath: %q}
  fileOutput: {path: %q}
  symbolization:
    sources: [local, debug_directories, symbol_directories, debuginfod, kernel]
    debuginfodURLs: [%q, %q]
    debugDirectories: [%q]
    symbolDirectories: [%q]
  config:
    processors:
      symbolization:
        local: {root: %q}
`, v.health, v.metrics, v.grpc, v.http, v.dirs["cache"], filepath.Join(v.dirs["out"], "profiles.jsonl"),
		v.urls[0], v.urls[1], v.dirs["debug"], v.dirs["symbols"], v.dirs["root"])
	vf := filepath.Join(work, "values.yaml")
	os.WriteFile(vf, []byte(values), 0o644)
	out, err := exec.Command(helm, "template", "ps", filepath.Join(root, "deploy", "helm", "profsym"), "-f", vf).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("helm template: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var g gatewayRun
	g.env = map[string]string{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			break
		}
		meta, _ := o["metadata"].(map[string]any)
		if meta["name"] != "ps-gateway" {
			continue
		}
		switch o["kind"] {
		case "ConfigMap":
			text := o["data"].(map[string]any)["config.yaml"].(string)
			g.config = filepath.Join(work, "gateway.yaml")
			os.WriteFile(g.config, []byte(text), 0o644)
			var cfg map[string]any
			yaml.Unmarshal([]byte(text), &cfg)
			sym := dig(cfg, "processors", "symbolization").(map[string]any)
			g.maxBytes = toInt(dig(sym, "cache", "max_bytes"))
			g.maxDecompressed = toInt(dig(sym, "limits", "max_decompressed_bytes"))
			g.maxCacheBytes = toInt(dig(sym, "debuginfod", "max_cache_bytes"))
			g.timeout, _ = time.ParseDuration(fmt.Sprint(sym["timeout"]))
			g.fetchWait, _ = time.ParseDuration(fmt.Sprint(sym["fetch_wait"]))
			g.budget = g.maxBytes + toInt(dig(sym, "cache", "max_result_bytes"))*5/4 + toInt(dig(sym, "cache", "max_demangled_bytes")) +
				toInt(dig(sym, "cache", "max_objects"))*1300
		case "Deployment":
			c := dig(o, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
			for _, a := range c["args"].([]any) {
				g.args = append(g.args, fmt.Sprint(a))
			}
			for _, e := range c["env"].([]any) {
				e := e.(map[string]any)
				if val, ok := e["value"].(string); ok {
					g.env[e["name"].(string)] = val
				}
			}
			g.limit = quantityBytes(t, fmt.Sprint(dig(c, "resources", "limits", "memory")))
		}
	}
	if g.config == "" || g.limit == 0 || g.maxDecompressed == 0 || g.timeout == 0 || g.fetchWait == 0 {
		t.Fatalf("rendered gateway incomplete: %+v\n%s", g, out)
	}
	for i, a := range g.args {
		if strings.HasPrefix(a, "--config=") {
			g.args[i] = "--config=" + g.config
		}
	}
	g.env["MY_POD_IP"] = "127.0.0.1"
	g.environ = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	for k, val := range g.env {
		g.environ = append(g.environ, k+"="+val)
	}
	if g.env["GOMEMLIMIT"] == "" {
		t.Fatal("the chart sets no GOMEMLIMIT for the gateway")
	}
	return g
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	return v
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case float64:
		return int64(x)
	}
	return 0
}

func quantityBytes(t *testing.T, q string) int64 {
	for suffix, mult := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err == nil {
				return v * mult
			}
		}
	}
	v, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		t.Fatalf("memory limit %q", q)
	}
	return v
}

// hostileServer answers the debuginfod protocol for the ids it was told
// about, each in its own hostile way, and 404 for the rest.
type hostileServer struct {
	*httptest.Server
	mu     sync.Mutex
	routes map[string]http.HandlerFunc
}

func newHostileServer(t *testing.T) *hostileServer {
	h := &hostileServer{routes: map[string]http.HandlerFunc{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /buildid/ID/debuginfo or /buildid/ID/executable
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		var f http.HandlerFunc
		if len(parts) == 3 && parts[0] == "buildid" {
			h.mu.Lock()
			f = h.routes[parts[1]]
			h.mu.Unlock()
		}
		if f == nil {
			http.NotFound(w, r)
			return
		}
		f(w, r)
	}))
	t.Cleanup(h.Server.CloseClientConnections)
	t.Cleanup(h.Close)
	return h
}

func (h *hostileServer) serve(id string, f http.HandlerFunc) string {
	h.mu.Lock()
	h.routes[id] = f
	h.mu.Unlock()
	return id
}

func serveBytes(b []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

// bombs serves n debug files whose .debug_info inflates to size bytes of
// zeros each: within the per-file limit, far past it together.
func (h *hostileServer) bombs(t *testing.T, n int, size int64) []string {
	sec := testfixture.CompressedSection(t, ".debug_info", elf.COMPRESS_ZLIB, size, size)
	var ids []string
	for i := 0; i < n; i++ {
		id := randomHex(20)
		ids = append(ids, h.serve(id, serveBytes(testfixture.BuildELF(testfixture.BuildIDNote(t, id), sec))))
	}
	return ids
}

// overclaim serves a debug file of three sections each claiming 2 GiB.
func (h *hostileServer) overclaim(t *testing.T) string {
	id := randomHex(20)
	var secs []testfixture.Section
	secs = append(secs, testfixture.BuildIDNote(t, id))
	for _, name := range []string{".debug_info", ".debug_line", ".debug_str"} {
		secs = append(secs, testfixture.CompressedSection(t, name, elf.COMPRESS_ZLIB, 2<<30, 1<<20))
	}
	return h.serve(id, serveBytes(testfixture.BuildELF(secs...)))
}

// endless serves a body of zeros that never ends.
func (h *hostileServer) endless() string {
	return h.serve(randomHex(20), func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1<<20)
		for r.Context().Err() == nil {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	})
}

// trickle serves a body just fast enough for a per-read watchdog (8 KiB a
// second), forever.
func (h *hostileServer) trickle() string {
	return h.serve(randomHex(20), func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 8<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(buf); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(time.Second):
			}
		}
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return hex.EncodeToString(b)
}

func htlhash(t *testing.T, path string) string {
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return buildid.Identify(f).HTL
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(to), 0o755)
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// longNameBin builds, into dir, a program whose function's symbol is
// 500 KB long.
func longNameBin(t *testing.T, dir string) (bin, name string) {
	name = strings.Repeat("N", 500<<10)
	src := filepath.Join(t.TempDir(), "long.c")
	os.WriteFile(src, []byte(`__attribute__((noinline)) int f(int x) __asm__("`+name+`");
__attribute__((noinline)) int f(int x) { for (int i = 0; i < 1000; i++) x = x * 31 + i; return x; }
int main(int c, char **v) { return f(c); }
`), 0o644)
	bin = filepath.Join(dir, "long")
	if out, err := exec.Command(testfixture.NeedTool(t, "gcc"), "-O1", "-g", "-Wl,--build-id", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	return bin, name
}

func waitHealthy(url string, exited chan error) error {
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited: %v", err)
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("not healthy within 60 s")
}

// tracee returns the collector's pid: the child of strace (pid).
func tracee(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("strace has children %q", b)
	}
	c, _ := strconv.Atoi(f[0])
	return c
}

// memWatch samples a process's RSS and its cgroup's usage.
type memWatch struct {
	mu               sync.Mutex
	start, peak, hwm int64
}

func (m *memWatch) watch(pid int, cg *testfixture.MemoryCgroup) (stop func() memWatch) {
	read := func() (rss, hwm int64) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			f := strings.Fields(v)
			if len(f) == 0 {
				continue
			}
			n, _ := strconv.ParseInt(f[0], 10, 64)
			switch k {
			case "VmRSS":
				rss = n << 10
			case "VmHWM":
				hwm = n << 10
			}
		}
		return
	}
	m.start, m.hwm = read()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			rss, hwm := read()
			m.mu.Lock()
			m.peak, m.hwm = max(m.peak, rss), max(m.hwm, hwm)
			m.mu.Unlock()
		}
	}()
	return func() memWatch {
		close(done)
		wg.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		return memWatch{start: m.start, peak: m.peak, hwm: m.hwm}
	}
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// traceRE matches one recorded open: its time and path, finished or not.
var traceRE = regexp.MustCompile(`(?m)^\d+\s+(\d+\.\d+)\s+(?:open|openat|openat2|creat|execve)\((?:AT_FDCWD|-?\d+)?,?\s*"((?:[^"\\]|\\.)*)"`)

// checkOpens reads the strace log. No path the gateway tried to open is a
// trap or a secret of the host or of another process. Once batches come in,
// every open below the test's folder lies in a configured directory, and
// outside it only the collector's own periodic reads are allowed (its
// process telemetry under /proc, cgroup limits for the memory limiter).
// What the collector reads once at start (before any input) is logged.
func checkOpens(t *testing.T, trace, work string, pid int, input time.Time, allowed, traps []string) {
	t.Helper()
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	own := fmt.Sprintf("/proc/%d/", pid)
	periodic := []string{"/proc/self/", "/proc/thread-self/", own, "/proc/stat", "/proc/uptime", "/proc/meminfo",
		"/sys/fs/cgroup/", "/dev/urandom", "/dev/null"}
	forbidden := append([]string{"/etc/passwd", "/etc/shadow", "/etc/gshadow", "/proc/self/environ", "/proc/thread-self/environ", own + "environ"}, traps...)
	n, startup, bad := 0, map[string]bool{}, map[string]bool{}
	for _, m := range traceRE.FindAllStringSubmatch(string(b), -1) {
		sec, _ := strconv.ParseFloat(m[1], 64)
		at := time.Unix(0, int64(sec*1e9))
		p, err := strconv.Unquote(`"` + m[2] + `"`)
		if err != nil {
			p = m[2]
		}
		n++
		if filepath.IsAbs(p) {
			p = filepath.Clean(p)
		}
		ok := true
		for _, f := range forbidden {
			ok = ok && p != f
		}
		switch {
		case !ok:
		case strings.HasPrefix(p, work+"/"):
			ok = false
			for _, a := range allowed {
				ok = ok || p == a || strings.HasPrefix(p, a+"/")
			}
		case at.Before(input):
			startup[p] = true
		default:
			ok = false
			for _, s := range periodic {
				ok = ok || strings.HasPrefix(p, s)
			}
		}
		if !ok {
			bad[p] = true
		}
	}
	if n == 0 {
		t.Fatalf("strace recorded no open at all:\n%s", tail(string(b), 2000))
	}
	for p := range bad {
		t.Errorf("the gateway opened %q, outside its configured directories", p)
	}
	var st []string
	for p := range startup {
		if !strings.HasPrefix(p, "/sys/") && !strings.HasPrefix(p, "/proc/self/") {
			st = append(st, p)
		}
	}
	sort.Strings(st)
	t.Logf("%d opens recorded, %d outside the configured directories; read once at start, before any input: %v", n, len(bad), st)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
