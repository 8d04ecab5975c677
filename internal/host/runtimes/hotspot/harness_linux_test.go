package hotspot_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes/hotspot"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// A JDK of the test matrix: the host's, one installed on the host
// (Temurin), or a Debian release's in a chroot.
type jdk struct {
	name    string
	feature int    // its feature release
	root    string // "" for the host
	java    string // the java binary on the host; "" for the host's default
}

// hostJDKs are JDKs other than the default one installed on the build
// machine: Temurin 25, the current LTS.
var hostJDKs = []jdk{{name: "jdk25-temurin", feature: 25, java: "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"}}

// jdks are the JDKs the tests run: 11 (bullseye), 17 (the host's), 21
// (trixie), Temurin 25 (on the host, when installed; else sid's 25), and
// 8, 26 and 27 (sid). Building a chroot takes minutes the first time.
func jdks(t *testing.T) []jdk {
	t.Helper()
	if j, ok := prebuiltJDK(); ok {
		return []jdk{j}
	}
	testfixture.NeedTool(t, "java", "javac", "jar", "javap", "unshare")
	// HSJDK=name runs one JDK of the matrix (a developer's shortcut).
	only := os.Getenv("HSJDK")
	want := func(name string) bool { return only == "" || only == name }
	var out []jdk
	if want("jdk17") {
		out = append(out, jdk{name: "jdk17", feature: 17})
	}
	for _, c := range testfixture.RuntimeChroots {
		if name := "jdk" + strconv.Itoa(c.JDK); (c.JDK == 11 || c.JDK == 21) && want(name) {
			out = append(out, jdk{name: name, feature: c.JDK, root: c.Root(t)})
		}
	}
	for _, j := range hostJDKs {
		if !want(j.name) {
			continue
		}
		// Installed by hand, not by .ci/run: sid's OpenJDK 25 covers
		// the release where Temurin is missing.
		if _, err := os.Stat(j.java); err != nil {
			t.Logf("%s left out: %v", j.name, err)
			continue
		}
		out = append(out, j)
	}
	for _, v := range sidJDKs {
		// The same release twice costs minutes of CI for little: sid's
		// stands in only for a host JDK that is missing.
		name := fmt.Sprintf("jdk%d-sid", v)
		if only != name && slices.ContainsFunc(out, func(j jdk) bool { return j.feature == v }) {
			continue
		}
		if want(name) {
			out = append(out, jdk{name: name, feature: v, root: testfixture.Chroot(t, "sid", sidJDKPackages...),
				java: fmt.Sprintf("/usr/lib/jvm/java-%d-openjdk-amd64/bin/java", v)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].feature < out[j].feature })
	return out
}

// sidJDKs are the JDKs the sid chroot brings (the JREs: the fixtures are
// compiled on the host).
var (
	sidJDKs        = []int{8, 25, 26, 27}
	sidJDKPackages = []string{"openjdk-8-jre-headless", "openjdk-25-jre-headless", "openjdk-26-jre-headless", "openjdk-27-jre-headless"}
)

// prebuiltJDK is the JDK prepared for a machine without a JDK to build
// with (test/kernels' VMs; testfixture.VMJDK), run in its root as in a
// chroot. Its fixtures have no JNI library: the modes that need one are
// left out.
func prebuiltJDK() (jdk, bool) {
	j, ok := testfixture.VMJDK()
	if !ok {
		return jdk{}, false
	}
	return jdk{name: fmt.Sprintf("jdk%d-%s", j.Feature, runtime.GOARCH), feature: j.Feature, root: j.Root, java: j.Java}, true
}

// javaFixtures compiles the fixtures once (javac --release 8, so every
// JDK runs them) into a jar, and builds libchain.so against the host
// JDK's jni.h.
func javaFixtures(t testing.TB) (jar, lib string) {
	t.Helper()
	if j, ok := testfixture.VMJDK(); ok {
		return filepath.Join(j.Fixtures, "fixture.jar"), ""
	}
	javac := testfixture.NeedTool(t, "javac")
	jarTool := testfixture.NeedTool(t, "jar")
	dir := testfixture.Src(t, "runtimes/java/fixture")
	srcs, _ := filepath.Glob(filepath.Join(dir, "*.java"))
	h := sha256.New()
	for _, s := range srcs {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(s), len(b))
		h.Write(b)
	}
	ver, _ := exec.Command(javac, "-version").CombinedOutput()
	h.Write(ver)
	h.Write([]byte("--release 8"))
	jar = testfixture.Cached(t, "java-"+hex.EncodeToString(h.Sum(nil))[:16], "fixture.jar", func(tmp string) {
		classes := filepath.Join(tmp, "classes")
		testfixture.Run(t, javac, append([]string{"--release", "8", "-d", classes}, srcs...)...)
		testfixture.Run(t, jarTool, "cf", filepath.Join(tmp, "fixture.jar"), "-C", classes, ".")
	})
	real, err := filepath.EvalSymlinks(javac)
	if err != nil {
		t.Fatal(err)
	}
	inc := filepath.Join(filepath.Dir(filepath.Dir(real)), "include")
	lib = testfixture.Build(t, testfixture.Spec{Name: "libchain.so", Lang: "c", Sources: []string{"runtimes/java/chain.c"},
		Args: []string{"-O2", "-shared", "-fPIC", "-fno-stack-protector", "-I" + inc, "-I" + filepath.Join(inc, "linux")}})
	return jar, lib
}

// javaCmd makes the command that runs class with args on j.
func javaCmd(t testing.TB, j jdk, jar, lib string, jvmArgs []string, class string, args ...string) *exec.Cmd {
	t.Helper()
	cp, libDir := jar, filepath.Dir(lib)
	if j.root != "" {
		files := []string{jar}
		if lib != "" {
			files = append(files, lib)
		}
		in := testfixture.ChrootCopy(t, j.root, files...)
		cp = in[0]
		if lib != "" {
			libDir = filepath.Dir(in[1])
		}
	}
	argv := []string{"-cp", cp}
	if lib != "" {
		argv = append(argv, "-Djava.library.path="+libDir)
	}
	argv = append(argv, jvmArgs...)
	argv = append(argv, class)
	argv = append(argv, args...)
	java := "java"
	if j.java != "" {
		java = j.java
	}
	var cmd *exec.Cmd
	if j.root == "" {
		cmd = exec.Command(java, argv...)
	} else {
		cmd = testfixture.ChrootCommand(j.root, append([]string{java}, argv...)...)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// harness drives a sampler the way the receiver does: snapshots on
// process events go to the unwinder and the runtimes.
type harness struct {
	s    *sampler.Sampler
	u    *unwind.Manager
	norm *normalize.Normalizer
	done chan struct{}
	// snapshotEarly, when set, takes a snapshot of the process that long
	// after it starts; snapshotsAfterWarm are taken after the warm-up,
	// AttachRetryGap apart, as the walker's asking (at most once a second)
	// would.
	snapshotEarly      time.Duration
	snapshotsAfterWarm int
}

func newHarness(t testing.TB, cfg sampler.Config) *harness {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	if cfg.SampleRate == 0 {
		cfg.SampleRate = 99
	}
	if cfg.Logger == nil {
		// Info and above (why a JVM cannot be walked) shows with a
		// failure; HSDEBUG shows everything.
		level := zap.InfoLevel
		if os.Getenv("HSDEBUG") != "" {
			level = zap.DebugLevel
		}
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(level))
	}
	s, err := sampler.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, norm: normalize.New(normalize.Options{}), done: make(chan struct{})}
	// Taken once: Close clears them while events still drain.
	u, rs := s.Unwinder(), s.Runtimes()
	h.u = u
	go func() {
		defer close(h.done)
		for ev := range s.Events() {
			switch ev.Kind {
			case sampler.ProcessNew, sampler.ProcessExec, sampler.ProcessMapsChanged:
				p, err := h.norm.Refresh(int(ev.Pid))
				if err != nil {
					continue
				}
				if err := u.Track(p); err != nil {
					t.Errorf("track %d: %v", ev.Pid, err)
				}
				rs.Attach(p)
			case sampler.ProcessExit:
				// Names are checked before a fixture exits; what
				// the runtime keeps is dropped only at the end.
				u.Forget(int(ev.Pid))
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		<-h.done
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

// sampleJVM runs cmd, lets it warm up, then gives f the samples of its
// process over d, while it still runs (its frames are named from its
// memory). Then the JVM is killed, or waited for when wait is set. With
// atLeast, d is a bound: sampling stops once the process has that many
// samples (drained every half second), or after 4d (a loaded machine
// leaves it little CPU).
func (h *harness) sampleJVM(t testing.TB, cmd *exec.Cmd, warm, d time.Duration, wait bool, f func(pid int, samples []sampler.Sample)) {
	h.sampleJVMAtLeast(t, cmd, warm, d, 0, wait, f)
}

func (h *harness) sampleJVMAtLeast(t testing.TB, cmd *exec.Cmd, warm, d time.Duration, atLeast uint64, wait bool, f func(pid int, samples []sampler.Sample)) {
	t.Helper()
	h.sampleJVMAfter(t, cmd, warmup{d: warm}, d, atLeast, wait, f)
}

// warmup is what a JVM is given before its window: a time or, with jit,
// until the JIT has compiled what the mode is about (failing after d),
// then jitSettle.
type warmup struct {
	d   time.Duration
	jit *jitWatch
	// begin, when set, runs as the window begins (a fixture's measured
	// work starts).
	begin func()
}

// jitSettle follows the last compile waited for: callers still running
// the code it replaced return to the new code (each call of fixture.Chain's
// a lasts under a millisecond), and the drain before the window empties
// the rings of what came before.
const jitSettle = 500 * time.Millisecond

func (h *harness) sampleJVMAfter(t testing.TB, cmd *exec.Cmd, warm warmup, d time.Duration, atLeast uint64, wait bool, f func(pid int, samples []sampler.Sample)) {
	t.Helper()
	if warm.jit != nil {
		warm.jit.attach(t, cmd)
	}
	err := cmd.Start()
	if warm.jit != nil {
		warm.jit.started()
	}
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	pid := cmd.Process.Pid
	defer func() {
		if !wait {
			cmd.Process.Kill()
		}
		if err := cmd.Wait(); err != nil && wait {
			t.Errorf("the JVM: %v", err)
		}
		h.s.Runtimes().Forget(pid)
	}()
	snapshot := func() {
		if p, err := h.norm.Refresh(pid); err == nil {
			h.s.Runtimes().Attach(p)
		}
	}
	if h.snapshotEarly > 0 && h.snapshotEarly < warm.d {
		time.Sleep(h.snapshotEarly)
		snapshot()
		warm.d -= h.snapshotEarly
	}
	if warm.jit == nil {
		time.Sleep(warm.d)
	} else {
		select {
		case <-warm.jit.ready:
			t.Logf("ready (%v) %v after the start", warm.jit, time.Since(started).Round(time.Millisecond))
			time.Sleep(jitSettle)
		case <-time.After(warm.d):
			t.Fatalf("not ready after %v: waiting for %v; the fixture's compiles: %s", warm.d, warm.jit, warm.jit.compiles())
		}
	}
	for i := range h.snapshotsAfterWarm {
		if i > 0 {
			time.Sleep(hotspot.AttachRetryGap) // failures closer count once
		}
		snapshot()
	}
	if warm.begin != nil {
		warm.begin()
	}
	if _, err := h.s.Drain(); err != nil {
		t.Fatal(err)
	}
	var out []sampler.Sample
	var n uint64
	step, end := d, time.Now().Add(4*d)
	if atLeast > 0 {
		step = 500 * time.Millisecond
	}
	for first := true; first || (n < atLeast && time.Now().Before(end)); first = false {
		time.Sleep(step)
		b, err := h.s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range b.Samples {
			if int(s.Pid) == pid {
				out = append(out, s)
				n += s.Count
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no samples of pid %d", pid)
	}
	f(pid, out)
}

// frameOf is one user frame of a sample, named.
type frameOf struct {
	java    bool   // a Java method (interpreted, compiled or inlined)
	inlined bool   // inlined into the next frame (same compiled frame)
	name    string // method, stub name, or the native frame's file base name
	line    uint32
	native  uint64 // a native frame's PC
	kind    uint8  // a runtime frame's: hotspot.KindInterpreted, ...
	err     error
}

// frames names a sample's user frames, leaf first, inlined methods
// expanded innermost first.
func (h *harness) frames(p *normalize.Process, s sampler.Sample) []frameOf {
	var out []frameOf
	for _, pc := range s.UserPCs {
		if pc&sampler.RuntimeMark == 0 {
			f := frameOf{native: pc, name: "?"}
			if m := p.Find(pc); m != nil {
				f.name = filepath.Base(m.Path)
			}
			out = append(out, f)
			continue
		}
		i := pc &^ sampler.RuntimeMark
		if i >= uint64(len(s.Runtime)) {
			out = append(out, frameOf{name: fmt.Sprintf("<bad word %#x of %d runtime frames: %#x>", pc, len(s.Runtime), s.UserPCs)})
			continue
		}
		rf := s.Runtime[i]
		sym, err := h.s.Runtimes().Name(int(s.Pid), rf)
		if err != nil {
			out = append(out, frameOf{java: true, name: "<unnamed>", err: err})
			continue
		}
		stub := rf.Kind == hotspot.KindStub
		for i, f := range sym.Frames {
			out = append(out, frameOf{java: !stub, inlined: i < len(sym.Frames)-1, name: f.Name, line: f.Line, kind: rf.Kind})
		}
	}
	return out
}

// javapLines reads, per method of class, its LineNumberTable and the line
// of each static call it makes ("a->b": the line of a's call to b).
func javapLines(t testing.TB, jar, class string) (lines map[string][]uint32, calls map[string]uint32) {
	t.Helper()
	var out string
	if j, ok := testfixture.VMJDK(); ok {
		b, err := os.ReadFile(filepath.Join(j.Fixtures, "javap-"+class+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		out = string(b)
	} else {
		out = testfixture.Run(t, testfixture.NeedTool(t, "javap"), "-c", "-l", "-cp", jar, class)
	}
	lines, calls = map[string][]uint32{}, map[string]uint32{}
	method := regexp.MustCompile(`^  \S.* (\w+)\(.*\);$`)
	invoke := regexp.MustCompile(`^\s+(\d+): invokestatic .*// Method (\w+):`)
	table := regexp.MustCompile(`^\s+line (\d+): (\d+)$`)
	var cur string
	type call struct {
		bci    int
		callee string
	}
	var pending []call
	var rows [][2]int
	flush := func() {
		for _, c := range pending {
			best := -1
			for _, r := range rows {
				if r[1] <= c.bci && (best < 0 || r[1] >= rows[best][1]) {
					best = indexOf(rows, r)
				}
			}
			if best >= 0 {
				calls[cur+"->"+c.callee] = uint32(rows[best][0])
			}
		}
		pending, rows = nil, nil
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if m := method.FindStringSubmatch(l); m != nil {
			flush()
			cur = m[1]
		} else if m := invoke.FindStringSubmatch(l); m != nil {
			bci, _ := strconv.Atoi(m[1])
			pending = append(pending, call{bci, m[2]})
		} else if m := table.FindStringSubmatch(l); m != nil {
			line, _ := strconv.Atoi(m[1])
			bci, _ := strconv.Atoi(m[2])
			rows = append(rows, [2]int{line, bci})
			lines[cur] = append(lines[cur], uint32(line))
		}
	}
	flush()
	return lines, calls
}

func indexOf(rows [][2]int, r [2]int) int {
	for i := range rows {
		if rows[i] == r {
			return i
		}
	}
	return -1
}

// funcRange is a function's ELF address range.
type funcRange struct{ lo, hi uint64 }

var libFuncs sync.Map

// inFunc reports whether pc, a return address, is in fn of lib, mapped in p.
func inFunc(t testing.TB, p *normalize.Process, lib, fn string, pc uint64) bool {
	key := lib + "\x00" + fn
	v, ok := libFuncs.Load(key)
	if !ok {
		start, size := testfixture.Func(t, lib, fn)
		v = funcRange{start, start + size}
		libFuncs.Store(key, v)
	}
	r := v.(funcRange)
	m, vaddr, ok := p.Normalize(pc - 1)
	return ok && m != nil && filepath.Base(m.Path) == filepath.Base(lib) && vaddr >= r.lo && vaddr < r.hi
}
