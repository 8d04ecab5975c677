package sampler

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/offcpu"
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
	s := selectingSampler(t, Config{}, sel)
	before, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	a, b := startIn(t, sel, bin, "2"), startIn(t, other, bin, "2")
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

// selectingSampler starts a sampler that selects cgroup sel only.
func selectingSampler(t *testing.T, cfg Config, sel *testfixture.Cgroup) *Sampler {
	t.Helper()
	if cfg.SelectCgroups == 0 {
		cfg.SelectCgroups = 4
	}
	s, err := New(withoutCopies(cfg))
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
	return s
}

// startIn starts argv in cgroup cg.
func startIn(t *testing.T, cg *testfixture.Cgroup, argv ...string) *exec.Cmd {
	t.Helper()
	argv = cg.Wrap(argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// Off CPU, the same set decides at sched_switch: the waits of the
// selected cgroup's threads are recorded, none of the other's, whose
// switches are counted not_selected.
func TestCgroupSelectionOffCPU(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	bin, _ := waitFixture(t)
	sel, other := testfixture.NewCgroup(t), testfixture.NewCgroup(t)
	s := selectingSampler(t, Config{KernelStacks: true, OffCPU: offcpu.Config{Enabled: true}}, sel)
	before, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	a, b := startIn(t, sel, bin, "threads", "1", "8"), startIn(t, other, bin, "threads", "1", "8")
	for _, c := range []*exec.Cmd{a, b} {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	selected := st.OffCPU.Selection.Selected - before.OffCPU.Selection.Selected
	notSelected := st.OffCPU.Selection.NotSelected - before.OffCPU.Selection.NotSelected
	got, gotOther := offCPUOf(batch, uint32(a.Process.Pid)), offCPUOf(batch, uint32(b.Process.Pid))
	t.Logf("switches: %d selected, %d not selected; threads with waits: %d selected, %d other; %+v",
		selected, notSelected, len(got), len(gotOther), st.OffCPU)
	if len(got) == 0 {
		t.Error("no wait of the selected cgroup's process")
	}
	if len(gotOther) != 0 || len(samplesOf(batch, uint32(b.Process.Pid))) != 0 {
		t.Errorf("the other cgroup's process has waits of %d threads, %d rows", len(gotOther), len(samplesOf(batch, uint32(b.Process.Pid))))
	}
	// Its 9 threads switch out at least once each.
	if notSelected < 9 {
		t.Errorf("%d switches not selected", notSelected)
	}
	if seen := st.OffCPU.Seen - before.OffCPU.Seen; seen > selected {
		t.Errorf("%d waits seen, %d switches selected: a wait not selected was looked at", seen, selected)
	}
}

// More cgroups selected than the map holds: every cgroup passes (the
// filter after sampling decides) until they fit again.
func TestCgroupSelectionOverflow(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	bin := buildC(t)
	sel, other := testfixture.NewCgroup(t), testfixture.NewCgroup(t)
	s := selectingSampler(t, Config{SelectCgroups: 1}, sel)
	samplesOfOther := func() (rows int, st SelectionStats) {
		before, _ := s.Stats()
		c := startIn(t, other, bin, "0.5")
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		b, err := s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		after, _ := s.Stats()
		return len(samplesOf(b, uint32(c.Process.Pid))), SelectionStats{
			Selected:    after.Selection.Selected - before.Selection.Selected,
			NotSelected: after.Selection.NotSelected - before.Selection.NotSelected,
		}
	}
	if err := s.SetCgroups(map[uint64]struct{}{sel.ID(t): {}, other.ID(t): {}}); err != nil {
		t.Fatal(err)
	}
	rows, st := samplesOfOther()
	if rows == 0 || st.NotSelected != 0 {
		t.Errorf("overflowing: %d rows of the other cgroup's process, verdicts %+v; want rows and none not selected", rows, st)
	}
	if err := s.SetCgroups(map[uint64]struct{}{sel.ID(t): {}}); err != nil {
		t.Fatal(err)
	}
	rows, st = samplesOfOther()
	if rows != 0 || st.NotSelected == 0 {
		t.Errorf("fitting again: %d rows of the other cgroup's process, verdicts %+v; want none", rows, st)
	}
}
