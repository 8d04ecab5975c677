package e2e

import (
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

// The Ruby half of the end-to-end runtime test: the built binaries, as a
// user runs them (every runtime on), against Debian's Ruby running
// testdata/src/e2e/rubychain.rb (no YJIT: Debian builds lack it).

// rubyChains are what every measured sample must hold, leaf first, per
// mode of the fixture.
var rubyChains = map[string][]string{
	"chain":  {"Chain#leaf", "block in Chain#mid", "Chain#run_block", "Chain#mid", "Object#top", "<main>"},
	"deep":   append(append([]string{"Chain#leaf"}, slices.Repeat([]string{"Chain#rec"}, 51)...), "Object#top", "<main>"),
	"each":   {"Chain#leaf", "block in Chain#each_mid", "Array#each", "Chain#each_mid", "Object#top", "<main>"},
	"thread": {"Chain#leaf", "block in Chain#mid", "Chain#run_block", "Chain#mid", "Object#top", "block in <main>"},
}

// rubyBuiltins are the chains' C functions: no file, no line.
var rubyBuiltins = map[string]bool{"Array#each": true}

// rubyCase is one fixture process: a Ruby in a mode of rubychain.rb.
type rubyCase struct {
	pyInterp
	mode string
}

// rubyCases are the Debian Rubies the tests run (bookworm's 3.1,
// trixie's and sid's 3.3) in each of modes.
func rubyCases(t *testing.T, modes ...string) []rubyCase {
	t.Helper()
	var versions []pyInterp
	for _, v := range []struct{ suite, ruby string }{{"bookworm", "3.1"}, {"trixie", "3.3"}, {"sid", "3.3"}} {
		versions = append(versions, pyInterp{name: v.ruby + "-" + v.suite, python: "ruby" + v.ruby, root: testfixture.InterpreterChroot(t, "ruby", v.suite)})
	}
	var out []rubyCase
	for _, mode := range modes {
		for _, v := range versions {
			c := rubyCase{pyInterp: v, mode: mode}
			if mode != "chain" {
				c.name += "-" + mode
			}
			out = append(out, c)
		}
	}
	return out
}

// startRuby starts rubychain.rb in c's chroot; it warms until start.
func startRuby(t *testing.T, c rubyCase) *pyRun {
	t.Helper()
	src := testfixture.Src(t, "e2e/rubychain.rb")
	r := &pyRun{it: c.pyInterp, lines: make(chan string, 16)}
	root := c.root
	r.script = testfixture.ChrootCopy(t, root, src)[0]
	var inside string
	r.gofile, inside = chrootGoFile(t, root, "rubychain-")
	argv := []string{c.python, "--disable-gems", r.script, strconv.Itoa(pyChainSeconds), inside, c.mode}
	r.cmd = testfixture.ChrootCommand(root, argv...)
	r.run(t)
	return r
}

// rubyMarks reads the lines of rubychain.rb marked "# L:NAME" (several
// names a line: "# L:A L:B").
func rubyMarks(t *testing.T) map[string][]int64 {
	t.Helper()
	b, err := os.ReadFile(testfixture.Src(t, "e2e/rubychain.rb"))
	if err != nil {
		t.Fatal(err)
	}
	marks := map[string][]int64{}
	for i, l := range strings.Split(string(b), "\n") {
		j := strings.Index(l, "# L:")
		if j < 0 {
			continue
		}
		for _, name := range strings.Split(l[j+len("# L:"):], " L:") {
			marks[strings.TrimSpace(name)] = append(marks[strings.TrimSpace(name)], int64(i+1))
		}
	}
	for _, chain := range rubyChains {
		for _, fn := range chain {
			if len(marks[fn]) == 0 && !rubyBuiltins[fn] {
				t.Fatalf("rubychain.rb marks no line of %s", fn)
			}
		}
	}
	return marks
}

// rubyWhole says whether frames hold the whole named chain: its Ruby
// frames, leaf first, are exactly chain, each of type ruby, in the
// fixture's file on a marked line of its method. Native frames may lie
// above the leaf and below the VM entry.
func rubyWhole(frames []userFrame, chain []string, script string, marks map[string][]int64) (bool, string) {
	var rb []userFrame
	for _, f := range frames {
		if f.typ == "ruby" {
			rb = append(rb, f)
		}
	}
	ok := len(rb) == len(chain)
	desc := make([]string, len(rb))
	for i, f := range rb {
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
		if rubyBuiltins[chain[i]] {
			ok = ok && f.fn == chain[i] && f.path == "" && f.line == 0
			continue
		}
		ok = ok && f.fn == chain[i] && f.path == script && slices.Contains(marks[chain[i]], f.line)
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

func checkRuby(t *testing.T, path string, cases []rubyCase, runs []*pyRun) {
	t.Helper()
	marks := rubyMarks(t)
	mode := map[*pyRun]string{}
	for i, r := range runs {
		mode[r] = cases[i].mode
	}
	checkChains(t, path, runs, chainCheck{
		kind: "Ruby", samples: "samples",
		whole: func(r *pyRun, s sampleOf) (bool, string) {
			return rubyWhole(s.frames, rubyChains[mode[r]], r.script, marks)
		},
		want: func(r *pyRun) string {
			return fmt.Sprintf("%s with names, file %s and marked lines", strings.Join(rubyChains[mode[r]], " <- "), r.script)
		},
	})
}

// TestRecordRubyChains runs `profsym record --symbolize --pid ...` over
// the fixtures in every mode (a method chain with a block, 50 levels of
// recursion, Array#each calling back into Ruby, the chain in a Thread), warms them for 3 s of its sampling,
// and checks the chains in its output.
func TestRecordRubyChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	cases := rubyCases(t, "chain", "deep", "each", "thread")
	runs := make([]*pyRun, len(cases))
	for i, c := range cases {
		runs[i] = startRuby(t, c)
	}
	out := filepath.Join(t.TempDir(), "rec.json")
	recordWhile(t, bin, out, runs, time.Second, 3*time.Second)
	checkRuby(t, out, cases, runs)
}

// TestCollectorRubyChains runs the distribution with config/default.yaml
// (ruby on by default), starts the chain fixtures after it, lets each
// warm up until the output names its warm frame, and checks the chains in
// the file.
func TestCollectorRubyChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	cases := rubyCases(t, "chain")
	c, out := startDefaultCollector(t, bin)
	runs := make([]*pyRun, len(cases))
	for i, c := range cases {
		runs[i] = startRuby(t, c)
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
				if r := pending[s.pid]; r != nil && f.typ == "ruby" && f.fn == "Object#warm" {
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
	checkRuby(t, out, cases, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}
