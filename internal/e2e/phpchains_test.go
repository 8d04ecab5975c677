package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// The PHP half of the end-to-end runtime test: the built binaries, as a
// user runs them (every runtime on), against Debian's PHP CLI running
// testdata/src/e2e/phpchain.php with opcache and its JIT off.

// phpChain is what every measured sample must hold, leaf first.
var phpChain = []string{"leaf", "Chain::mid", "top", "{main}"}

// phpFlags pin the engine: no php.ini (-n) and opcache off, so the
// fixture runs in the VM loop the walker follows; the "-jit" runs load
// opcache with its tracing JIT, whose code runs on execute_ex's frame.
var (
	phpFlags    = []string{"-n", "-d", "opcache.enable_cli=0", "-d", "opcache.jit=off"}
	phpJITFlags = []string{
		"-n", "-d", "zend_extension=opcache", "-d", "opcache.enable_cli=1",
		"-d", "opcache.jit=tracing", "-d", "opcache.jit_buffer_size=32M",
	}
)

// phpVersions are the Debian PHPs the test runs: bookworm's 8.2 and
// trixie's 8.4, each without and with the JIT.
func phpVersions(t *testing.T) []pyInterp {
	t.Helper()
	bookworm, trixie := testfixture.Chroot(t, "bookworm", "php8.2-cli"), testfixture.Chroot(t, "trixie", "php8.4-cli")
	return []pyInterp{
		{name: "8.2-bookworm", python: "php8.2", root: bookworm},
		{name: "8.4-trixie", python: "php8.4", root: trixie},
		{name: "8.2-bookworm-jit", python: "php8.2", root: bookworm},
		{name: "8.4-trixie-jit", python: "php8.4", root: trixie},
	}
}

// startPHP starts phpchain.php in it's chroot; it warms until start.
func startPHP(t *testing.T, it pyInterp) *pyRun {
	t.Helper()
	src := testfixture.Src(t, "e2e/phpchain.php")
	r := &pyRun{it: it, lines: make(chan string, 16)}
	root := it.root
	r.script = testfixture.ChrootCopy(t, root, src)[0]
	dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "phpchain-") //nolint:usetesting // inside the chroot
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r.gofile = filepath.Join(dir, "go")
	inside := filepath.Join("/tmp", filepath.Base(dir), "go")
	flags := phpFlags
	if strings.HasSuffix(it.name, "-jit") {
		flags = phpJITFlags
	}
	argv := append(append([]string{it.python}, flags...), r.script, strconv.Itoa(pyChainSeconds), inside)
	r.cmd = testfixture.ChrootCommand(root, argv...)
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", it.name, err)
	}
	r.pid = int64(r.cmd.Process.Pid)
	t.Cleanup(func() { r.cmd.Process.Kill(); r.cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	return r
}

// phpWhole says whether frames hold the whole named chain: its PHP
// frames, leaf first, are exactly phpChain, each of type php, in the
// fixture's file, on a marked line of its function. Native frames may lie
// above the leaf and below {main}.
func phpWhole(frames []userFrame, script string, marks map[string][]int64) (bool, string) {
	var php []userFrame
	for _, f := range frames {
		if f.typ == "php" {
			php = append(php, f)
		}
	}
	ok := len(php) == len(phpChain)
	desc := make([]string, len(php))
	for i, f := range php {
		if f.raw {
			desc[i] = "raw(" + f.err + ")"
			ok = false
			continue
		}
		desc[i] = fmt.Sprintf("%s@%s:%d", f.fn, f.file, f.line)
		if i >= len(phpChain) || f.fn != phpChain[i] || f.path != script || !slices.Contains(marks[f.fn], f.line) {
			ok = false
		}
	}
	leaf := "none"
	if len(frames) > 0 {
		leaf = frames[0].fn + " " + frames[0].typ
		if frames[0].raw {
			leaf = "raw(" + frames[0].err + ") " + frames[0].typ
		}
	}
	return ok, "[" + strings.Join(desc, " ") + "] leaf frame " + leaf
}

func checkPHP(t *testing.T, path string, runs []*pyRun) {
	t.Helper()
	marks := fixtureMarks(t, "phpchain.php", `// L:([A-Za-z:{}]+)`, phpChain)
	checkChains(t, path, runs, chainCheck{
		kind: "PHP", samples: "samples",
		whole: func(r *pyRun, s sampleOf) (bool, string) { return phpWhole(s.frames, r.script, marks) },
		want: func(r *pyRun) string {
			return fmt.Sprintf("%s with names, file %s and marked lines", strings.Join(phpChain, " <- "), r.script)
		},
	})
}

// TestRecordPHPChains runs `profsym record --symbolize --pid ...` over
// the fixtures, warms them for 3 s of its sampling, and checks the chains
// in its output.
func TestRecordPHPChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	versions := phpVersions(t)
	runs := make([]*pyRun, len(versions))
	for i, it := range versions {
		runs[i] = startPHP(t, it)
	}
	out := filepath.Join(t.TempDir(), "rec.json")
	recordWhile(t, bin, out, runs, time.Second, 3*time.Second)
	checkPHP(t, out, runs)
}

// TestCollectorPHPChains runs the distribution with config/default.yaml
// (php on by default), starts the fixtures after it, lets each warm up
// until the output names its warm frame, and checks the chains in the
// file.
func TestCollectorPHPChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	versions := phpVersions(t)
	root := testfixture.Root(t)
	out := filepath.Join(t.TempDir(), "profiles.json")
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	c := startCollector(t, bin, "collector", env, filepath.Join(root, "config", "default.yaml"))
	runs := make([]*pyRun, len(versions))
	for i, it := range versions {
		runs[i] = startPHP(t, it)
	}
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
			for _, f := range s.frames {
				if r := pending[s.pid]; r != nil && f.typ == "php" && f.fn == "warm" {
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
	checkPHP(t, out, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}
