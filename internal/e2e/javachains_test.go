package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// The Java half of issue 26: the built binaries, as a user runs them, must
// name a HotSpot JVM's frames on every JDK of the matrix, running
// testdata/src/e2e/JChain.java interpreted and compiled by C2.

// javaChain is what every measured sample's Java frames must be, leaf first.
var javaChain = []string{"hotLoop", "middle", "outer", "main"}

const (
	javaClass     = "e2e.JChain"
	javaFile      = "JChain.java"
	javaMainComm  = "java" // the thread the launcher runs main in
	javaWarmFrame = javaClass + ".warm"
)

// javaJDK is one JDK of the matrix: java is the binary as the process
// sees it, root its chroot ("" for the host).
type javaJDK struct {
	name, java, root string
	feature          int
}

// sidJDKPackages must stay the hotspot package's (harness_linux_test.go):
// the chroot is cached by its package list, so both share one.
var sidJDKPackages = []string{"openjdk-8-jre-headless", "openjdk-25-jre-headless", "openjdk-26-jre-headless", "openjdk-27-jre-headless"}

// javaJDKs is the hotspot package's matrix (jdks there): 17 (the host's),
// 11 (bullseye) and 21 (trixie) from the runtime chroots, Temurin 25 where
// installed, and 8, 26, 27 (and 25 without Temurin) from sid. Missing
// chroots are built (debootstrap), as there.
func javaJDKs(t *testing.T) []javaJDK {
	t.Helper()
	if j, ok := testfixture.VMJDK(); ok {
		// The one prepared for a VM (test/kernels: Debian's arm64 21).
		return []javaJDK{{name: fmt.Sprintf("jdk%d-%s", j.Feature, runtime.GOARCH), java: j.Java, root: j.Root, feature: j.Feature}}
	}
	testfixture.NeedTool(t, "java", "javac")
	var out []javaJDK
	// The host's default java: 17 on the build machine, as in jdks there.
	if java, err := exec.LookPath("java"); err == nil {
		out = append(out, javaJDK{name: "jdk17", java: java, feature: 17})
	}
	if j := "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"; fileExists(j) {
		out = append(out, javaJDK{name: "jdk25-temurin", java: j, feature: 25})
	} else {
		t.Logf("Temurin 25 is not installed: sid's 25 instead")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		// As pyInterps: the host's JDKs still run (CI fails here).
		testfixture.SkipPart(t, "debian-chroots", "debootstrap is not installed: no JDK 8, 11, 21, 26, 27")
	} else {
		for _, c := range testfixture.RuntimeChroots {
			if c.JDK == 11 || c.JDK == 21 {
				out = append(out, javaJDK{name: "jdk" + strconv.Itoa(c.JDK), java: "java", root: c.Root(t), feature: c.JDK})
			}
		}
		sid := testfixture.Chroot(t, "sid", sidJDKPackages...)
		for _, v := range []int{8, 25, 26, 27} {
			if slices.ContainsFunc(out, func(j javaJDK) bool { return j.feature == v }) {
				continue // sid's stands in only for a missing host JDK
			}
			out = append(out, javaJDK{
				name: fmt.Sprintf("jdk%d-sid", v), root: sid, feature: v,
				java: fmt.Sprintf("/usr/lib/jvm/java-%d-openjdk-amd64/bin/java", v),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].feature < out[j].feature })
	// JAVAE2E=jdk17,jdk8-sid runs those only (a developer's shortcut).
	if only := os.Getenv("JAVAE2E"); only != "" {
		out = slices.DeleteFunc(out, func(j javaJDK) bool { return !slices.Contains(strings.Split(only, ","), j.name) })
	}
	return out
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// javaModes pin how the chain runs, so that its frames are known: every
// method interpreted, or every method of the chain compiled by C2 on its
// own (not inlined; -Xbatch: compiled when warm() crosses the threshold,
// before "go"); each with the plain chain and with deepFrames frames of deep
// between outer and middle (issue 26's 50-deep recursion); and, from JDK
// 21, the C2-pinned chain on a virtual thread (issue 26).
var javaModes = func() []javaMode {
	xint := []string{"-Xint"}
	c2 := []string{
		"-XX:-TieredCompilation", "-Xbatch", "-XX:CompileCommand=quiet",
		"-XX:CompileCommand=dontinline," + javaClass + "::*",
	}
	return []javaMode{
		{"xint", xint, 0, false},
		{"c2", c2, 0, false},
		{"xint-deep", xint, deepFrames, false},
		{"c2-deep", c2, deepFrames, false},
		{"c2-virtual", c2, 0, true},
	}
}()

// javaMode is one way JChain runs.
type javaMode struct {
	name  string
	jvm   []string
	depth int // deep frames between outer and middle
	// virtual: the measured work runs on a virtual thread (JDK 21+),
	// walked on its carrier (issue 26).
	virtual bool
}

// virtualFrom is the first JDK with virtual threads.
const virtualFrom = 21

// javaCarriers reads the carrier thread id each virtual run prints after
// "done" (its name is no help: ForkJoinPool-1-worker-1 is "ForkJoinPool-1-"
// to the kernel up to JDK 25, "ForkJoi..rker-1" from 26).
func javaCarriers(t *testing.T, runs []*pyRun) {
	t.Helper()
	for _, r := range runs {
		if r.virtual {
			r.carrier = r.expect(t, "carrier", 10*time.Second)
		}
	}
}

// javaChainOf is the chain of a fixture with depth deep frames, leaf first.
func javaChainOf(depth int) []string {
	return slices.Concat(javaChain[:2], slices.Repeat([]string{"deep"}, depth), javaChain[2:])
}

// javaClasses compiles JChain.java once (javac --release 8) and returns
// the class directory.
func javaClasses(t *testing.T) string {
	t.Helper()
	if j, ok := testfixture.VMJDK(); ok {
		return filepath.Join(j.Fixtures, "jchain") // compiled by test/kernels
	}
	javac := testfixture.NeedTool(t, "javac")
	src := testfixture.Src(t, "e2e/"+javaFile)
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	ver, _ := exec.Command(javac, "-version").CombinedOutput()
	h := sha256.Sum256(append(append(b, ver...), "--release 8"...))
	return testfixture.Cached(t, "jchain-"+hex.EncodeToString(h[:])[:16], "classes", func(tmp string) {
		testfixture.Run(t, javac, "--release", "8", "-d", filepath.Join(tmp, "classes"), src)
	})
}

// startJava starts JChain under j in mode; it warms until start is called.
// It is a pyRun: the same go/done protocol.
func startJava(t *testing.T, j javaJDK, m javaMode, classes, seconds string) *pyRun {
	t.Helper()
	r := &pyRun{it: pyInterp{name: j.name + "/" + m.name}, lines: make(chan string, 16), depth: m.depth, virtual: m.virtual}
	args := append([]string{"-Xmx64m", "-cp"}, "CP")
	args = append(args, m.jvm...)
	args = append(args, javaClass, seconds, "GOFILE", strconv.Itoa(m.depth))
	gofile := len(args) - 2
	if m.virtual {
		args = append(args, "virtual")
	}
	if j.root == "" {
		r.gofile = filepath.Join(t.TempDir(), "go")
		args[2], args[gofile] = filepath.Clean(classes), r.gofile
		r.cmd = exec.Command(j.java, args...)
	} else {
		dir, err := os.MkdirTemp(filepath.Join(j.root, "tmp"), "jchain-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.CopyFS(filepath.Join(dir, "classes"), os.DirFS(classes)); err != nil {
			t.Fatal(err)
		}
		inside := filepath.Join("/tmp", filepath.Base(dir))
		r.gofile = filepath.Join(dir, "go")
		args[2], args[gofile] = inside+"/classes", inside+"/go"
		r.cmd = testfixture.ChrootCommand(j.root, append([]string{j.java}, args...)...)
	}
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r.run(t)
	return r
}

// startJavas starts JChain on every JDK in every mode (the virtual ones if
// virtual, where the JDK has them), all at once, each for seconds of the
// main thread's CPU.
func startJavas(t *testing.T, seconds string, virtual bool) []*pyRun {
	t.Helper()
	jdks := javaJDKs(t)
	classes := javaClasses(t)
	var runs []*pyRun
	for _, j := range jdks {
		for _, m := range javaModes {
			if m.virtual && (!virtual || j.feature < virtualFrom) {
				continue
			}
			runs = append(runs, startJava(t, j, m, classes, seconds))
		}
	}
	return runs
}

// javaVirtualChain is a virtual thread's chain: run in place of main.
var javaVirtualChain = []string{"hotLoop", "middle", "outer", "run"}

// javaMarks reads the lines of JChain.java marked "// L:NAME".
func javaMarks(t *testing.T) map[string][]int64 {
	return fixtureMarks(t, javaFile, `// L:([A-Za-z]+)`, append(javaChainOf(1), "run"))
}

// The JDK's frames below a virtual thread's run: one of them mounts it,
// and the last is its carrier's first.
const (
	javaMountFrame   = "java.lang.VirtualThread.run"
	javaCarrierFrame = "java.util.concurrent.ForkJoinWorkerThread.run"
)

// javaWhole says whether frames hold the whole chain: their Java frames
// (type jvm with a source file), leaf first, are exactly javaChainOf(depth), named
// e2e.JChain.METHOD, in JChain.java, on a marked line of the method.
// HotSpot stubs (type jvm, no file: the call stub below main) and native
// frames may lie anywhere; an unnamed jvm frame fails the sample. On a
// virtual thread, the chain is javaVirtualChain, followed by the JDK's
// frames only, through javaMountFrame down to javaCarrierFrame: the walk
// goes from the virtual thread's frames into its carrier's.
func javaWhole(frames []userFrame, depth int, virtual bool, marks map[string][]int64) (bool, string) {
	chain := javaChainOf(depth)
	if virtual {
		chain = javaVirtualChain
	}
	ok := true
	var desc []string
	var n int
	var mounted bool
	last := ""
	for _, f := range frames {
		if f.typ != "jvm" {
			continue
		}
		if f.raw {
			desc = append(desc, "raw("+f.err+")")
			ok = false
			continue
		}
		if f.path == "" {
			continue // a stub
		}
		desc = append(desc, fmt.Sprintf("%s@%s:%d", f.fn, f.file, f.line))
		last = f.fn
		if virtual && n >= len(chain) {
			// Below the fixture's frames: the JDK's.
			mounted = mounted || f.fn == javaMountFrame
			if strings.HasPrefix(f.fn, javaClass+".") || f.file == javaFile {
				ok = false
			}
			continue
		}
		if n >= len(chain) || f.fn != javaClass+"."+chain[n] || f.file != javaFile || !slices.Contains(marks[chain[n]], f.line) {
			ok = false
		}
		n++
	}
	if n != len(chain) || virtual && (!mounted || last != javaCarrierFrame) {
		ok = false
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

// checkJava holds each fixture's main-thread samples stamped from "go" to
// "done" to pyMinSamples and pyWholeShare; the JVM's other threads (JIT,
// GC) are counted apart, for the log.
func checkJava(t *testing.T, path string, runs []*pyRun) {
	t.Helper()
	marks := javaMarks(t)
	checkChains(t, path, runs, chainCheck{
		kind: "Java", samples: "main-thread samples (a virtual thread's carrier's)",
		keep: func(r *pyRun, s sampleOf) bool {
			if r.virtual {
				return uint64(s.tid) == r.carrier
			}
			return s.thread == javaMainComm
		},
		whole: func(r *pyRun, s sampleOf) (bool, string) { return javaWhole(s.frames, r.depth, r.virtual, marks) },
		want: func(r *pyRun) string {
			if r.virtual {
				return fmt.Sprintf("%s (%s.METHOD, %s, marked lines) <- the JDK's frames through %s to %s", strings.Join(javaVirtualChain, " <- "),
					javaClass, javaFile, javaMountFrame, javaCarrierFrame)
			}
			return fmt.Sprintf("%s (%s.METHOD, %s, marked lines)", strings.Join(javaChainOf(r.depth), " <- "), javaClass, javaFile)
		},
	})
}

// TestCollectorJavaChains runs the distribution with config/default.yaml,
// as TestCollectorPythonChains, against JChain on every JDK of the matrix
// in every mode at once, each warmed until the output names its warm
// frame in a whole stack.
func TestCollectorJavaChains(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	c, out := startDefaultCollector(t, bin, "yaml:receivers::profiling::unwinding::max_stack_words: "+pyStackWords, matrixConfig)
	runs := startJavas(t, matrixSeconds, true)

	// A dozen JVMs start on a loaded machine: 90 s for all of them to be
	// named warm.
	pending := map[int64]*pyRun{}
	for _, r := range runs {
		pending[r.pid] = r
	}
	warm := time.Now()
	deadline := warm.Add(90 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		pids := map[int64]bool{}
		for pid := range pending {
			pids[pid] = true
		}
		eachSampleOf(t, out, pids, func(s sampleOf) {
			if s.stop != "" {
				return // not walked with every file's table yet (TestCollectorPythonChains)
			}
			for _, f := range s.frames {
				if r := pending[s.pid]; r != nil && f.typ == "jvm" && f.fn == javaWarmFrame {
					r.start(t)
					delete(pending, s.pid)
				}
			}
		})
	}
	for _, r := range pending {
		t.Errorf("%s (pid %d): no named warm frame in 90 s of warm-up", r.it.name, r.pid)
		r.start(t)
	}
	t.Logf("warm-up until every JVM's warm frame was named: %v", time.Since(warm).Round(time.Second))
	start := time.Now()
	waitPy(t, runs)
	t.Logf("measured work of all fixtures: %v", time.Since(start).Round(time.Second))
	javaCarriers(t, runs)
	time.Sleep(2500 * time.Millisecond) // the last reports
	c.stop(t)
	checkJava(t, out, runs)
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// TestRecordJavaChains runs `profsym record --symbolize --pid ...` over
// the JVMs started before it, as TestRecordPythonChains.
func TestRecordJavaChains(t *testing.T) {
	bin := needBuilt(t, "profsym", "build")
	runs := startJavas(t, matrixSeconds, true)
	out := filepath.Join(t.TempDir(), "rec.json")
	// 8 s of warm-up walked: the JVMs are attached and past warm()'s
	// 20000 calls (compiled) meanwhile.
	recordWhile(t, bin, out, runs, 2*time.Second, 8*time.Second, append([]string{"--max-stack-words", pyStackWords}, matrixFlags...)...)
	javaCarriers(t, runs)
	checkJava(t, out, runs)
}
