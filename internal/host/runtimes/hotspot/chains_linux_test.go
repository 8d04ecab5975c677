package hotspot_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/hotspot"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// timeScale stretches a fixture's clocks where the JVM runs emulated:
// test/kernels' VMs set PROFSYM_TEST_TIME_SCALE (JIT compilation and start-up
// are 10-30 times slower there).
func timeScale() int {
	if n, err := strconv.Atoi(os.Getenv("PROFSYM_TEST_TIME_SCALE")); err == nil && n > 0 {
		return n
	}
	return 1
}

// fixtureSeconds is how long a Chain run lasts: warm-up, sampling and
// slack for a loaded machine.
const fixtureSeconds = "30"

// TestJavaChains runs fixture.Chain on JDK 11, 17 and 21, interpreted, by
// C1 alone, by C2 and through a JNI call that calls back into Java, and
// requires 99% of the main thread's samples to carry the whole chain,
// each Java frame with its name and the line javap gives: the line of the
// call for callers, a line of hot for hot. Below main come the call stub
// and libjvm down to the thread's start, with no stop reason.
func TestJavaChains(t *testing.T) {
	h := newHarness(t, sampler.Config{Runtimes: runtimes.Config{HotSpot: true}})
	jar, lib := javaFixtures(t)
	lines, calls := javapLines(t, jar, "fixture.Chain")
	// The compiled modes sample once the JIT has compiled what they are
	// about (jit), the interpreted ones once the fixture says it is in
	// its loop (a JVM's start-up is 0.3 s here, seconds in the emulated
	// arm64 VM); within warm at most.
	type mode struct {
		name string
		jvm  []string
		jni  bool
		warm time.Duration
		jit  []compiled
	}
	c1 := []compiled{{method: "fixture.Chain::hot", level: 1}, {method: "fixture.Chain::b", level: 1}, {method: "fixture.Chain::a", level: 1}}
	modes := []mode{
		{name: "interpreted", jvm: []string{"-Xint"}, warm: 10 * time.Second},
		{name: "c1", jvm: []string{"-XX:TieredStopAtLevel=1"}, warm: 10 * time.Second, jit: c1},
		// C2's a, with b and hot inlined into it.
		{name: "c2", warm: 15 * time.Second, jit: []compiled{{method: "fixture.Chain::a", level: 4}}},
		// C2 alone with the inlining pinned: hot compiled on its own,
		// b inlined into a, so every compiled sample from hot has one
		// known shape.
		{name: "c2-pinned", jvm: []string{
			"-XX:-TieredCompilation", "-XX:CompileCommand=quiet",
			"-XX:CompileCommand=dontinline,fixture.Chain::hot", "-XX:CompileCommand=inline,fixture.Chain::b",
			"-XX:CompileCommand=dontinline,fixture.Chain::a",
		}, warm: 20 * time.Second, jit: []compiled{{method: "fixture.Chain::hot"}, {method: "fixture.Chain::a"}}},
		// Through JNI a is called 50 times a second, too rarely for C2;
		// hot's loop is replaced on the stack by C2's code at once.
		{name: "jni", jni: true, warm: 15 * time.Second, jit: []compiled{{method: "fixture.Chain::hot", level: 4, osr: true}}},
		{name: "jni-interpreted", jvm: []string{"-Xint"}, jni: true, warm: 10 * time.Second},
	}
	if runtime.GOARCH == "arm64" {
		// The JVM signs the return addresses it saves (PAC, on CPUs
		// with it: hasPAC), interpreted and compiled frames alike.
		modes = append(modes, mode{name: "c1-pac", jvm: []string{"-XX:TieredStopAtLevel=1", "-XX:UseBranchProtection=standard"}, warm: 10 * time.Second, jit: c1})
	}
	for _, j := range jdks(t) {
		for _, m := range modes {
			if only := os.Getenv("HSMODE"); only != "" && only != m.name {
				continue // a developer's shortcut, as HSJDK
			}
			if m.jni && lib == "" {
				continue // prebuiltJDK's fixtures have no JNI library
			}
			t.Run(j.name+"/"+m.name, func(t *testing.T) {
				if slices.Contains(m.jvm, "-XX:UseBranchProtection=standard") && !hasPAC(t) {
					testfixture.SkipOrFail(t, "the CPU has no pointer authentication (paca in /proc/cpuinfo): nothing is signed")
				}
				arg := "chain"
				want := []string{"hot", "b", "a", "main"}
				if m.jni {
					arg = "jni"
					want = []string{"hot", "back", "viaNative", "a", "main"}
				}
				c := chainCheck{want: want, lines: lines, calls: calls, lib: lib, jni: m.jni, pinned: m.name == "c2-pinned"}
				// Where nothing can inline hot (the interpreter, or C2
				// told not to), the fixture's time in hot is the share
				// asked: 99.7-100% of the samples in c2-pinned on JDK 8
				// to 27, and the same interpreted (issue 31's 90%).
				c.hotShare = 25
				if c.pinned || slices.Contains(m.jvm, "-Xint") {
					c.hotShare = 90
				}
				scale := timeScale()
				secs, _ := strconv.Atoi(fixtureSeconds)
				warm := warmup{d: m.warm * time.Duration(scale)}
				jvm := m.jvm
				if m.jit != nil {
					jvm, warm.jit = watchJIT(jvm, m.jit)
				} else {
					warm.jit = watchLine("ready")
				}
				cmd := javaCmd(t, j, jar, lib, jvm, "fixture.Chain", arg, strconv.Itoa(secs*scale))
				h.sampleJVMAfter(t, cmd, warm, 5*time.Second*time.Duration(scale), 300, false, func(pid int, samples []sampler.Sample) {
					// The fixture's JVM itself: the machine-wide count of
					// refusals also counts other JVMs the sampler meets (a
					// java -version, another package's tests), half set up
					// or exiting (CI: "JDK 11 refused (1 failures)" with
					// the fixture's 389 of 389 samples whole).
					if h.s.Runtimes().Refused(pid) {
						t.Errorf("JDK %d refused", j.feature)
					}
					p, err := h.norm.Refresh(pid)
					if err != nil {
						t.Fatal(err)
					}
					c.run(t, h, p, samples, m.name == "c2")
				})
			})
		}
	}
	st := h.s.Runtimes().Stats()
	t.Logf("runtimes: %+v", st)
}

type chainCheck struct {
	want  []string
	lines map[string][]uint32
	calls map[string]uint32
	lib   string
	jni   bool
	// pinned: hot not inlined, b inlined into a, a not inlined into main
	// (c2-pinned's CompileCommands).
	pinned bool
	// hotShare: the percentage of the samples that must start at hot.
	hotShare uint64
}

func (c chainCheck) run(t *testing.T, h *harness, p *normalize.Process, samples []sampler.Sample, inlining bool) {
	var all, whole, full, inlined, shaped uint64
	stops := map[string]uint64{}
	starts := map[string]uint64{} // whole samples by their innermost fixture method
	var bad []string
	for _, s := range samples {
		if s.Comm != "java" {
			continue
		}
		all += s.Count
		stops[s.Stop.String()] += s.Count
		fs := h.frames(p, s)
		why, fromHot := c.whole(t, p, fs, s)
		if why != "" {
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("%d x %s (stop %s): %s", s.Count, why, s.Stop, describe(fs)))
			}
			continue
		}
		whole += s.Count
		for _, f := range fs {
			if f.java && strings.HasPrefix(f.name, "fixture.") {
				starts[strings.TrimPrefix(f.name, "fixture.Chain.")] += s.Count
				break
			}
		}
		if fromHot {
			full += s.Count
			if c.pinned && pinnedShape(fs) {
				shaped += s.Count
			} else if c.pinned && len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("%d x not c2-pinned's shape: %s", s.Count, describe(fs)))
			}
		}
		if slices.ContainsFunc(fs, func(f frameOf) bool { return f.inlined }) {
			inlined += s.Count
		}
	}
	t.Logf("%d of %d main-thread samples whole (%.2f%%), %d of them from hot, %d with inlined frames; stops %v; innermost fixture methods %v", whole, all,
		100*float64(whole)/float64(max(all, 1)), full, inlined, stops, starts)
	if c.pinned {
		t.Logf("%d of the %d from hot with hot on its own and b inlined into a", shaped, full)
	}
	for _, b := range bad {
		t.Log(b)
	}
	if all < 50 {
		t.Fatalf("only %d samples of the main thread", all)
	}
	if whole*100 < all*99 {
		t.Errorf("whole chains in %d of %d samples, want 99%%; unwind tables %+v", whole, all, h.u.Stats())
	}
	// A check of the fixture, not of the walk: its main thread spends
	// most of its time in hot. With JDK 11's C2 (hot inlined into b into
	// a) a share of the samples is named a, at a line of a's own: 92.5%
	// and 88.9% from hot in two CI runs on one machine, 72.5% and 49.1%
	// in CI and 70.8% quiet on another (249 of 491 in a once), every
	// sample whole. So a quarter is asked there, of hot and of inlined
	// frames; where the inlining is pinned, 90% (hotShare).
	if full*100 < all*c.hotShare {
		t.Errorf("%d of %d samples start at hot, want %d%%: the fixture spends its time there", full, all, c.hotShare)
	}
	// The window starts once C2 has compiled a: samples of the
	// interpreted a are of calls that began before.
	if c.pinned && shaped*100 < full*95 {
		t.Errorf("%d of %d samples from hot have hot compiled on its own and b inlined into a", shaped, full)
	}
	if inlining && inlined*4 < whole {
		t.Errorf("inlined frames in %d of %d whole samples: C2 inlines b into a", inlined, whole)
	}
}

// whole says why fs is not a whole, right stack of the chain ("" when it
// is). Library methods the chain calls (System.nanoTime) may sit on top;
// below them the fixture's frames must be the chain from some method of it
// down to main, the innermost at a line of its own, each caller at the line
// of its call. full reports whether the stack starts at hot.
func (c chainCheck) whole(t *testing.T, p *normalize.Process, fs []frameOf, s sampler.Sample) (why string, full bool) {
	var java []int
	for i, f := range fs {
		if f.err != nil {
			return "unnamed: " + f.err.Error(), false
		}
		if f.java && (strings.HasPrefix(f.name, "fixture.") || len(java) > 0) {
			java = append(java, i)
		}
	}
	if len(java) == 0 || len(java) > len(c.want) {
		return fmt.Sprintf("%d Java frames", len(java)), false
	}
	want := c.want[len(c.want)-len(java):]
	caller := map[string]string{"b": "hot", "back": "hot", "main": "a"}
	if c.jni {
		caller["a"] = "viaNative"
	} else {
		caller["a"] = "b"
	}
	for k, i := range java {
		f, m := fs[i], want[k]
		if f.name != "fixture.Chain."+m {
			return fmt.Sprintf("frame %d is %s, want %s", k, f.name, m), false
		}
		switch {
		case m == "viaNative":
		case k == 0:
			if !slices.Contains(c.lines[m], f.line) {
				return fmt.Sprintf("%s at line %d, not one of %v", m, f.line, c.lines[m]), false
			}
		default:
			if want := c.calls[m+"->"+caller[m]]; f.line != want {
				return fmt.Sprintf("%s at line %d, want %d", m, f.line, want), false
			}
		}
	}
	last := java[len(java)-1]
	if last+2 >= len(fs) || !strings.HasSuffix(fs[last+1].name, "[call_stub]") || fs[last+2].name != "libjvm.so" {
		return "no call stub and libjvm below main", false
	}
	if c.jni && len(want) == len(c.want) {
		back, native := java[1], java[2]
		if !strings.HasSuffix(fs[back+1].name, "[call_stub]") {
			return "no call stub below back", false
		}
		found := false
		for _, f := range fs[back+2 : native] {
			if f.java {
				return "a Java frame between back and viaNative", false
			}
			found = found || (f.native != 0 && inFunc(t, p, c.lib, "Java_fixture_Chain_viaNative", f.native))
		}
		if !found {
			return "no Java_fixture_Chain_viaNative between back and viaNative", false
		}
	}
	// The native frames below must reach the thread's start in libc:
	// cleanly, or by frame pointers where the unwinder had no table for a
	// file yet (no_table, not_ready: libjvm keeps frame pointers). The
	// stop reasons are logged; a Java walker's reason (runtime) fails.
	end := fs[len(fs)-1].name
	switch {
	case s.Stop == sampler.StopOK:
	case (s.Stop == sampler.StopNoTable || s.Stop == sampler.StopNotReady) && strings.HasPrefix(end, "libc"):
	default:
		return "stop reason " + s.Stop.String(), false
	}
	return "", len(want) == len(c.want)
}

// pinnedShape reports whether fs, a whole chain from hot, has the shape
// c2-pinned compiles: hot on its own, b inlined into a, a on its own.
func pinnedShape(fs []frameOf) bool {
	var java []frameOf
	for _, f := range fs {
		if f.java && strings.HasPrefix(f.name, "fixture.") {
			java = append(java, f)
		}
	}
	return len(java) == 4 && !java[0].inlined && java[1].inlined && !java[2].inlined && !java[3].inlined
}

func describe(fs []frameOf) string {
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString(" <- ")
		}
		switch {
		case f.err != nil:
			fmt.Fprintf(&b, "[%v]", f.err)
		case f.native != 0:
			fmt.Fprintf(&b, "%s@%#x", f.name, f.native)
		case f.line != 0:
			fmt.Fprintf(&b, "%s:%d", f.name, f.line)
		default:
			b.WriteString(f.name)
		}
		if f.inlined {
			b.WriteString("(inl)")
		}
		switch f.kind {
		case hotspot.KindInterpreted:
			b.WriteString("[int]")
		case hotspot.KindCompiled:
			b.WriteString("[comp]")
		}
	}
	return b.String()
}

// TestJITWithoutWalker runs fixture.Chain with the HotSpot walker off.
// Compiled (C2) Java code keeps no frame pointer and has no unwind table:
// the native walker cannot step through it, and every stack that reaches
// it must say so (jit) rather than pass for whole. The template
// interpreter (-Xint) keeps rbp as a frame pointer: its frames chain, by
// frame pointers, to the call stub in libjvm, where unwind tables take
// over to the thread's start, so those stacks are whole (ok), their Java
// frames unnamed; that is also where the few ok stacks of the compiled run
// come from (code not yet compiled).
func TestJITWithoutWalker(t *testing.T) {
	jar, lib := javaFixtures(t)
	// run samples the fixture and returns, for the main thread's samples
	// that start in the code cache (anonymous memory), their stop reasons
	// and how many of the ok ones end in a file-backed frame.
	run := func(t *testing.T, jvmArgs []string) (jit uint64, stops map[string]uint64, okRooted uint64) {
		h := newHarness(t, sampler.Config{})
		cmd := javaCmd(t, jdk{name: "jdk17"}, jar, lib, jvmArgs, "fixture.Chain", "chain", fixtureSeconds)
		stops = map[string]uint64{}
		h.sampleJVM(t, cmd, 6*time.Second, 4*time.Second, false, func(pid int, samples []sampler.Sample) {
			p, err := h.norm.Refresh(pid)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range samples {
				if s.Comm != "java" || len(s.UserPCs) == 0 {
					continue
				}
				if m := p.Find(s.UserPCs[0]); m == nil || !m.Anonymous {
					continue
				}
				jit += s.Count
				stops[s.Stop.String()] += s.Count
				if s.Stop != sampler.StopOK {
					continue
				}
				if m := p.Find(s.UserPCs[len(s.UserPCs)-1]); m != nil && !m.Anonymous && m.Path != "" {
					okRooted += s.Count
				} else {
					t.Logf("an ok stack from the code cache with no root: %d frames, outermost %#x", len(s.UserPCs), s.UserPCs[len(s.UserPCs)-1])
				}
			}
		})
		t.Logf("%d main-thread samples in the code cache: stops %v, %d ok ones rooted in a file", jit, stops, okRooted)
		if jit < 20 {
			t.Fatalf("only %d samples in the code cache", jit)
		}
		if okRooted != stops["ok"] {
			t.Errorf("%d of %d ok stacks from the code cache do not end in a file: whole stacks must reach the thread's start", stops["ok"]-okRooted, stops["ok"])
		}
		return jit, stops, okRooted
	}
	t.Run("compiled", func(t *testing.T) {
		jit, stops, _ := run(t, nil)
		// One CI run had 3 of 396 ok: samples in code still interpreted.
		if stops["ok"]*50 > jit || stops["jit"]*10 < jit*9 {
			t.Errorf("stacks ending in compiled code: %v, want jit on at least 90%%, at most 2%% ok (interpreted code)", stops)
		}
	})
	t.Run("interpreted", func(t *testing.T) {
		jit, stops, _ := run(t, []string{"-Xint"})
		if stops["ok"]*100 < jit*99 {
			t.Errorf("stacks in the interpreter: %v, want ok (whole through frame pointers) on at least 99%%", stops)
		}
	})
}

// TestUnwalkableJVM runs fixture.Chain on a JDK whose layout profsym does
// not walk (one newer than the newest tested, 27): the process is counted
// as failed, and its stacks keep their native frames and say runtime.
// Every JDK this machine has is walked: the test skips (in CI too) until
// a newer one is installed.
func TestUnwalkableJVM(t *testing.T) {
	java := newerJDK(t)
	h := newHarness(t, sampler.Config{Runtimes: runtimes.Config{HotSpot: true}})
	jar, lib := javaFixtures(t)
	failed := h.s.Runtimes().Stats().Failed["hotspot"]
	cmd := javaCmd(t, jdk{name: "newer"}, jar, lib, nil, "fixture.Chain", "chain", fixtureSeconds)
	cmd.Path, cmd.Args[0] = java, java
	h.sampleJVM(t, cmd, 4*time.Second, 4*time.Second, false, func(pid int, samples []sampler.Sample) {
		var all, runtime uint64
		stops := map[string]uint64{}
		for _, s := range samples {
			if s.Comm != "java" {
				continue
			}
			all += s.Count
			stops[s.Stop.String()] += s.Count
			if s.Stop == sampler.StopRuntime {
				runtime += s.Count
			}
			if len(s.Runtime) > 0 {
				t.Fatalf("a runtime frame from a JVM that cannot be walked: %+v", s.Runtime)
			}
		}
		t.Logf("%d main-thread samples: stops %v", all, stops)
		if all < 50 || runtime*10 < all*9 {
			t.Errorf("stop reason runtime on %d of %d samples", runtime, all)
		}
	})
	if h.s.Runtimes().Stats().Failed["hotspot"] == failed {
		t.Error("the JVM was not counted as one that cannot be walked")
	}
}

// newerJDK finds a JDK newer than the layouts walked (28 or later).
func newerJDK(t *testing.T) string {
	t.Helper()
	homes, _ := filepath.Glob("/usr/lib/jvm/*/release")
	for _, r := range homes {
		b, err := os.ReadFile(r)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(l, `JAVA_VERSION="`)
			if !ok {
				continue
			}
			major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
			if major > 27 {
				return filepath.Join(filepath.Dir(r), "bin", "java")
			}
		}
	}
	// Not SkipOrFail: no such JDK exists yet, so CI cannot have one.
	t.Skip("no JDK newer than 27 under /usr/lib/jvm: every installed JDK is walked")
	return ""
}

// hasPAC says whether the CPU authenticates pointers with an address key
// (the arm64 VM's -cpu max,pauth-impdef=on does).
func hasPAC(t *testing.T) bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(strings.Fields(string(b)), "paca")
}
