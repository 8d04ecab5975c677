// Package e2e runs the distribution end to end, as real processes on
// loopback: a debuginfod server with the debug files of stripped fixture
// binaries, a gateway collector and an agent collector built from
// builder-config.yaml with the configs in config/, and the fixture
// workloads.
package e2e

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

const gates = "--feature-gates=service.profilesSupport"

// collector is one running otelcol-profsym.
type collector struct {
	name   string
	cmd    *exec.Cmd
	log    *syncBuffer
	health string
	exited chan struct{} // closed when the process has exited
}

// recording is a `profsym record` a test started (startRecord).
type recording struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	exited chan struct{}
	err    error
}

// startRecord starts bin (profsym) with args and returns once it says it
// samples; a recording still running at the test's end is killed.
func startRecord(t *testing.T, bin string, args ...string) *recording {
	t.Helper()
	r := &recording{cmd: exec.Command(bin, args...), log: new(syncBuffer), exited: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.exited
	})
	ready := time.Now().Add(90 * time.Second)
	for !strings.Contains(r.log.String(), "profsym record: sampling") {
		select {
		case <-r.exited:
			t.Fatalf("profsym record exited (%v) before sampling:\n%s", r.err, r.log.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(ready) {
			t.Fatalf("profsym record did not start sampling in 90 s:\n%s", r.log.String())
		}
	}
	return r
}

// stop interrupts the recording, as a user's ^C, and fails unless it
// writes its output and exits cleanly within 2 minutes.
func (r *recording) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-r.exited:
		if r.err != nil {
			t.Fatalf("profsym record: %v\n%s", r.err, r.log.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("profsym record did not finish within 2 min of SIGINT:\n%s", r.log.String())
	}
}

// syncBuffer is a log the process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDefaultCollector runs the distribution as a user would with
// config/default.yaml (and the configs in more merged over it), reporting
// every second to a file of its own, and returns it and the file's path.
func startDefaultCollector(t *testing.T, bin string, more ...string) (*collector, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "profiles.json")
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	configs := append([]string{filepath.Join(testfixture.Root(t), "config", "default.yaml")}, more...)
	return startCollector(t, bin, "collector", env, configs...), out
}

func startCollector(t *testing.T, bin, name string, env []string, configs ...string) *collector {
	testfixture.Short(t, "eBPF (the built collector samples this host)")
	t.Helper()
	c, err := launchCollector(t, bin, name, env, configs...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// errPortTaken: a port picked free was taken before the collector bound it
// (an outgoing connection's ephemeral port, another test).
var errPortTaken = errors.New("address already in use")

// launchCollector starts a collector and waits until it is healthy.
func launchCollector(t *testing.T, bin, name string, env []string, configs ...string) (*collector, error) {
	args := []string{gates}
	for _, c := range configs {
		args = append(args, "--config", c)
	}
	c := &collector{name: name, cmd: exec.Command(bin, args...), log: new(syncBuffer), exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PROFSYM_HEALTH_ENDPOINT="); ok {
			c.health = "http://" + v
		}
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() { c.stop(t) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(c.health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c, nil
			}
		}
		select {
		case <-c.exited:
			if strings.Contains(c.log.String(), errPortTaken.Error()) {
				return nil, fmt.Errorf("%s: %w", name, errPortTaken)
			}
			return nil, fmt.Errorf("%s exited (%v) before becoming healthy:\n%s", name, c.cmd.ProcessState, c.log.String())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not become healthy (last answer: %v):\n%s", name, err, c.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the collector gracefully (SIGTERM flushes exporters).
func (c *collector) stop(t *testing.T) {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
		t.Errorf("%s did not stop within 30s", c.name)
	}
}

// fixture is a stripped workload binary whose debug file only debuginfod has.
type fixture struct {
	path, id, hot string
	debugDir      string
}

func buildFixture(t *testing.T, name string) fixture {
	src := testfixture.Build(t, testfixture.Spec{
		Name: name, Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-fno-omit-frame-pointer", "-Wl,--build-id", "-DE2E_ID=" + name},
	})
	stripped, debug := testfixture.SplitDebug(t, src, false)
	f, err := elf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	note, _ := f.Section(".note.gnu.build-id").Data()
	f.Close()
	dir := t.TempDir()
	data, _ := os.ReadFile(debug)
	os.WriteFile(filepath.Join(dir, name+".debug"), data, 0o644)
	return fixture{path: stripped, id: hex.EncodeToString(note[16:]), hot: "spin_" + name, debugDir: dir}
}

// load reads a profiles file (one document per line) and sums, per pid of
// interest, the samples, and collects the names of their leaf frames.
type tally struct {
	samples map[int64]int64
	leaves  map[int64]map[string]int64 // pid -> leaf function name -> samples
	raw     map[int64]int64            // pid -> samples whose native leaf has no lines
	files   map[string]bool            // files named by leaf lines
}

// userFrame is one non-kernel frame of a sample: its outermost line's
// function and file:line, or raw (no lines), with its
// profile.frame.type and, when raw, why (profsym.symbolization.error).
type userFrame struct {
	fn, file string
	path     string // the file as the profile names it (file is its base)
	line     int64
	raw      bool
	typ, err string
	// inlined are the location's other lines, innermost first: the
	// functions inlined into fn at this address (fn is the outermost).
	inlined []userFrame
}

// sampleOf is one sample of a profiles file: its process, value, first
// timestamp, stop reason and user frames, leaf first.
type sampleOf struct {
	typ    string // the profile's sample type: cpu, off_cpu, wall
	exe    string // the resource's process.executable.path
	pid, n int64
	time   uint64 // unix ns of the first time the stack was sampled
	stop   string // profsym.unwind.stop_reason, "" for a whole stack
	thread string // thread.name (the thread's comm)
	tid    int64  // thread.id
	frames []userFrame
	labels map[string]string // pprof.label.<key> attributes, by key
	// trace and span are the ids of the sample's link (link_index), in
	// hex; "" without one.
	trace, span string
}

// eachSample reads a profiles file (one document per line, a line being
// written is skipped) and calls fn for every sample of the pids of
// interest with its value and its user frames, leaf first.
func eachSample(t *testing.T, path string, pids map[int64]bool, fn func(pid, n int64, frames []userFrame)) {
	t.Helper()
	eachSampleOf(t, path, pids, func(s sampleOf) { fn(s.pid, s.n, s.frames) })
}

// eachSampleOf is eachSample with every field of a sample.
func eachSampleOf(t *testing.T, path string, pids map[int64]bool, fn func(s sampleOf)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var um pprofile.JSONUnmarshaler
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			continue
		}
		d := pdict.New(pd.Dictionary())
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			v, ok := rp.Resource().Attributes().Get("process.pid")
			if !ok || !pids[v.Int()] {
				continue
			}
			exe := ""
			if e, ok := rp.Resource().Attributes().Get("process.executable.path"); ok {
				exe = e.Str()
			}
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					typ := d.Str(p.SampleType().TypeStrindex())
					for _, s := range p.Samples().All() {
						var frames []userFrame
						for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
							loc := dict.LocationTable().At(int(li))
							ft, _ := d.FindAttr(loc.AttributeIndices(), "profile.frame.type")
							if ft.Str() == "kernel" {
								continue
							}
							// The agent names [vdso] frames itself (no file
							// holds the vdso for later): not the binaries'
							// frames these tests follow.
							if mi := loc.MappingIndex(); mi > 0 && int(mi) < dict.MappingTable().Len() &&
								d.Str(dict.MappingTable().At(int(mi)).FilenameStrindex()) == "[vdso]" {
								continue
							}
							if loc.Lines().Len() == 0 {
								why, _ := d.FindAttr(loc.AttributeIndices(), "profsym.symbolization.error")
								frames = append(frames, userFrame{raw: true, typ: ft.Str(), err: why.Str()})
								continue
							}
							var lines []userFrame
							for _, ln := range loc.Lines().All() {
								f := dict.FunctionTable().At(int(ln.FunctionIndex()))
								file := d.Str(f.FilenameStrindex())
								lines = append(lines, userFrame{
									fn: d.Str(f.NameStrindex()), file: filepath.Base(file), path: file,
									line: ln.Line(), typ: ft.Str(),
								})
							}
							outer := lines[len(lines)-1]
							outer.inlined = lines[:len(lines)-1]
							frames = append(frames, outer)
						}
						smp := sampleOf{typ: typ, exe: exe, pid: v.Int(), n: s.Values().At(0), frames: frames}
						if s.TimestampsUnixNano().Len() > 0 {
							smp.time = s.TimestampsUnixNano().At(0)
						}
						if stop, ok := d.FindAttr(s.AttributeIndices(), "profsym.unwind.stop_reason"); ok {
							smp.stop = stop.Str()
						}
						if li := int(s.LinkIndex()); li > 0 && li < dict.LinkTable().Len() {
							l := dict.LinkTable().At(li)
							smp.trace, smp.span = l.TraceID().String(), l.SpanID().String()
						}
						if th, ok := d.FindAttr(s.AttributeIndices(), "thread.name"); ok {
							smp.thread = th.Str()
						}
						if id, ok := d.FindAttr(s.AttributeIndices(), "thread.id"); ok {
							smp.tid = id.Int()
						}
						for _, ai := range s.AttributeIndices().All() {
							if ai <= 0 || int(ai) >= dict.AttributeTable().Len() {
								continue
							}
							kv := dict.AttributeTable().At(int(ai))
							if k, ok := strings.CutPrefix(d.Str(kv.KeyStrindex()), "pprof.label."); ok {
								if smp.labels == nil {
									smp.labels = map[string]string{}
								}
								smp.labels[k] = kv.Value().Str()
							}
						}
						fn(smp)
					}
				}
			}
		}
	}
}

func load(t *testing.T, path string, pids map[int64]bool) tally {
	t.Helper()
	ty := tally{samples: map[int64]int64{}, leaves: map[int64]map[string]int64{}, raw: map[int64]int64{}, files: map[string]bool{}}
	eachSample(t, path, pids, func(pid, n int64, frames []userFrame) {
		ty.samples[pid] += n
		if len(frames) == 0 {
			return
		}
		leaf := frames[0]
		if leaf.raw {
			ty.raw[pid] += n
			return
		}
		if ty.leaves[pid] == nil {
			ty.leaves[pid] = map[string]int64{}
		}
		ty.leaves[pid][leaf.fn] += n
		if leaf.line > 0 {
			ty.files[fmt.Sprintf("%s:%d", leaf.file, leaf.line)] = true
		}
	})
	return ty
}

func TestAgentGatewayDebuginfod(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the agent's eBPF sampler needs root (CAP_BPF, CAP_PERFMON)")
	}
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	profsym := filepath.Join(root, "_build", "profsym")
	if _, err := os.Stat(profsym); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make build (make test does)", profsym)
	}

	fa, fb := buildFixture(t, "e2ealpha"), buildFixture(t, "e2ebeta")
	served := t.TempDir()
	for _, f := range []fixture{fa, fb} {
		entries, _ := os.ReadDir(f.debugDir)
		for _, e := range entries {
			data, _ := os.ReadFile(filepath.Join(f.debugDir, e.Name()))
			os.WriteFile(filepath.Join(served, e.Name()), data, 0o644)
		}
	}
	srv := testfixture.StartDebuginfod(t, served, fa.id+"/debuginfo", fb.id+"/debuginfo")

	work := t.TempDir()
	gwPort, gwHTTP, gwHealth, agHealth := testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t)
	symPort := testfixture.FreePort(t)
	gwOut, agOut := filepath.Join(work, "gateway.json"), filepath.Join(work, "agent.json")
	gwEnv := []string{
		fmt.Sprintf("PROFSYM_GATEWAY_LISTEN=127.0.0.1:%d", gwPort),
		fmt.Sprintf("PROFSYM_GATEWAY_HTTP_LISTEN=127.0.0.1:%d", gwHTTP),
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", gwHealth),
		"PROFSYM_OUTPUT=" + gwOut,
		"PROFSYM_DEBUGINFOD_CACHE=" + filepath.Join(work, "cache"),
		"PROFSYM_LOCAL_ROOT=/nonexistent", // the gateway must not read the host's binaries
		"DEBUGINFOD_URLS=" + srv.URL,
		fmt.Sprintf("PROFSYM_SYMBOLS_LISTEN=127.0.0.1:%d", symPort),
		"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, "symbols"),
	}
	gwConfig := filepath.Join(root, "config", "gateway.yaml")
	gateway := startCollector(t, bin, "gateway", gwEnv, gwConfig)

	// The agent as configured for a fleet, narrowed to the fixtures (the
	// machine runs other things) and also writing what it sends.
	overlay := filepath.Join(work, "agent-test.yaml")
	os.WriteFile(overlay, []byte(fmt.Sprintf(`
receivers:
  profiling:
    targets:
      - process_name: "^e2e(alpha|beta)$"
exporters:
  file/sent:
    path: %s
    append: true
service:
  pipelines:
    profiles:
      exporters: [otlp_grpc, file/sent]
`, agOut)), 0o644)
	agEnv := []string{
		fmt.Sprintf("PROFSYM_GATEWAY_ENDPOINT=127.0.0.1:%d", gwPort),
		fmt.Sprintf("PROFSYM_SYMBOLS_ENDPOINT=http://127.0.0.1:%d", symPort),
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", agHealth),
		"PROFSYM_REPORT_INTERVAL=2s",
	}
	agent := startCollector(t, bin, "agent", agEnv, filepath.Join(root, "config", "agent.yaml"), overlay)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var work1, work2 *exec.Cmd
	pids := map[int64]bool{}
	for i, f := range []fixture{fa, fb} {
		cmd := exec.CommandContext(ctx, f.path, "14") // seconds of spinning
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pids[int64(cmd.Process.Pid)] = true
		if i == 0 {
			work1 = cmd
		} else {
			work2 = cmd
		}
	}

	// Kill the gateway mid-run and bring it back: the agent keeps
	// sampling, queues and retries.
	time.Sleep(5 * time.Second)
	gateway.stop(t)
	time.Sleep(3 * time.Second)
	gateway = startCollector(t, bin, "gateway (restarted)", gwEnv, gwConfig)

	work1.Wait()
	work2.Wait()
	time.Sleep(3 * time.Second) // a last report interval
	agent.stop(t)               // final report, exporter queue drained
	time.Sleep(time.Second)
	gateway.stop(t)

	sent := load(t, agOut, pids)
	got := load(t, gwOut, pids)
	t.Logf("agent sent %v samples, gateway wrote %v; gateway leaves %v; files %v", sent.samples, got.samples, got.leaves, got.files)
	for pid := range pids {
		if sent.samples[pid] < 100 {
			t.Errorf("pid %d: the agent sampled only %d times in ~14 s at 99 Hz\nagent log:\n%s", pid, sent.samples[pid], agent.log.String())
		}
		if got.samples[pid] != sent.samples[pid] {
			t.Errorf("pid %d: agent sent %d samples, gateway wrote %d (lost or duplicated)", pid, sent.samples[pid], got.samples[pid])
		}
		if len(sent.leaves[pid]) != 0 || sent.raw[pid] == 0 {
			t.Errorf("pid %d: the agent's output should be raw (names %v, raw %d)", pid, sent.leaves[pid], sent.raw[pid])
		}
	}
	for _, f := range []fixture{fa, fb} {
		var hot int64
		for pid := range pids {
			hot += got.leaves[pid][f.hot]
		}
		if hot == 0 {
			t.Errorf("the gateway never named %s\ngateway log:\n%s", f.hot, gateway.log.String())
		}
	}
	if !got.files["hot.c:12"] && !got.files["hot.c:13"] && !got.files["hot.c:14"] {
		t.Errorf("no leaf line in hot.c's spin loop (lines 12-14): %v", got.files)
	}

	// profsym top lists the hot function first.
	for pid := range pids {
		out, err := exec.Command(profsym, "top", gwOut, "--n", "3", "--pid", fmt.Sprint(pid)).CombinedOutput()
		if err != nil {
			t.Fatalf("profsym top: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) < 3 || !strings.Contains(lines[2], "spin_e2e") {
			t.Errorf("profsym top --pid %d does not list the hot function first:\n%s", pid, out)
		}
	}
}
