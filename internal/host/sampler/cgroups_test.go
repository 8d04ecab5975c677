package sampler

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// Two busy cgroups, one selected: the other's samples are all counted
// not_selected and none reaches a batch, and no more stacks are walked
// than samples selected, so none of the other's was.
func TestCgroupSelection(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	bin := buildC(t)
	sel, other := testfixture.NewCgroup(t), testfixture.NewCgroup(t)
	s, err := New(Config{SelectCgroups: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.SetCgroups(map[uint64]struct{}{sel.ID(t): {}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	before, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	run := func(cg *testfixture.Cgroup) *exec.Cmd {
		argv := cg.Wrap(bin, "2")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	a, b := run(sel), run(other)
	cpu := func(cmd *exec.Cmd) time.Duration {
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	cpuA, cpuB := cpu(a), cpu(b)
	batch, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	count := func(pid int) (n uint64) {
		for _, x := range samplesOf(batch, uint32(pid)) {
			n += x.Count
		}
		return n
	}
	checkSampleCount(t, count(a.Process.Pid), cpuA, 99)
	if n := count(b.Process.Pid); n != 0 {
		t.Errorf("%d samples of the process in the cgroup not selected", n)
	}
	selected := st.Selection.Selected - before.Selection.Selected
	notSelected := st.Selection.NotSelected - before.Selection.NotSelected
	var walks uint64
	for i := range st.Stops {
		walks += st.Stops[i] - before.Stops[i]
	}
	t.Logf("verdicts: %d selected, %d not selected; %d stacks walked", selected, notSelected, walks)
	// Every sample of the other cgroup's process met the selection (and
	// the host's other processes add to it).
	checkSampleCount(t, notSelected, cpuB, 99)
	if walks > selected {
		t.Errorf("%d stacks walked for %d samples selected: some were not selected", walks, selected)
	}
	if n := count(a.Process.Pid); selected < n {
		t.Errorf("%d samples selected, fewer than the %d of the selected process", selected, n)
	}
	if got := st.Samples - before.Samples; got != selected {
		t.Errorf("%d samples counted, %d selected: a sample not selected was counted", got, selected)
	}
}

// Without a selection, the programs neither look at cgroups nor count.
func TestNoCgroupSelectionCountsNothing(t *testing.T) {
	bin := buildC(t)
	s := newSampler(t, Config{})
	runFixture(t, bin, "0.5")
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Selection != (SelectionStats{}) || st.Samples == 0 {
		t.Fatalf("selection counted %+v over %d samples with no selection", st.Selection, st.Samples)
	}
	if err := s.SetCgroups(map[uint64]struct{}{1: {}}); err == nil {
		t.Fatal("SetCgroups without SelectCgroups did not fail")
	}
}
