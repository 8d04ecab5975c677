package cpython_test

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// The forging processes: 3.11's layout, and the same saying 3.99.
var (
	forgedPython    = forgedSpec("forged-python")
	forgedPython399 = forgedSpec("forged-python-399", "-DVERSION=0x036300f0")
)

func forgedSpec(name string, args ...string) testfixture.Spec {
	return testfixture.Spec{
		Name: name, Lang: "c", Sources: []string{"runtimes/python/forged.c"},
		Args: append([]string{"-O1", "-g", "-fno-omit-frame-pointer", "-pthread"}, args...),
	}
}

// TestFixturesBuild builds the package's native fixtures: test/kernels
// runs it to export them, built for the VM's architecture
// (testfixture.EnvExport), into the image.
func TestFixturesBuild(t *testing.T) {
	for _, s := range []testfixture.Spec{forgedPython, forgedPython399} {
		t.Run(s.Name, func(t *testing.T) { testfixture.Build(t, s) })
	}
}

// TestForgedInterpreter runs processes that forge CPython's state
// (forged.c, installed as python3.11): a forged version, a thread list
// that loops, a wild frame pointer, frame chains that turn into loops
// after attach, with an endless name and a line table of 2^40 bytes.
// Each keeps its native frames and says runtime; names stay within
// max_name_length; the agent carries on.
func TestForgedInterpreter(t *testing.T) {
	install := func(spec testfixture.Spec) string {
		bin := testfixture.Build(t, spec)
		py := filepath.Join(t.TempDir(), "python3.11")
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(py, b, 0o755); err != nil {
			t.Fatal(err)
		}
		return py
	}
	py := install(forgedPython)
	py399 := install(forgedPython399)
	h := newHarness(t, 99)
	for _, mode := range []string{"version", "threads", "wild", "late-loop", "deep-loop"} {
		t.Run(mode, func(t *testing.T) {
			bin := py
			if mode == "version" {
				bin = py399
			}
			cmd := exec.Command(bin, mode)
			cmd.Stderr = os.Stderr
			verdicts := func() uint64 {
				st := h.s.Runtimes().Stats()
				n := st.Attached
				for _, f := range st.Failed {
					n += f
				}
				return n
			}
			before := verdicts()
			start := time.Now()
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			ready := make(chan struct{})
			go func() {
				if line, err := bufio.NewReader(out).ReadString('\n'); err == nil && line == "ready\n" {
					close(ready)
				}
			}()
			// What is measured is what follows the agent's verdict on the
			// process (attached or refused) and the program's start-up:
			// samples taken while the agent still looks (not_ready, more of
			// them the busier the machine) are the first-samples question,
			// not this test's, and so are the dynamic loader's, which the
			// verdict can precede (it reads the file): in the emulated
			// arm64 VM the loader ran into the window, 2 samples of 284.
			deadline := time.After(15 * time.Second)
			select {
			case <-ready:
			case <-deadline:
				t.Fatalf("no ready line from pid %d after 15 s", cmd.Process.Pid)
			}
			for verdicts() == before {
				select {
				case <-deadline:
					t.Fatalf("no verdict on pid %d after 15 s: %+v", cmd.Process.Pid, h.s.Runtimes().Stats())
				case <-time.After(10 * time.Millisecond):
				}
			}
			// The agent's snapshot may predate the loader's mapping of
			// libc (there, the VM's first sample in clock_gettime had
			// 1 frame, unknown_mapping, and asked for this re-read): the
			// event the unwinder sends then, sent now, so that the window
			// starts with the process's libraries known.
			h.b.HandleEvent(sampler.Event{Pid: uint32(cmd.Process.Pid), Kind: sampler.ProcessMapsChanged})
			h.collect(t)
			time.Sleep(3 * time.Second)
			pid := cmd.Process.Pid
			r := h.collect(t)
			var total, runtime, named int64
			var names []string
			others := map[string]int64{} // samples not saying runtime: stop reason and innermost file
			for _, s := range samplesOf(t, r, pid, "python3.11", nil) {
				total += s.count
				if s.stop == "runtime" {
					runtime += s.count
				} else {
					others[fmt.Sprintf("%s in %s (%d native)", cmp.Or(s.stop, "ok"), s.leafFile, s.native)] += s.count
				}
				// A start-up sample, walked before the process was
				// tracked, may stop at the first frame pointer.
				if s.native < 2 && s.stop != "not_ready" {
					t.Errorf("a sample with %d native frames: %+v", s.native, s)
				}
				for _, p := range s.py {
					named += s.count
					if len(p.name) > runtimes.DefaultMaxNameBytes || len(p.file) > runtimes.DefaultMaxNameBytes {
						t.Errorf("a name of %d bytes, file of %d", len(p.name), len(p.file))
					}
					if len(names) < 3 {
						names = append(names, p.name[:min(len(p.name), 16)]+"…")
					}
				}
			}
			t.Logf("pid %d (%v): %d samples, %d say runtime (others %v), %d python frames %v; set %+v; walker %s; failures %v",
				pid, time.Since(start).Round(time.Millisecond), total, runtime, others, named, names, h.s.Runtimes().Stats(), walkerStats(t), r.Failures)
			if total < 20 {
				t.Fatalf("only %d samples", total)
			}
			if float64(runtime) < 0.95*float64(total) {
				t.Errorf("%d/%d samples say runtime, want >= 95%%", runtime, total)
			}
			if refused := !strings.Contains(mode, "loop"); refused && named > 0 {
				t.Errorf("%d python frames from a process refused at attach", named)
			}
		})
	}
}
