package cpython_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/bpf"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// harness runs the sampler with the CPython walker and builds reports
// the way the profiling receiver does.
type harness struct {
	s     *sampler.Sampler
	b     *profbuild.Builder
	start time.Time
}

// newHarness samples at hz.
func newHarness(t *testing.T, hz int) *harness {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	s, err := sampler.New(sampler.Config{
		SampleRate: hz, Logger: log, Runtimes: runtimes.Config{CPython: true},
		// deep's 55 Python frames (110 words, and up to 3.10 a C frame
		// or two between each two) do not fit the default 128.
		Unwinding: unwind.Config{MaxStackWords: unwind.MaxStackWords},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, start: time.Now()}
	h.b = profbuild.New(profbuild.Options{SampleRate: hz, Unwinder: s.Unwinder(), Runtimes: s.Runtimes()})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range s.Events() {
			h.b.HandleEvent(ev)
		}
	}()
	t.Cleanup(func() { s.Close(); <-done })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) collect(t testing.TB) profbuild.Report {
	t.Helper()
	r, err := h.b.Collect(h.s, h.start)
	if err != nil {
		t.Fatal(err)
	}
	h.start = time.Now()
	return r
}

// fixture is chain.py running in a chroot.
type fixture struct {
	pid    int
	file   string           // chain.py as the interpreter names it
	lines  map[string][]int // lines each function runs on, as the interpreter says
	marks  map[string][]int // lines marked "# L:NAME" in the source
	stdout *bufio.Reader
	kill   func()
	// gofile, once it exists, starts the measured work (the path inside
	// the fixture's root and on the host).
	gofile, gofileHost string
}

// warm waits until the sampler walks the fixture's Python frames (the
// process is attached, its files' tables are built), then lets it go.
func (f *fixture) warm(t *testing.T, h *harness) {
	t.Helper()
	f.expect(t, "warm")
	deadline := time.Now().Add(25 * time.Second)
	for {
		time.Sleep(300 * time.Millisecond)
		r := h.collect(t)
		var py, notReady int64
		for _, s := range samplesOf(t, r, f.pid, "", nil) {
			if len(s.py) > 0 && s.py[0].err == "" {
				py += s.count
			}
			if s.stop == "not_ready" {
				notReady += s.count
			}
		}
		if py >= 5 && notReady == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err := os.WriteFile(f.gofileHost, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f.expect(t, "go")
}

var markRE = regexp.MustCompile(`L:([a-z-]+)`)

func startFixture(t *testing.T, v cpython.Interpreter, root, mode string, seconds int) *fixture {
	t.Helper()
	src := testfixture.Src(t, "runtimes/python/chain.py")
	paths := v.Copy(t, root, src)
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{file: paths[0], marks: map[string][]int{}}
	for i, l := range strings.Split(string(b), "\n") {
		if _, comment, ok := strings.Cut(l, "# "); ok {
			for _, m := range markRE.FindAllStringSubmatch(comment, -1) {
				f.marks[m[1]] = append(f.marks[m[1]], i+1)
			}
		}
	}
	f.gofile = filepath.Join(filepath.Dir(paths[0]), fmt.Sprintf("go-%s-%d", mode, time.Now().UnixNano()))
	cmd := v.Command(root, paths[0], mode, fmt.Sprint(seconds), f.gofile)
	f.gofileHost = testfixture.ChrootFile(root, f.gofile)
	t.Cleanup(func() { os.Remove(f.gofileHost) })
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.pid = cmd.Process.Pid
	f.kill = func() { cmd.Process.Kill(); cmd.Wait() }
	t.Cleanup(f.kill)
	f.stdout = bufio.NewReader(out)
	line := f.expect(t, "lines ")
	if err := json.Unmarshal([]byte(line), &f.lines); err != nil {
		t.Fatal(err)
	}
	for name, marked := range f.marks {
		fn, _, _ := strings.Cut(name, "-")
		if fn == "module" || f.lines[fn] == nil {
			continue
		}
		for _, l := range marked {
			if !contains(f.lines[fn], l) {
				t.Fatalf("marked line %d of %s is not one %s runs on: %v", l, fn, v.Name, f.lines[fn])
			}
		}
	}
	return f
}

// expect reads stdout up to a line starting with prefix and returns the rest.
func (f *fixture) expect(t *testing.T, prefix string) string {
	t.Helper()
	for {
		l, err := f.stdout.ReadString('\n')
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(l, prefix))
		}
		if err == io.EOF || err != nil {
			t.Fatalf("fixture ended before %q: %v", prefix, err)
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// pyFrame is one Python frame of a sample.
type pyFrame struct {
	name, file string
	err        string // why it is unnamed
	line       int
	nativeIn   int // native frames between the previous (inner) Python frame and this one
}

// sampleView is a sample of a report, leaf first.
type sampleView struct {
	count    int64
	stop     string
	py       []pyFrame
	evalLeft int // native frames still in the eval loop (should be replaced)
	native   int
	leafFile string // the innermost native frame's file, base name
}

func samplesOf(t testing.TB, r profbuild.Report, pid int, binName string, eval [][2]uint64) []sampleView {
	t.Helper()
	dict := r.Profiles.Dictionary()
	str := func(i int32) string { return dict.StringTable().At(int(i)) }
	attrs := func(idx []int32) map[string]any {
		out := map[string]any{}
		for _, i := range idx {
			kv := dict.AttributeTable().At(int(i))
			out[str(kv.KeyStrindex())] = kv.Value().AsRaw()
		}
		return out
	}
	var out []sampleView
	for _, rp := range r.Profiles.ResourceProfiles().All() {
		if p, _ := rp.Resource().Attributes().Get(pframe.AttrPID); p.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					sv := sampleView{count: s.Values().At(0)}
					sv.stop, _ = attrs(s.AttributeIndices().AsRaw())[pframe.AttrUnwindStop].(string)
					native := 0
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						l := dict.LocationTable().At(int(li))
						a := attrs(l.AttributeIndices().AsRaw())
						switch a[pframe.AttrFrameType] {
						case pframe.TypeCPython:
							p := pyFrameOf(dict, str, l, native)
							p.err, _ = a[pframe.AttrError].(string)
							sv.py = append(sv.py, p)
							native = 0
						case pframe.TypeKernel:
						default:
							native++
							sv.native++
							m := dict.MappingTable().At(int(l.MappingIndex()))
							if sv.native == 1 {
								sv.leafFile = path.Base(str(m.FilenameStrindex()))
							}
							if path.Base(str(m.FilenameStrindex())) == binName && inRanges(eval, l.Address()) {
								sv.evalLeft++
							}
						}
					}
					out = append(out, sv)
				}
			}
		}
	}
	return out
}

func pyFrameOf(dict pprofile.ProfilesDictionary, str func(int32) string, l pprofile.Location, native int) pyFrame {
	if l.Lines().Len() == 0 {
		return pyFrame{name: "?", nativeIn: native}
	}
	ln := l.Lines().At(0)
	fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
	return pyFrame{name: str(fn.NameStrindex()), file: str(fn.FilenameStrindex()), line: int(ln.Line()), nativeIn: native}
}

func inRanges(rs [][2]uint64, a uint64) bool {
	for _, r := range rs {
		if a >= r[0] && a < r[1] {
			return true
		}
	}
	return false
}

// TestPythonChains runs chain.py in each mode under each interpreter of
// the matrix and checks that >= 99% of its samples carry the whole Python
// chain, innermost first, with the right names, file and lines (the
// marked lines, which the interpreter confirms), Python frames in place
// of the eval loop's native frames, and native frames between a callback
// and its caller where C calls back into Python.
func TestPythonChains(t *testing.T) {
	// About 200 samples a case: 199 Hz over a second of the fixture's
	// CPU (99 Hz over two until stop 45: as many samples, twice the CPU
	// of 96 cases).
	const hz, seconds = 199, 1
	h := newHarness(t, hz)
	for _, v := range cpython.Interpreters() {
		t.Run(v.Name, func(t *testing.T) {
			root := v.Root(t)
			code, mapped := v.Code(root)
			eval, err := cpython.EvalRanges(code, mapped)
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range []string{"chain", "sorted", "ctypes", "deep", "threads", "dynamic"} {
				t.Run(mode, func(t *testing.T) {
					f := startFixture(t, v, root, mode, seconds)
					f.warm(t, h)
					h.collect(t) // before the work: left out
					cpu0 := cpuTime(t, f.pid)
					f.expect(t, "done")
					cpu := cpuTime(t, f.pid) - cpu0
					r := h.collect(t)
					f.kill()
					c := checker{mode: mode, minor: v.Minor, f: f}
					for _, s := range samplesOf(t, r, f.pid, path.Base(mapped), eval) {
						c.add(s)
					}
					t.Logf("pid %d: %v of CPU, %d samples, %d (%.2f%%) whole chains (%d in the callee's caller, %d with a freed code object unnamed); stops %v; other %v; failures %v; set %+v; walker %s",
						f.pid, cpu.Round(time.Millisecond), c.total, c.whole, 100*float64(c.whole)/float64(max(c.total, 1)),
						c.inC, c.freed, c.stops, top(c.bad, 5), r.Failures, h.s.Runtimes().Stats(), walkerStats(t))
					if float64(c.total) < 0.5*hz*cpu.Seconds() || c.total < 20 {
						t.Fatalf("only %d samples for %v of CPU", c.total, cpu)
					}
					// dynamic makes and frees code objects all the time;
					// a sample can catch one half made or half freed. Under
					// CI load: 3.9, 3 of 198 with no Python frame or a line
					// past the function's; 3.13, 2 of 199 ending in a
					// mapping not yet known; 3.9 (pyenv), 4 of 199 ending
					// in anonymous executable memory (stop jit). It is held
					// to 95%; the other modes hold the 99%.
					want := 0.99
					if mode == "dynamic" {
						want = 0.95
					}
					if float64(c.whole+c.freed) < want*float64(c.total) {
						t.Errorf("%d/%d samples with the whole chain, want >= %.0f%%", c.whole+c.freed, c.total, 100*want)
					}
					if 2*c.inC > c.total && mode != "dynamic" {
						t.Errorf("%d/%d samples in the caller: the callees' frames are missing", c.inC, c.total)
					}
					if 2*c.inC > c.total && mode == "dynamic" {
						t.Errorf("%d/%d samples in dynamic's own code: its callees' frames are missing", c.inC, c.total)
					}
				})
			}
		})
	}
}

// checker sorts a fixture's samples into whole chains and the rest.
type checker struct {
	mode                     string
	minor                    int
	f                        *fixture
	total, whole, inC, freed int64
	stops                    map[string]int64
	bad                      map[string]int64
}

type frameWant struct {
	name  string
	lines []int
}

// chain is the Python chain a sample of the mode should have, innermost
// first; rest is what may follow it (threads: threading's frames).
func (c *checker) chain() []frameWant {
	m := c.f.marks
	inner := map[string]string{"sorted": "key", "ctypes": "cmp", "dynamic": "dyn_"}[c.mode]
	var w []frameWant
	switch inner {
	case "":
		w = append(w, frameWant{"leaf", m["leaf"]})
	case "dyn_":
		w = append(w, frameWant{"dyn_", nil}, frameWant{"dynamic", m["dynamic"]})
	default:
		w = append(w, frameWant{inner, m[inner]})
	}
	if c.mode == "deep" {
		for range 50 {
			w = append(w, frameWant{"rec", m["rec"]})
		}
	}
	w = append(w, frameWant{"mid", m["mid-"+c.mode]}, frameWant{"top", m["top"]})
	if c.mode != "threads" {
		w = append(w, frameWant{"run", m["run"]}, frameWant{"<module>", m["module"]})
	}
	return w
}

// threadingOnly reports whether every frame of py is threading.py's.
func (c *checker) threadingOnly(py []pyFrame) bool {
	for _, p := range py {
		if !strings.HasSuffix(p.file, "threading.py") {
			return false
		}
	}
	return true
}

var dynName = regexp.MustCompile(`^dyn_(\d+)$`)

func (c *checker) add(s sampleView) {
	if c.stops == nil {
		c.stops, c.bad = map[string]int64{}, map[string]int64{}
	}
	c.total += s.count
	c.stops[s.stop] += s.count
	want := c.chain()
	py := s.py
	freed := false
	if (c.mode == "sorted" || c.mode == "ctypes" || c.mode == "dynamic") && len(py) == len(want)-1 && len(py) > 0 {
		// In the caller's own code, or in C it runs between two calls
		// of the callee (sorted's or qsort's own work, compile): the
		// caller's chain is whole.
		want = want[1:]
		c.inC += s.count
	}
	if n := len(py); c.mode == "threads" && n >= 2 && py[n-1].name == "<module>" && py[n-1].file == c.f.file &&
		py[n-2].name == "run" && py[n-2].file == c.f.file && c.threadingOnly(py[:n-2]) {
		// The main thread starting or joining the workers (Thread.start,
		// .join, in run): a whole stack, not the workers' chain (2 of 199
		// samples once, 3.12; 2 of 198, 3.10).
		c.whole += s.count
		return
	}
	if c.mode == "threads" && len(py) > len(want) {
		// Then threading's frames, down to the thread's first.
		for _, p := range py[len(want):] {
			if !strings.HasSuffix(p.file, "threading.py") {
				c.bad["frame after top outside threading.py: "+p.name] += s.count
				return
			}
		}
		if last := py[len(py)-1].name; !strings.HasSuffix(last, "_bootstrap") {
			c.bad["thread chain ends in "+last] += s.count
			return
		}
		py = py[:len(want)]
	}
	if len(py) != len(want) {
		names := make([]string, len(py))
		for i, p := range py {
			names[i] = p.name
		}
		c.bad[fmt.Sprintf("python frames %v", names)] += s.count
		return
	}
	if s.evalLeft > 0 {
		c.bad["eval loop frames left"] += s.count
		return
	}
	for i, w := range want {
		p := py[i]
		why := ""
		switch {
		case w.name == "dyn_" && p.err != "":
			// Freed and replaced before the report named it.
			freed = true
		case w.name == "dyn_":
			m := dynName.FindStringSubmatch(p.name)
			n := -1
			if m != nil {
				fmt.Sscan(m[1], &n)
			}
			if n < 0 || p.file != fmt.Sprintf("<dyn-%d>", n) || p.line != n+3 && p.line != n+4 {
				why = fmt.Sprintf("dynamic frame %s in %s at line %d", p.name, p.file, p.line)
			}
		case p.name != w.name:
			why = fmt.Sprintf("frame %d is %s (%s)", i, p.name, p.err)
		case p.file != c.f.file:
			why = fmt.Sprintf("frame %d in %s", i, p.file)
		case !contains(w.lines, p.line):
			why = fmt.Sprintf("%s at line %d, want %v", p.name, p.line, w.lines)
		case p.name == "mid" && (c.mode == "sorted" || c.mode == "ctypes") && p.nativeIn == 0:
			why = "no native frame between the callback and mid"
		}
		if why != "" {
			c.bad[why] += s.count
			return
		}
	}
	if freed {
		c.freed += s.count
	} else {
		c.whole += s.count
	}
}

// walkerStats reads the newest cpython_stats map on the machine (this
// test's sampler loaded it last).
func walkerStats(t *testing.T) string {
	var newest *ebpf.Map
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if err != nil {
			break
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		if info, err := m.Info(); err == nil && info.Name == "cpython_stats" {
			if newest != nil {
				newest.Close()
			}
			newest = m
			continue
		}
		m.Close()
	}
	if newest == nil {
		return "no cpython_stats map"
	}
	defer newest.Close()
	var per []bpf.ProfileCpythonCounters
	if err := newest.Lookup(uint32(0), &per); err != nil {
		return err.Error()
	}
	var sum bpf.ProfileCpythonCounters
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return fmt.Sprintf("%+v", sum)
}

// cpuTime is the CPU time pid has used (utime + stime, clock ticks of 10 ms).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var u, k int64
	fmt.Sscan(fields[11], &u)
	fmt.Sscan(fields[12], &k)
	return time.Duration(u+k) * 10 * time.Millisecond
}

// top returns the n largest entries of m, as text.
func top(m map[string]int64, n int) []string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%d %s", v, k))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] > out[j] })
	return out[:min(n, len(out))]
}
