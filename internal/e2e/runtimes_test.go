package e2e

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// Issue 26: Python frames came out of the built binaries unnamed
// (runtime_not_attached) while the cpython package's harness, which loads
// the CPython runtime alone, named them. These tests run the binaries as a
// user does, with HotSpot and CPython both on, against real interpreters
// running testdata/src/e2e/pychain.py.

// pyChainSeconds is the CPU time each fixture spends in its chain: about
// 300 samples at 99 Hz, of which the tests want at least 200.
const (
	pyChainSeconds = 3
	pyMinSamples   = 200
	pyWholeShare   = 0.99
)

// The Python and Java matrices (24 and 28 fixtures at once) sample at
// matrixHz over matrixSeconds of each fixture's CPU: as many samples as
// 99 Hz over pyChainSeconds, for half the CPU (their tests were the
// longest of the end-to-end pass once the deep cases came).
const (
	matrixHz      = 199
	matrixSeconds = "1.5"
)

// matrixConfig and matrixFlags set the collector's and record's rate to it.
var (
	matrixConfig = "yaml:receivers::profiling::sample_rate: " + strconv.Itoa(matrixHz)
	matrixFlags  = []string{"--sample-rate", strconv.Itoa(matrixHz)}
)

// pyChain is what every measured sample must hold, leaf first.
var pyChain = []string{"leaf", "mid", "top", "<module>"}

// deepFrames is the recursion of each deep fixture (issue 26's 50-deep
// case), Python's and Java's: leaf, 50 rec, mid, top, <module>. Its 55 Python
// frames take 110 words, and up to 3.10 each call has the interpreter's C
// frames between two Python frames (165 to 220 words in all): the
// binaries run with unwinding.max_stack_words at its largest, 256.
const deepFrames = 50

// pyStackWords is the max_stack_words of the runs with deepFrames.
var pyStackWords = strconv.Itoa(unwind.MaxStackWords)

// pyChainOf is the chain of a fixture with depth rec frames, leaf first.
func pyChainOf(depth int) []string {
	return slices.Concat(pyChain[:1], slices.Repeat([]string{"rec"}, depth), pyChain[1:])
}

// pyInterp is one interpreter the fixture runs with.
type pyInterp struct {
	name   string // "3.11-pyenv", "3.11-bookworm"
	python string // the executable, as the process sees it
	root   string // its chroot, "" for the host's
}

// pyInterps lists the interpreters: pyenv's 3.6 to 3.13 where
// the host has them, Debian's python3 of bookworm (3.11) and trixie (3.13)
// in the runtime chroots the cpython package's tests share, and sid's 3.14
// and 3.15. At least one 3.11 is required.
func pyInterps(t *testing.T) []pyInterp {
	t.Helper()
	if p, ok := testfixture.VMPython(); ok {
		// The one prepared for a VM (test/kernels: Debian's arm64 3.11).
		return []pyInterp{{name: fmt.Sprintf("3.%d-%s", p.Minor, runtime.GOARCH), python: p.Python, root: p.Root}}
	}
	var out []pyInterp
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".pyenv")
	}
	re := regexp.MustCompile(`^3\.(6|7|8|9|10|11|12|13)\.\d+$`)
	dirs, _ := os.ReadDir(filepath.Join(root, "versions"))
	seen := map[string]bool{}
	for _, d := range dirs {
		m := re.FindStringSubmatch(d.Name())
		if m == nil || seen[m[1]] {
			continue
		}
		py := filepath.Join(root, "versions", d.Name(), "bin", "python3."+m[1])
		if _, err := os.Stat(py); err == nil {
			seen[m[1]] = true
			out = append(out, pyInterp{name: "3." + m[1] + "-pyenv", python: py})
		}
	}
	if len(out) == 0 {
		t.Logf("no pyenv Pythons in %s: Debian's only", root)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		testfixture.SkipPart(t, "debian-chroots", "debootstrap is not installed: no Debian python3 (bookworm 3.11, trixie 3.13)")
	} else {
		for _, c := range testfixture.RuntimeChroots {
			if c.Suite == "bookworm" || c.Suite == "trixie" {
				// Built once (debootstrap) before anything starts.
				out = append(out, pyInterp{name: c.Python + "-" + c.Suite, python: "/usr/bin/python" + c.Python, root: c.Root(t)})
			}
		}
		// 3.14 and 3.15 from sid, the only suite with them (the cpython
		// package's chroots: one per interpreter).
		for _, v := range []string{"3.14", "3.15"} {
			out = append(out, pyInterp{name: v + "-sid", python: "/usr/bin/python" + v, root: testfixture.InterpreterChroot(t, "python"+v, "sid")})
		}
	}
	if !slices.ContainsFunc(out, func(i pyInterp) bool { return strings.HasPrefix(i.name, "3.11-") }) {
		testfixture.SkipOrFail(t, "no Python 3.11 (pyenv's, or Debian bookworm's in a chroot)")
	}
	return out
}

// pyRun is one fixture process.
type pyRun struct {
	it     pyInterp
	cmd    *exec.Cmd
	pid    int64
	script string // pychain.py as the interpreter names it
	gofile string // host path of the file that ends the warm-up
	lines  chan string
	goNs   uint64 // the measured work's start and end (time.time_ns)
	doneNs uint64
	depth  int // rec frames between mid and leaf
	// virtual: Java's measured work runs on a virtual thread, on the
	// carrier thread whose id it prints.
	virtual bool
	carrier uint64
}

// pyIdleThreads is how many idle threads the chain fixture starts first
// (issue 26: a thread started after 200 others): more than the walker's
// bounded search of the thread lists reaches (96), so that its working
// main thread, the list's last, is found the way CPython itself finds it.
const pyIdleThreads = 200

// startPy starts pychain.py under it, with pyIdleThreads idle threads,
// for pyChainSeconds of work; it warms until go is called.
func startPy(t *testing.T, it pyInterp) *pyRun {
	return startPyWith(t, it, strconv.Itoa(pyChainSeconds), pyIdleThreads, 0)
}

// startPyWith starts pychain.py under it for seconds of work, with
// threads idle threads and depth rec frames (the run is named
// it.name/deep then).
func startPyWith(t *testing.T, it pyInterp, seconds string, threads, depth int) *pyRun {
	t.Helper()
	src := testfixture.Src(t, "e2e/pychain.py")
	if depth > 0 {
		it.name += "/deep"
	}
	r := &pyRun{it: it, lines: make(chan string, 16), depth: depth}
	args := []string{seconds, "", strconv.Itoa(threads), strconv.Itoa(depth)}
	if it.root == "" {
		dir := t.TempDir()
		r.script, r.gofile = src, filepath.Join(dir, "go")
		args[1] = r.gofile
		r.cmd = exec.Command(it.python, append([]string{src}, args...)...)
	} else {
		root := it.root
		r.script = testfixture.ChrootCopy(t, root, src)[0]
		r.gofile, args[1] = chrootGoFile(t, root, "pychain-")
		r.cmd = testfixture.ChrootCommand(root, append([]string{it.python, r.script}, args...)...)
	}
	r.run(t)
	return r
}

// startPys starts, for each interpreter, the chain fixture and the deep
// one, each for matrixSeconds of work.
func startPys(t *testing.T, interps []pyInterp) []*pyRun {
	t.Helper()
	var runs []*pyRun
	for _, it := range interps {
		runs = append(runs, startPyWith(t, it, matrixSeconds, pyIdleThreads, 0), startPyWith(t, it, matrixSeconds, 0, deepFrames))
	}
	return runs
}

// chrootGoFile makes a directory in root's /tmp for a fixture's GOFILE
// and returns the file's path on the host and inside the chroot.
func chrootGoFile(t *testing.T, root, prefix string) (host, inside string) {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), prefix) //nolint:usetesting // inside the chroot
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "go"), filepath.Join("/tmp", filepath.Base(dir), "go")
}

// run starts r.cmd with its output lines on r.lines; the process is
// killed when the test ends.
func (r *pyRun) run(t *testing.T) { r.pid = startLines(t, r.cmd, r.it.name, r.lines) }

// startLines starts a fixture process, sends its output lines to lines
// (closed at the end) and kills it when the test ends.
func startLines(t *testing.T, cmd *exec.Cmd, name string, lines chan<- string) int64 {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return int64(cmd.Process.Pid)
}

// start ends the warm-up.
func (r *pyRun) start(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(r.gofile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// expect waits for the fixture's "WORD NS" line and returns NS.
func (r *pyRun) expect(t *testing.T, word string, limit time.Duration) uint64 {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		ns, err := strconv.ParseUint(strings.TrimPrefix(l, word+" "), 10, 64)
		if !ok || !strings.HasPrefix(l, word+" ") || err != nil {
			t.Fatalf("%s (pid %d): %q instead of %q", r.it.name, r.pid, l, word)
		}
		return ns
	case <-time.After(limit):
		t.Fatalf("%s (pid %d): no %q within %v", r.it.name, r.pid, word, limit)
	}
	return 0
}

// waitPy waits until every fixture has done its measured work.
func waitPy(t *testing.T, runs []*pyRun) {
	t.Helper()
	for _, r := range runs {
		r.goNs = r.expect(t, "go", 2*time.Minute)
	}
	for _, r := range runs {
		r.doneNs = r.expect(t, "done", 3*time.Minute)
	}
}

// pyMarks reads the lines of pychain.py marked "# L:NAME".
func pyMarks(t *testing.T) map[string][]int64 {
	return fixtureMarks(t, "pychain.py", `# L:([a-z<>]+)`, pyChainOf(1))
}

// fixtureMarks reads the lines of testdata/src/e2e/file that mark (with
// re's one group) which function they belong to, and fails unless every
// function of chain has one.
func fixtureMarks(t *testing.T, file, re string, chain []string) map[string][]int64 {
	t.Helper()
	b, err := os.ReadFile(testfixture.Src(t, "e2e/"+file))
	if err != nil {
		t.Fatal(err)
	}
	marks := map[string][]int64{}
	mark := regexp.MustCompile(re)
	for i, l := range strings.Split(string(b), "\n") {
		if m := mark.FindStringSubmatch(l); m != nil {
			marks[m[1]] = append(marks[m[1]], int64(i+1))
		}
	}
	for _, fn := range chain {
		if len(marks[fn]) == 0 {
			t.Fatalf("%s marks no line of %s", file, fn)
		}
	}
	return marks
}

// pyWhole says whether frames hold the whole named chain: its Python
// frames, leaf first, are exactly pyChainOf(depth), each of type cpython, in the
// fixture's file, on a marked line of its function. Native frames may lie
// above the leaf (C it calls), between Python frames (up to 3.10 each
// call is an eval call of its own) and below <module>. It also says what
// the Python frames and the leaf frame were.
func pyWhole(frames []userFrame, script string, depth int, marks map[string][]int64) (bool, string) {
	var py []userFrame
	for _, f := range frames {
		if f.typ == "cpython" {
			py = append(py, f)
		}
	}
	chain := pyChainOf(depth)
	ok := len(py) == len(chain)
	desc := make([]string, len(py))
	for i, f := range py {
		if f.raw {
			desc[i] = "raw(" + f.err + ")"
			ok = false
			continue
		}
		desc[i] = fmt.Sprintf("%s@%s:%d", f.fn, f.file, f.line)
		if i >= len(chain) || f.fn != chain[i] || f.path != script || !slices.Contains(marks[f.fn], f.line) {
			ok = false
		}
	}
	leaf := "none"
	if len(frames) > 0 {
		leaf = cmp.Or(frames[0].fn, "raw("+frames[0].err+")") + " " + frames[0].typ
	}
	return ok, "[" + strings.Join(desc, " ") + "] leaf frame " + leaf
}

// checkPy counts, per fixture, the samples of its measured work (stamped
// from "go" to "done"; the warm-up's are before, the sleep after has
// none) in the profiles file at path, and holds them to pyMinSamples and
// pyWholeShare.
func checkPy(t *testing.T, path string, runs []*pyRun) {
	t.Helper()
	marks := pyMarks(t)
	checkChains(t, path, runs, chainCheck{
		kind: "Python", samples: "samples",
		whole: func(r *pyRun, s sampleOf) (bool, string) { return pyWhole(s.frames, r.script, r.depth, marks) },
		want: func(r *pyRun) string {
			return fmt.Sprintf("%s with names, file %s and marked lines", strings.Join(pyChainOf(r.depth), " <- "), r.script)
		},
	})
}

// chainCheck says what checkChains counts in each fixture's samples.
type chainCheck struct {
	kind    string                                    // the frames' runtime, for messages
	samples string                                    // what is counted, for messages
	keep    func(r *pyRun, s sampleOf) bool           // the samples counted (nil: all); the rest are logged
	whole   func(r *pyRun, s sampleOf) (bool, string) // whether s holds the chain, else what it holds
	want    func(r *pyRun) string                     // the chain, for the failure message
}

// checkChains checks every fixture's samples of its measured work in the
// output file at path: at least pyMinSamples, and a pyWholeShare of them
// holding the whole named chain.
func checkChains(t *testing.T, path string, runs []*pyRun, c chainCheck) {
	t.Helper()
	var summary []string
	for _, r := range runs {
		t.Run(r.it.name, func(t *testing.T) {
			var total, whole, others int64
			stops := map[string]int64{}
			bad := map[string]int64{}
			badAt := map[string][]string{} // when (up to 8 of) each one's stacks were first sampled, before "done"
			eachSampleOf(t, path, map[int64]bool{r.pid: true}, func(s sampleOf) {
				if s.time < r.goNs || s.time > r.doneNs {
					return
				}
				if c.keep != nil && !c.keep(r, s) {
					others += s.n
					return
				}
				total += s.n
				ok, desc := c.whole(r, s)
				if ok {
					whole += s.n
				} else {
					k := desc + " stop=" + s.stop
					bad[k] += s.n
					if len(badAt[k]) < 8 {
						badAt[k] = append(badAt[k], fmt.Sprintf("%dms", (int64(r.doneNs)-int64(s.time))/1e6))
					}
				}
				if s.stop != "" {
					stops[s.stop] += s.n
				}
			})
			share := 0.0
			if total > 0 {
				share = float64(whole) / float64(total)
			}
			summary = append(summary, fmt.Sprintf("%-18s %4d/%4d %.1f%%", r.it.name, whole, total, 100*share))
			t.Logf("%s (pid %d): %d of %d %s hold the whole chain (%.1f%%); %d others; stop reasons %v",
				r.it.name, r.pid, whole, total, c.samples, 100*share, others, stops)
			for k, at := range badAt {
				bad[k+" first sampled before done: "+strings.Join(at, " ")] = bad[k]
				delete(bad, k)
			}
			if len(bad) > 0 && share >= pyWholeShare {
				t.Logf("the others' %s frames (leaf first):\n%s", c.kind, topCounts(bad, 8))
			}
			if total < pyMinSamples {
				t.Errorf("%s: %d %s of the measured work, want at least %d", r.it.name, total, c.samples, pyMinSamples)
			}
			if share < pyWholeShare {
				t.Errorf("%s: %.1f%% of %d %s hold %s, want >= %.0f%%; the others' %s frames (leaf first):\n%s",
					r.it.name, 100*share, total, c.samples, c.want(r), 100*pyWholeShare, c.kind, topCounts(bad, 8))
			}
		})
	}
	t.Logf("whole chains:\n%s", strings.Join(summary, "\n"))
}

// topCounts lists the n largest entries of m, one a line.
func topCounts(m map[string]int64, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var b strings.Builder
	for i, k := range keys {
		if i == n {
			fmt.Fprintf(&b, "  ... %d more\n", len(keys)-n)
			break
		}
		fmt.Fprintf(&b, "  %6d %s\n", m[k], k)
	}
	return b.String()
}

// needBuilt returns the path of a built binary under _build, or skips (or
// fails, under CI) the test.
func needBuilt(t *testing.T, name, target string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the eBPF sampler needs root (CAP_BPF, CAP_PERFMON)")
	}
	bin := filepath.Join(testfixture.Root(t), "_build", name)
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make %s (make test does)", bin, target)
	}
	return bin
}

// TestCollectorPythonChains runs the distribution with config/default.yaml
// (profiling receiver, symbolization processor, file exporter; output,
// health endpoint and a 1 s report interval through its variables),
// starts the fixtures after it, lets each warm up until the output names
// its warm frame, and checks the chains in the file.
func TestCollectorPythonChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	interps := pyInterps(t)
	root := testfixture.Root(t)
	out := filepath.Join(t.TempDir(), "profiles.json")
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		// The sample stamps split warm-up from work only if no report
		// spans both (the fixture sleeps 0.2 s between them).
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	c := startCollector(t, bin, "collector", env, filepath.Join(root, "config", "default.yaml"),
		"yaml:receivers::profiling::unwinding::max_stack_words: "+pyStackWords, matrixConfig)
	runs := startPys(t, interps)

	// Warm-up: the work starts once the output names the fixture's warm
	// frame in a whole stack (attached, and walked with every file's
	// table), or after 45 s anyway, so that a failure still gives the
	// figures.
	pending := map[int64]*pyRun{}
	for _, r := range runs {
		pending[r.pid] = r
	}
	deadline := time.Now().Add(45 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		pids := map[int64]bool{}
		for pid := range pending {
			pids[pid] = true
		}
		eachSampleOf(t, out, pids, func(s sampleOf) {
			if s.stop != "" {
				// Named, but not yet walked with the tables of all
				// its files: a table being built is stepped with
				// frame pointers (not_ready). An emulated arm64 VM
				// took seconds for python3.11's, and a fixture that
				// started its work on a named warm frame then had
				// 216 of its 294 samples not_ready.
				return
			}
			for _, f := range s.frames {
				if r := pending[s.pid]; r != nil && f.typ == "cpython" && f.fn == "warm" {
					r.start(t)
					delete(pending, s.pid)
				}
			}
		})
	}
	for _, r := range pending {
		t.Errorf("%s (pid %d): no named warm frame in 45 s of warm-up", r.it.name, r.pid)
		r.start(t)
	}
	waitPy(t, runs)
	time.Sleep(2500 * time.Millisecond) // the last reports
	c.stop(t)
	checkPy(t, out, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// TestRecordPythonChains runs `profsym record --symbolize --pid ...` over
// fixtures started before it (the other half of the cases),
// warms them for 3 s of its sampling, stops it with SIGINT (Ctrl-C) when
// they are done, and checks the chains in its output.
func TestRecordPythonChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	runs := startPys(t, pyInterps(t))
	out := filepath.Join(t.TempDir(), "rec.json")
	// It says when its sampler runs (loading it took 5 s under a load
	// average of 23 on 2 cores); 3 s of warm-up walked from there.
	recordWhile(t, bin, out, runs, time.Second, 3*time.Second, append([]string{"--max-stack-words", pyStackWords}, matrixFlags...)...)
	checkPy(t, out, runs)
}

// recordWhile runs `profsym record --symbolize` over runs' processes,
// settle after they started (past their runtime's start), and once it
// samples and warmUp more has been walked, has them do their measured
// work; then it stops the recording with SIGINT (Ctrl-C), which
// symbolizes and writes out. flags are more of record's flags.
func recordWhile(t *testing.T, bin, out string, runs []*pyRun, settle, warmUp time.Duration, flags ...string) {
	t.Helper()
	recordWhileWith(t, bin, out, runs, settle, warmUp, waitPy, flags...)
}

// recordWhileWith is recordWhile with the fixtures' own wait for their
// measured work (their "go" and "done" lines).
func recordWhileWith(t *testing.T, bin, out string, runs []*pyRun, settle, warmUp time.Duration, wait func(*testing.T, []*pyRun), flags ...string) {
	t.Helper()
	args := append([]string{"record", "--symbolize", "--duration", "5m", "--output", out}, flags...)
	for _, r := range runs {
		args = append(args, "--pid", strconv.FormatInt(r.pid, 10))
	}
	time.Sleep(settle)
	rec := startRecord(t, bin, args...)
	log := rec.log
	time.Sleep(warmUp)
	for _, r := range runs {
		r.start(t)
	}
	wait(t, runs)
	rec.stop(t)
	t.Logf("%s", strings.TrimSpace(log.String()))
}
