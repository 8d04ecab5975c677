package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// TestCollectorCgroupSelection runs the distribution with a target naming
// one of two cgroups (by its directory under the cgroup2 mount), then
// makes a cgroup below it and runs a busy process there and one in the
// other cgroup: the output holds samples of the first (the new cgroup was
// selected by a rescan) and none of the other's, and the receiver's
// telemetry counts the other's samples as not_selected, dropped in the
// kernel before any walk.
func TestCollectorCgroupSelection(t *testing.T) {
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	root := testfixture.Root(t)
	sel, other := testfixture.NewCgroup(t), testfixture.NewCgroup(t)
	work := t.TempDir()
	out := filepath.Join(work, "profiles.json")
	prom := testfixture.FreePort(t)
	overlay := filepath.Join(work, "select.yaml")
	os.WriteFile(overlay, []byte(fmt.Sprintf(`
receivers:
  profiling:
    targets:
      - cgroup: %s
`, sel.Dir)+telemetryOverlay(prom)), 0o644)
	env := []string{
		"PROFSYM_OUTPUT=" + out,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_REPORT_INTERVAL=1s",
	}
	c := startCollector(t, bin, "collector", env, filepath.Join(root, "config", "default.yaml"), overlay)
	hot := testfixture.Build(t, testfixture.Spec{
		Name: "cgsel-hot", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-fno-omit-frame-pointer", "-DE2E_ID=cgsel"},
	})
	run := func(cg *testfixture.Cgroup) *exec.Cmd {
		argv := cg.Wrap(hot, "3")
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// Made after the collector started: selected by the next rescan
	// (rescan_interval 1s), as its parent's path is a prefix of its own.
	child := testfixture.NewCgroup(t, sel.Path)
	time.Sleep(1500 * time.Millisecond)
	a, b := run(child), run(other)
	a.Wait()
	b.Wait()
	time.Sleep(2500 * time.Millisecond) // the last reports
	verdicts := selectionVerdicts(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", prom))
	c.stop(t)

	pa, pb := int64(a.Process.Pid), int64(b.Process.Pid)
	ty := load(t, out, map[int64]bool{pa: true, pb: true})
	cpuB := b.ProcessState.UserTime() + b.ProcessState.SystemTime()
	t.Logf("selected: %d samples; other: %d samples for %v of CPU; verdicts %v", ty.samples[pa], ty.samples[pb], cpuB, verdicts)
	if ty.samples[pa] == 0 {
		t.Errorf("no sample of the selected cgroup's process")
	}
	if ty.samples[pb] != 0 {
		t.Errorf("%d samples of the other cgroup's process", ty.samples[pb])
	}
	// The other process alone gives half what its CPU time does at 99 Hz.
	if want := cpuB.Seconds() * 99 / 2; verdicts["cpu/not_selected"] < want {
		t.Errorf("%v CPU samples not selected, want at least %.0f (the other process's)", verdicts["cpu/not_selected"], want)
	}
	if verdicts["cpu/selected"] < float64(ty.samples[pa]) {
		t.Errorf("%v CPU samples selected, fewer than the %d in the output", verdicts["cpu/selected"], ty.samples[pa])
	}
	if t.Failed() {
		t.Logf("collector log (tail):\n%s", tail(c.log.String(), 4000))
	}
}

// selectionVerdicts scrapes receiver_profiling_selection_verdicts by
// origin/verdict.
func selectionVerdicts(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	label := func(line, name string) string {
		_, v, _ := strings.Cut(line, name+`="`)
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "otelcol_receiver_profiling_selection_verdicts") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		out[label(line, "origin")+"/"+label(line, "verdict")] += v
	}
	return out
}
