package e2e

import (
	"fmt"
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

// phpChains are what every measured sample must hold, leaf first, per
// mode of the fixture. "{closure}" also matches 8.4's
// "{closure:FILE:LINE}"; array_map is a built-in (no file, no line).
var phpChains = map[string][]string{
	"chain":    {"leaf", "Chain::mid", "top", "{main}"},
	"callback": {"leaf", "{closure}", "array_map", "top", "{main}"},
	"deep":     append(append([]string{"leaf"}, slices.Repeat([]string{"rec"}, 51)...), "top", "{main}"),
}

// phpBuiltins are the chains' built-in functions.
var phpBuiltins = map[string]bool{"array_map": true}

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

// phpCase is one fixture process: a PHP, with or without the JIT, in a
// mode of phpchain.php.
type phpCase struct {
	pyInterp
	jit  bool
	mode string
}

// phpCases are the Debian PHPs the tests run (bookworm's 8.2, trixie's
// and sid's 8.4), without the JIT and, with jit, with it too, in each of
// modes.
func phpCases(t *testing.T, jit bool, modes ...string) []phpCase {
	t.Helper()
	var versions []pyInterp
	for _, v := range []struct{ suite, php string }{{"bookworm", "8.2"}, {"trixie", "8.4"}, {"sid", "8.4"}} {
		versions = append(versions, pyInterp{name: v.php + "-" + v.suite, python: "php" + v.php, root: testfixture.InterpreterChroot(t, "php", v.suite)})
	}
	var out []phpCase
	for _, mode := range modes {
		for _, v := range versions {
			for _, withJIT := range []bool{false, true} {
				if withJIT && !jit {
					continue
				}
				c := phpCase{pyInterp: v, jit: withJIT, mode: mode}
				if withJIT {
					c.name += "-jit"
				}
				if mode != "chain" {
					c.name += "-" + mode
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// startPHP starts phpchain.php in c's chroot; it warms until start.
func startPHP(t *testing.T, c phpCase) *pyRun {
	t.Helper()
	src := testfixture.Src(t, "e2e/phpchain.php")
	r := &pyRun{it: c.pyInterp, lines: make(chan string, 16)}
	root := c.root
	r.script = testfixture.ChrootCopy(t, root, src)[0]
	var inside string
	r.gofile, inside = chrootGoFile(t, root, "phpchain-")
	flags := phpFlags
	if c.jit {
		flags = phpJITFlags
	}
	argv := append(append([]string{c.python}, flags...), r.script, strconv.Itoa(pyChainSeconds), inside, c.mode)
	r.cmd = testfixture.ChrootCommand(root, argv...)
	r.run(t)
	return r
}

// phpWhole says whether frames hold the whole named chain: its PHP
// frames, leaf first, are exactly chain, each of type php, in the
// fixture's file on a marked line of its function (built-ins: neither).
// Native frames may lie above the leaf, between PHP frames (the
// built-in's C code) and below {main}.
func phpWhole(frames []userFrame, chain []string, script string, marks map[string][]int64) (bool, string) {
	var php []userFrame
	for _, f := range frames {
		if f.typ == "php" {
			php = append(php, f)
		}
	}
	ok := len(php) == len(chain)
	desc := make([]string, len(php))
	for i, f := range php {
		if f.raw {
			desc[i] = "raw(" + f.err + ")"
			ok = false
			continue
		}
		desc[i] = fmt.Sprintf("%s@%s:%d", f.fn, f.file, f.line)
		if i >= len(chain) {
			ok = false
			continue
		}
		want := chain[i]
		name := f.fn
		if want == "{closure}" && strings.HasPrefix(name, "{closure:") {
			name = want
		}
		switch {
		case name != want:
			ok = false
		case phpBuiltins[want]:
			ok = ok && f.path == "" && f.line == 0
		default:
			ok = ok && f.path == script && slices.Contains(marks[want], f.line)
		}
	}
	leaf := "none"
	if len(frames) > 0 {
		leaf = frames[0].fn + " " + frames[0].typ
		if frames[0].raw {
			leaf = "raw(" + frames[0].err + ") " + frames[0].typ
		}
	}
	if len(desc) > 12 { // deep: the middle says little
		desc = append(append(desc[:6:6], fmt.Sprintf("... %d more ...", len(desc)-12)), desc[len(desc)-6:]...)
	}
	return ok, "[" + strings.Join(desc, " ") + "] leaf frame " + leaf
}

func checkPHP(t *testing.T, path string, cases []phpCase, runs []*pyRun) {
	t.Helper()
	var user []string
	for _, chain := range phpChains {
		for _, fn := range chain {
			if !phpBuiltins[fn] && !slices.Contains(user, fn) {
				user = append(user, fn)
			}
		}
	}
	marks := fixtureMarks(t, "phpchain.php", `// L:([A-Za-z:{}]+)`, user)
	mode := map[*pyRun]string{}
	for i, r := range runs {
		mode[r] = cases[i].mode
	}
	checkChains(t, path, runs, chainCheck{
		kind: "PHP", samples: "samples",
		whole: func(r *pyRun, s sampleOf) (bool, string) {
			return phpWhole(s.frames, phpChains[mode[r]], r.script, marks)
		},
		want: func(r *pyRun) string {
			return fmt.Sprintf("%s with names, file %s and marked lines", strings.Join(phpChains[mode[r]], " <- "), r.script)
		},
	})
}

// TestRecordPHPChains runs `profsym record --symbolize --pid ...` over
// the fixtures in every mode (a nested chain with a method, a built-in
// that calls back into PHP, 50 levels of recursion) without the JIT, warms
// them for 3 s of its sampling, and checks the chains in its output.
func TestRecordPHPChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	cases := phpCases(t, false, "chain", "callback", "deep")
	runs := make([]*pyRun, len(cases))
	for i, c := range cases {
		runs[i] = startPHP(t, c)
	}
	out := filepath.Join(t.TempDir(), "rec.json")
	recordWhile(t, bin, out, runs, time.Second, 3*time.Second)
	checkPHP(t, out, cases, runs)
}

// TestCollectorPHPChains runs the distribution with config/default.yaml
// (php on by default), starts the chain fixtures (with and without the
// JIT) after it, lets each warm up
// until the output names its warm frame, and checks the chains in the
// file.
func TestCollectorPHPChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	cases := phpCases(t, true, "chain")
	c, out := startDefaultCollector(t, bin)
	runs := make([]*pyRun, len(cases))
	for i, c := range cases {
		runs[i] = startPHP(t, c)
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
	checkPHP(t, out, cases, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}
