package cpython_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
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

func newHarness(t *testing.T) *harness {
	t.Helper()
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	s, err := sampler.New(sampler.Config{SampleRate: 99, Logger: log, Runtimes: runtimes.Config{CPython: true}})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, start: time.Now()}
	h.b = profbuild.New(profbuild.Options{SampleRate: 99, Unwinder: s.Unwinder(), Runtimes: s.Runtimes()})
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
}

var markRE = regexp.MustCompile(`# L:([a-z-]+)$`)

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
		if m := markRE.FindStringSubmatch(l); m != nil {
			f.marks[m[1]] = append(f.marks[m[1]], i+1)
		}
	}
	cmd := v.Command(root, paths[0], mode, fmt.Sprint(seconds))
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
		if fn == "module" {
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
}

func samplesOf(t *testing.T, r profbuild.Report, pid int, binName string, eval [][2]uint64) []sampleView {
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
							sv.py = append(sv.py, pyFrameOf(dict, str, l, native))
							native = 0
						case pframe.TypeKernel:
						default:
							native++
							sv.native++
							m := dict.MappingTable().At(int(l.MappingIndex()))
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
	h := newHarness(t)
	const seconds = 3
	for _, v := range cpython.Interpreters() {
		t.Run(v.Name, func(t *testing.T) {
			root := v.Root(t)
			code, mapped := v.Code(root)
			eval, err := cpython.EvalRanges(code, mapped)
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range []string{"chain", "sorted", "ctypes"} {
				t.Run(mode, func(t *testing.T) {
					inner := map[string]string{"chain": "leaf", "sorted": "key", "ctypes": "cmp"}[mode]
					f := startFixture(t, v, root, mode, seconds)
					f.expect(t, "go")
					h.collect(t) // before the work: left out
					cpu0 := cpuTime(t, f.pid)
					f.expect(t, "done")
					cpu := cpuTime(t, f.pid) - cpu0
					r := h.collect(t)
					f.kill()
					want := []struct {
						name  string
						lines []int
					}{{inner, f.marks[inner]}, {"mid", f.marks["mid-"+mode]}, {"top", f.marks["top"]}, {"<module>", f.marks["module"]}}
					var total, whole, inC int64
					stops := map[string]int64{}
					bad := map[string]int64{}
					for _, s := range samplesOf(t, r, f.pid, path.Base(mapped), eval) {
						total += s.count
						stops[s.stop] += s.count
						why := ""
						want := want
						if mode != "chain" && len(s.py) == len(want)-1 && len(s.py) > 0 && s.py[0].nativeIn > 0 {
							// In the C code between two callbacks (sorted's
							// or qsort's own work): mid's chain is whole.
							want = want[1:]
							inC += s.count
						}
						switch {
						case len(s.py) != len(want):
							why = fmt.Sprintf("python frames %v", s.py)
						case s.evalLeft > 0:
							why = "eval loop frames left"
						}
						for i := 0; why == "" && i < len(want); i++ {
							p := s.py[i]
							switch {
							case p.name != want[i].name:
								why = fmt.Sprintf("frame %d is %s", i, p.name)
							case p.file != f.file:
								why = fmt.Sprintf("frame %d in %s", i, p.file)
							case !contains(want[i].lines, p.line):
								why = fmt.Sprintf("%s at line %d, want %v", p.name, p.line, want[i].lines)
							case p.name == "mid" && mode != "chain" && p.nativeIn == 0:
								why = "no native frame between the callback and mid"
							}
						}
						if why == "" {
							whole += s.count
						} else {
							bad[why] += s.count
						}
					}
					ws := h.s.Runtimes().Stats()
					t.Logf("walker: %s", walkerStats(t))
					t.Logf("pid %d: %v of CPU, %d samples, %d (%.2f%%) whole chains (%d in C below mid); stops %v; other %v; failures %v; set %+v",
						f.pid, cpu.Round(time.Millisecond), total, whole, 100*float64(whole)/float64(max(total, 1)), inC, stops, top(bad, 5), r.Failures, ws)
					if float64(total) < 0.5*99*cpu.Seconds() || total < 20 {
						t.Fatalf("only %d samples for %v of CPU", total, cpu)
					}
					if float64(whole) < 0.99*float64(total) {
						t.Errorf("%d/%d samples with the whole chain, want >= 99%%", whole, total)
					}
					if 2*inC > total {
						t.Errorf("%d/%d samples in C below mid: the callbacks' frames are missing", inC, total)
					}
				})
			}
		})
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
