package profbuild

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

const fixtureSeconds = "3"

// checkHot asserts that >= 90% of pid's samples have a leaf in hot of bin
// (by GNU build id and ELF address) and that those reach caller.
func checkHot(t *testing.T, r Report, pid int, cpu time.Duration, bin, hot, caller string) {
	t.Helper()
	bin = realPath(t, bin)
	id := gnuBuildID(t, bin)
	hotLo, hotHi := symRange(t, bin, hot)
	callLo, callHi := symRange(t, bin, caller)
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	var total, inHot, reaches int64
	var misses []string
	for _, s := range v.samples(t, pid) {
		total += s.count
		if s.attrs[pframe.AttrThreadID] == nil || s.attrs[pframe.AttrCPU] == nil || s.attrs[pframe.AttrThreadName] == nil {
			t.Fatalf("sample attributes %v", s.attrs)
		}
		if len(s.locs) == 0 {
			// No user frame: a sample taken while the process exits (its
			// memory gone), with the stop reason that says so. A miss,
			// not a crash of the test (CI saw one).
			if len(misses) < 5 {
				misses = append(misses, fmt.Sprintf("no frames (stop %v)", s.attrs[pframe.AttrUnwindStop]))
			}
			continue
		}
		leaf := s.locs[0]
		file, mattrs := v.mapping(leaf)
		if mattrs[pframe.AttrBuildIDGNU] != id || leaf.Address() < hotLo || leaf.Address() >= hotHi {
			if len(misses) < 5 {
				misses = append(misses, fmt.Sprintf("%s %v %#x", file, mattrs[pframe.AttrBuildIDGNU], leaf.Address()))
			}
			continue
		}
		inHot += s.count
		for _, l := range s.locs[1:] {
			if _, a := v.mapping(l); a[pframe.AttrBuildIDGNU] == id && l.Address() >= callLo && l.Address() < callHi {
				reaches += s.count
				break
			}
		}
	}
	want := cpu.Seconds() * 99
	t.Logf("pid %d: %d samples (%.0f expected), %d leaf in %s, %d reach %s; other leaves %v; failures %v",
		pid, total, want, inHot, hot, reaches, caller, misses, r.Failures)
	if total < 10 || float64(total) < 0.5*want {
		t.Fatalf("only %d samples for %v of CPU", total, cpu)
	}
	if float64(inHot) < 0.9*float64(total) {
		t.Errorf("%d/%d samples have their leaf in %s, want >= 90%%", inHot, total, hot)
	}
	if float64(reaches) < 0.9*float64(inHot) {
		t.Errorf("%d/%d hot samples reach %s, want >= 90%%", reaches, inHot, caller)
	}
}

func TestCHotFunction(t *testing.T) {
	bin := buildC(t)
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99, Logs: true})
	pid, cpu := runFixture(t, bin, fixtureSeconds)
	h.exitSeen(pid, 2*time.Second)
	r := h.collect(t)
	checkHot(t, r, pid, cpu, bin, "hot", "main")
}

func TestGoHotFunction(t *testing.T) {
	bin := buildGo(t)
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99})
	pid, cpu := runFixture(t, bin, fixtureSeconds)
	r := h.collect(t)
	checkHot(t, r, pid, cpu, bin, "main.hot", "main.main")
}

// A process that exits before the drain keeps its frames and build ids (the
// snapshot was taken at its first sample), and is forgotten after the report.
func TestExitedProcessKeepsFrames(t *testing.T) {
	bin := buildC(t)
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99})
	// The snapshot is taken when the builder handles the process's first
	// event, which lags on a loaded machine (every new process on the host
	// is read before it): the fixture lives until its snapshot exists, then
	// exits, and the test waits for that exit's own event, however late.
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	snap := waitFor(30*time.Second, func() bool { return h.b.norm.Cached(pid) != nil })
	time.Sleep(300 * time.Millisecond) // a few more samples
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if !snap {
		t.Fatalf("no snapshot of pid %d within 30 s of its start (%s)", pid, h.eventStats())
	}
	if !h.exitSeen(pid, 30*time.Second) {
		t.Fatalf("no exit event for pid %d within 30 s (%s)", pid, h.eventStats())
	}
	if h.b.norm.Cached(pid) == nil {
		t.Fatalf("snapshot of pid %d dropped at its exit, before the report", pid)
	}
	r := h.collect(t)
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	id := gnuBuildID(t, realPath(t, bin))
	var withID int64
	noFrames := map[any]int64{}
	for _, s := range v.samples(t, pid) {
		if len(s.locs) == 0 {
			// Taken as the process exits, its memory going (SIGTERM):
			// no user frame, a stop reason saying why (as in checkHot).
			noFrames[s.attrs[pframe.AttrUnwindStop]] += s.count
			continue
		}
		if _, a := v.mapping(s.locs[0]); a[pframe.AttrBuildIDGNU] == id {
			withID += s.count
		}
	}
	if withID == 0 {
		t.Fatalf("exited pid %d: no frame carries the fixture's build id %s (samples without user frames by stop reason: %v)", pid, id, noFrames)
	}
	for _, rp := range r.Profiles.ResourceProfiles().All() {
		a := rp.Resource().Attributes()
		if p, _ := a.Get(pframe.AttrPID); p.Int() == int64(pid) {
			exe, _ := a.Get(pframe.AttrExePath)
			if exe.Str() != realPath(t, bin) {
				t.Errorf("process.executable.path %q, want %q", exe.Str(), realPath(t, bin))
			}
		}
	}
	if h.b.norm.Cached(pid) != nil {
		t.Errorf("snapshot of exited pid %d kept after its report", pid)
	}
	t.Logf("exited pid %d: %d samples with build id %s", pid, withID, id)
}

func TestKernelFramesNamed(t *testing.T) {
	bin := buildC(t)
	h := newHarness(t, sampler.Config{SampleRate: 99, KernelStacks: true}, Options{SampleRate: 99, KernelSymbols: true, Logs: true})
	pid, cpu := runFixture(t, bin, fixtureSeconds, "syscall")
	r := h.collect(t)
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	var total, withK, readPath int64
	kernelID := ""
	for _, s := range v.samples(t, pid) {
		total += s.count
		var names []string
		for _, l := range s.locs {
			if v.attrs(l.AttributeIndices().AsRaw())[pframe.AttrFrameType] != pframe.TypeKernel {
				continue
			}
			file, a := v.mapping(l)
			if file == pframe.FileKernel {
				kernelID, _ = a[pframe.AttrBuildIDGNU].(string)
			}
			names = append(names, v.function(l))
		}
		if len(names) == 0 {
			continue
		}
		withK += s.count
		chain := strings.Join(names, ";")
		if strings.Contains(chain, "vfs_read") || strings.Contains(chain, "ksys_read") {
			readPath += s.count
		}
	}
	t.Logf("pid %d: %d samples for %v of CPU, %d with kernel frames, %d through vfs_read/ksys_read; vmlinux build id %q; failures %v",
		pid, total, cpu, withK, readPath, kernelID, r.Failures)
	if float64(withK) < 0.8*float64(total) {
		t.Errorf("%d/%d samples have kernel frames, want >= 80%%", withK, total)
	}
	if float64(readPath) < 0.8*float64(withK) {
		t.Errorf("%d/%d kernel stacks are named through vfs_read/ksys_read, want >= 80%%", readPath, withK)
	}
	if b, err := os.ReadFile("/sys/kernel/notes"); err == nil && len(b) > 0 && kernelID == "" {
		t.Errorf("kernel mapping without a build id although /sys/kernel/notes exists")
	}
}

// The JVM writes its perf map on request (jcmd PID Compiler.perfmap, JDK
// 17+); with -XX:+PreserveFramePointer the sampler walks JIT frames, which
// the builder names from the map.
func TestJavaFramesNamed(t *testing.T) {
	java := testfixture.NeedTool(t, "java")
	javac := testfixture.NeedTool(t, "javac")
	jcmd := testfixture.NeedTool(t, "jcmd")
	dir := t.TempDir()
	if out, err := exec.Command(javac, "-d", dir, testfixture.Src(t, "perfmap/Hot.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99, PerfMaps: true, Logs: true})
	cmd := exec.Command(java, "-XX:+PreserveFramePointer", "-cp", dir, "Hot", "30")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(filepath.Join("/tmp", "perf-"+strconv.Itoa(pid)+".map"))
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "started") {
		t.Fatalf("fixture did not start: %q %v", line, err)
	}
	time.Sleep(2 * time.Second) // let C2 compile spin
	if b, err := exec.Command(jcmd, strconv.Itoa(pid), "Compiler.perfmap").CombinedOutput(); err != nil {
		t.Fatalf("jcmd Compiler.perfmap: %v\n%s", err, b)
	}
	time.Sleep(2 * time.Second)
	r := h.collect(t)
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	var total, jvm, spin int64
	names := map[string]int64{}
	for _, s := range v.samples(t, pid) {
		total += s.count
		hasJVM, hasSpin := false, false
		for _, l := range s.locs {
			if v.attrs(l.AttributeIndices().AsRaw())[pframe.AttrFrameType] != pframe.TypeJVM {
				continue
			}
			hasJVM = true
			fn := v.function(l)
			names[fn] += s.count
			hasSpin = hasSpin || strings.Contains(fn, "Hot") && strings.Contains(fn, "spin")
		}
		if hasJVM {
			jvm += s.count
		}
		if hasSpin {
			spin += s.count
		}
	}
	t.Logf("pid %d: %d samples, %d with jvm frames, %d through Hot.spin; failures %v; jvm names %v", pid, total, jvm, spin, r.Failures, top(names, 8))
	if spin == 0 || float64(spin) < 0.3*float64(total) {
		t.Errorf("%d/%d samples have a jvm frame naming Hot.spin, want >= 30%%", spin, total)
	}
}

// top returns the n heaviest keys, for logs.
func top(m map[string]int64, n int) []string {
	var out []string
	for len(out) < n && len(m) > 0 {
		best, bv := "", int64(-1)
		for k, v := range m {
			if v > bv {
				best, bv = k, v
			}
		}
		out = append(out, fmt.Sprintf("%s=%d", best, bv))
		delete(m, best)
	}
	return out
}

// TestWholeChainInProfiles: through the whole receiver path (sampler with
// unwind tables, Builder feeding the unwinder), a chain built without frame
// pointers comes out whole in the OTLP profile, and the few samples that are
// not whole say why.
func TestWholeChainInProfiles(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{
		Name: "unwind-chain-pie", Lang: "c",
		Sources: []string{"unwind/chain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-fPIE", "-pie"},
	})
	h := newHarness(t, sampler.Config{SampleRate: 99}, Options{SampleRate: 99})
	pid, _ := runFixture(t, bin, fixtureSeconds)
	h.exitSeen(pid, 2*time.Second)
	r := h.collect(t)
	real := realPath(t, bin)
	id := gnuBuildID(t, real)
	chain := []string{"leaf", "d", "c", "b", "a", "main"}
	ranges := make([][2]uint64, len(chain))
	for i, n := range chain {
		ranges[i][0], ranges[i][1] = symRange(t, real, n)
	}
	name := func(addr uint64) string {
		for i, rg := range ranges {
			if addr >= rg[0] && addr < rg[1] {
				return chain[i]
			}
		}
		return ""
	}
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	samples := v.samples(t, pid)
	var t0 uint64
	for _, s := range samples {
		if t0 == 0 || s.first < t0 {
			t0 = s.first
		}
	}
	// As in internal/host/unwind's tests: samples marked not_ready or
	// unknown_mapping in a process's first 250 ms were taken before its
	// tables could be loaded; they are counted apart.
	var total, whole, marked, startup int64
	for _, s := range samples {
		stop, _ := s.attrs[pframe.AttrUnwindStop].(string)
		if (stop == "not_ready" || stop == "unknown_mapping") && s.first-t0 < uint64(250*time.Millisecond) {
			startup += s.count
			continue
		}
		total += s.count
		var got []string
		for _, l := range s.locs {
			if _, a := v.mapping(l); a[pframe.AttrBuildIDGNU] == id {
				if n := name(l.Address()); n != "" {
					got = append(got, n)
				}
			}
		}
		if strings.Join(got, " ") == strings.Join(chain[len(chain)-len(got):], " ") && len(got) > 0 && got[len(got)-1] == "main" {
			whole += s.count
		} else if stop != "" {
			marked += s.count
		}
	}
	t.Logf("pid %d: %d samples, %d whole, %d not whole but marked, %d marked start-up samples apart; unwind stops %v",
		pid, total, whole, marked, startup, r.UnwindStops)
	if total < 20 {
		t.Fatalf("only %d samples", total)
	}
	if float64(whole) < 0.99*float64(total) {
		t.Errorf("%d/%d samples whole, want >= 99%%", whole, total)
	}
}
