package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// offCPUChain is what every off_cpu sample of `wait sleep` must hold below
// libc's sleep, leaf first: the fixture is built without frame pointers, so
// only unwind tables in the sched_switch program's walk give it whole.
var offCPUChain = []string{"wait_sleep", "loop_sleep", "main"}

// TestCollectorOffCPU runs the distribution as a user turns off-CPU
// profiling on (off_cpu.enabled and wall, over config/default.yaml, the
// gateway's symbolization in the same pipeline) against a process that
// sleeps 10 ms at a time and measures its own time asleep. The output file
// holds its off_cpu profile: the time within a tenth of what the process
// measured, every sample's stack the named chain through the sleep, and a
// wall profile at least as long. Issue 32: off-CPU had no test through the
// built binaries.
//
// The process starts stopped and goes on once the agent has its unwind
// table: its first waits would otherwise end not_ready (2% of its waits in
// 3 s, measured here), the first-samples gap of issue 31, which is not
// what this test follows.
func TestCollectorOffCPU(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	root := testfixture.Root(t)
	wait := testfixture.Build(t, testfixture.Spec{
		Name: "e2e-offcpu-wait", Lang: "c", Sources: []string{"offcpu/wait.c"},
		Args: []string{"-O2", "-g", "-fomit-frame-pointer", "-Wall", "-pthread"},
	})
	work := t.TempDir()
	// A name of its own, so that off_cpu.targets selects it alone.
	name := fmt.Sprintf("offcpu%d", os.Getpid()%100000)
	exe := filepath.Join(work, name)
	data, err := os.ReadFile(wait)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "profiles.json")
	prom := testfixture.FreePort(t)
	overlay := filepath.Join(work, "offcpu.yaml")
	os.WriteFile(overlay, []byte(fmt.Sprintf(`
receivers:
  profiling:
    off_cpu:
      enabled: true
      wall: true
      targets:
        - process_name: ^%s$
`, name)+telemetryOverlay(prom)), 0o644)
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	c := startCollector(t, bin, "collector", env, filepath.Join(root, "config", "default.yaml"), overlay)
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", prom)
	ready := func() float64 { return scrape(t, metrics)[`otelcol_receiver_profiling_unwind_tables{state="ready"}`] }
	before := ready()
	cmd := exec.Command(exe, "sleep", "3")
	cmd.Env = append(os.Environ(), "WAIT_STOPPED=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for deadline := time.Now().Add(time.Minute); ready() <= before; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent built no unwind table for the new process in a minute (ready: %v)", before)
		}
	}
	cont := time.Now()
	cmd.Process.Signal(syscall.SIGCONT)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the last reports
	// The agent's own counts, for a failure to say where waits went: left
	// out undecided (the filter answered late), none seen at all (it
	// answered no), tables still pending.
	var counts []string
	for k, v := range scrape(t, metrics) {
		if strings.Contains(k, "off_cpu") || strings.Contains(k, "unwind_tables") || strings.Contains(k, "events_lost") {
			counts = append(counts, fmt.Sprintf("%s %v", k, v))
		}
	}
	sort.Strings(counts)
	c.stop(t)

	// The fixture's own measure of its time asleep.
	var truth time.Duration
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 5 && f[0] == "truth" && f[1] == "nanosleep" {
			ns, _ := strconv.ParseInt(f[3], 10, 64)
			truth += time.Duration(ns)
		}
	}
	pid := int64(cmd.Process.Pid)
	var off, wall, whole, stopped time.Duration
	var samples, broken int
	var example sampleOf
	eachSampleOf(t, out, map[int64]bool{pid: true}, func(s sampleOf) {
		switch s.typ {
		case "wall":
			wall += time.Duration(s.n)
		case "off_cpu":
			if s.time < uint64(cont.UnixNano()) {
				// Waits that began before SIGCONT: its stop, and the
				// dynamic loader's before it, with the agent still
				// building its tables (not_ready).
				stopped += time.Duration(s.n)
				return
			}
			off += time.Duration(s.n)
			samples++
			if chainBelow(s.frames, offCPUChain) {
				whole += time.Duration(s.n)
			} else if broken++; example.frames == nil {
				example = s
			}
		}
	})
	t.Logf("fixture asleep %v by its clock; off_cpu after SIGCONT %v in %d samples, %v of it the whole named chain (%d samples not); before it %v; wall %v",
		truth, off, samples, whole, broken, stopped, wall)
	if truth < 2*time.Second {
		t.Fatalf("the fixture slept %v of its 3 s: %q", truth, stdout.String())
	}
	if off < truth*9/10 || off > truth*11/10 {
		t.Errorf("off_cpu %v; the fixture slept %v", off, truth)
	}
	if whole < off*99/100 {
		t.Errorf("%v of %v off_cpu in the whole chain %v; one that is not (stop reason %q, at %v): %+v", whole, off, offCPUChain,
			example.stop, time.Unix(0, int64(example.time)).Format(time.StampMilli), example.frames)
	}
	if wall < off+stopped {
		t.Errorf("wall %v less than off_cpu %v", wall, off+stopped)
	}
	if t.Failed() {
		t.Logf("the agent's counts:\n%s", strings.Join(counts, "\n"))
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// chainBelow reports whether frames (leaf first) hold chain, consecutive
// and in order, anywhere below the leaf (libc's frames come first).
func chainBelow(frames []userFrame, chain []string) bool {
	for i := range frames {
		if len(frames)-i < len(chain) {
			return false
		}
		ok := true
		for j, fn := range chain {
			if frames[i+j].fn != fn {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
