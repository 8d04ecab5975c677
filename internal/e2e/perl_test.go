package e2e

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// Issue 28: Perl frames from the built binaries. The fixture
// (testdata/src/e2e/perlchain.pl) runs a chain of subs in package Chain
// with the host's perl (5.36) and Debian's of trixie (5.40) and sid (5.42)
// in chroots: mode chain main -> top -> mid -> leaf, mode sort main -> top
// -> sorter -> (sort's C) -> cmpleaf, mode deep main -> top -> 50 deep ->
// leaf.

// perlChains are the Perl frames every measured sample must hold per mode,
// leaf first (marks: the fixture's "# L:NAME" names).
var perlChains = map[string][]string{
	"chain": {"leaf", "mid", "top", "main"},
	"sort":  {"cmpleaf", "sorter", "top", "main"},
	"deep":  slices.Concat([]string{"leaf"}, slices.Repeat([]string{"deep"}, 50), []string{"top", "main"}),
}

// perlModes in the order they are run.
var perlModes = []string{"chain", "sort", "deep"}

// perlName is how the profile names the fixture's mark NAME.
func perlName(mark string) string {
	if mark == "main" {
		return "main"
	}
	return "Chain::" + mark
}

// perlInterps lists the perls: the host's (5.36), and Debian trixie's
// (5.40) and sid's (5.42) in chroots with package perl.
func perlInterps(t *testing.T) []pyInterp {
	t.Helper()
	var out []pyInterp
	if _, err := os.Stat("/usr/bin/perl"); err == nil {
		out = append(out, pyInterp{name: "5.36-host", python: "/usr/bin/perl"})
	} else {
		testfixture.SkipOrFail(t, "no perl on the host")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		testfixture.SkipPart(t, "debian-chroots", "debootstrap is not installed: no Debian perl 5.40 (trixie), 5.42 (sid)")
		return out
	}
	for _, c := range []struct{ suite, version string }{{"trixie", "5.40"}, {"sid", "5.42"}} {
		root := testfixture.Chroot(t, c.suite, "perl")
		out = append(out, pyInterp{name: c.version + "-" + c.suite, python: "/usr/bin/perl", root: root})
	}
	return out
}

// startPerl starts perlchain.pl in mode under it; it warms until start.
func startPerl(t *testing.T, it pyInterp, mode string) *pyRun {
	t.Helper()
	src := testfixture.Src(t, "e2e/perlchain.pl")
	it.name += "/" + mode
	r := &pyRun{it: it, lines: make(chan string, 16)}
	if it.root == "" {
		r.script, r.gofile = src, filepath.Join(t.TempDir(), "go")
		r.cmd = exec.Command(it.python, src, mode, strconv.Itoa(pyChainSeconds), r.gofile)
	} else {
		r.script = testfixture.ChrootCopy(t, it.root, src)[0]
		dir, err := os.MkdirTemp(filepath.Join(it.root, "tmp"), "perlchain-") //nolint:usetesting // inside the chroot
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		r.gofile = filepath.Join(dir, "go")
		inside := filepath.Join("/tmp", filepath.Base(dir), "go")
		r.cmd = testfixture.ChrootCommand(it.root, it.python, r.script, mode, strconv.Itoa(pyChainSeconds), inside)
	}
	r.run(t)
	return r
}

// expectPerl waits for the fixture's line word and stamps it: the fixture
// is off CPU around it (sleeping before "go", done after "done"), so the
// samples between the stamps are the measured work's.
func expectPerl(t *testing.T, r *pyRun, word string, limit time.Duration) uint64 {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok || l != word {
			t.Fatalf("%s (pid %d): %q instead of %q", r.it.name, r.pid, l, word)
		}
		return uint64(time.Now().UnixNano())
	case <-time.After(limit):
		t.Fatalf("%s (pid %d): no %q within %v", r.it.name, r.pid, word, limit)
	}
	return 0
}

func waitPerl(t *testing.T, runs []*pyRun) {
	t.Helper()
	for _, r := range runs {
		r.goNs = expectPerl(t, r, "go", 2*time.Minute)
	}
	for _, r := range runs {
		r.doneNs = expectPerl(t, r, "done", 3*time.Minute)
	}
}

// startPerls starts every mode under every perl.
func startPerls(t *testing.T) []*pyRun {
	t.Helper()
	var runs []*pyRun
	for _, it := range perlInterps(t) {
		for _, mode := range perlModes {
			runs = append(runs, startPerl(t, it, mode))
		}
	}
	return runs
}

// perlWhole says whether frames hold mode's whole named chain: its Perl
// frames, leaf first, exactly the chain's, of type perl, in the fixture's
// file, on a marked line of their sub; in mode sort with native frames
// between the comparison and the sub that sorts: sort's, Perl_pp_sort or
// Perl_sortsv_flags among them where any is named (a chroot's perl's
// native frames are partly raw in the output); or, in sorter's own code
// (its statements, the sort block's ops, sort's C code between two
// calls), the chain without cmpleaf. It also says what the Perl frames
// were.
func perlWhole(frames []userFrame, mode, script string, marks map[string][]int64) (bool, string) {
	chain := perlChains[mode]
	var pl, between []userFrame
	for _, f := range frames {
		switch {
		case f.typ == "perl":
			pl = append(pl, f)
		case len(pl) == 1:
			between = append(between, f)
		}
	}
	sorted := len(between) > 0 && (slices.ContainsFunc(between, func(f userFrame) bool { return f.fn == "Perl_pp_sort" || f.fn == "Perl_sortsv_flags" }) ||
		!slices.ContainsFunc(between, func(f userFrame) bool { return !f.raw }))
	if mode == "sort" && len(pl) == len(chain)-1 {
		// In sorter's own code, sort's or the sort block's: no callback.
		chain, sorted = chain[1:], true
	}
	ok := len(pl) == len(chain)
	desc := make([]string, len(pl))
	for i, f := range pl {
		if f.raw {
			desc[i] = "raw(" + f.err + ")"
			ok = false
			continue
		}
		desc[i] = fmt.Sprintf("%s@%s:%d", f.fn, f.file, f.line)
		if i >= len(chain) || f.fn != perlName(chain[i]) || f.path != script || !slices.Contains(marks[chain[i]], f.line) {
			ok = false
		}
	}
	if mode == "sort" && !sorted {
		ok = false
		names := make([]string, len(between))
		for i, f := range between {
			names[i] = cmp.Or(f.fn, "raw("+f.err+")")
		}
		desc = append(desc, "(no sort frame between the first two: "+strings.Join(names, " ")+")")
	}
	leaf := "none"
	if len(frames) > 0 {
		leaf = cmp.Or(frames[0].fn, "raw("+frames[0].err+")") + " " + frames[0].typ
	}
	return ok, "[" + strings.Join(desc, " ") + "] leaf frame " + leaf
}

func checkPerl(t *testing.T, path string, runs []*pyRun) {
	t.Helper()
	marks := fixtureMarks(t, "perlchain.pl", `# L:([a-z]+)`, slices.Concat(perlChains["chain"], perlChains["sort"], perlChains["deep"]))
	checkChains(t, path, runs, chainCheck{
		kind: "Perl", samples: "samples",
		whole: func(r *pyRun, s sampleOf) (bool, string) {
			return perlWhole(s.frames, r.it.name[strings.LastIndex(r.it.name, "/")+1:], r.script, marks)
		},
		want: func(r *pyRun) string {
			mode := r.it.name[strings.LastIndex(r.it.name, "/")+1:]
			names := make([]string, len(perlChains[mode]))
			for i, m := range perlChains[mode] {
				names[i] = perlName(m)
			}
			return fmt.Sprintf("%s with file %s and marked lines", strings.Join(names, " <- "), r.script)
		},
	})
}

// TestCollectorPerlChains runs the distribution with config/default.yaml
// (Perl walked by default), starts the fixtures after it, lets each warm
// up until the output names its warm frame, and checks the chains.
func TestCollectorPerlChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	c, out := startDefaultCollector(t, bin)
	runs := startPerls(t)
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
				if r := pending[s.pid]; r != nil && f.typ == "perl" && f.fn == "Chain::warm" {
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
	waitPerl(t, runs)
	time.Sleep(2500 * time.Millisecond) // the last reports
	c.stop(t)
	checkPerl(t, out, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// TestRecordPerlChains runs `profsym record --symbolize --pid ...` over
// the fixtures and checks the chains in its output.
func TestRecordPerlChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	runs := startPerls(t)
	out := filepath.Join(t.TempDir(), "rec.json")
	recordWhileWith(t, bin, out, runs, time.Second, 3*time.Second, waitPerl)
	checkPerl(t, out, runs)
}
