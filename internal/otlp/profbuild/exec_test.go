package profbuild

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// fakeExecs is Options.ExecTimes with the exec times a test sets.
type fakeExecs map[int]int64

func (f fakeExecs) ExecTime(pid int) (int64, bool) {
	at, ok := f[pid]
	return at, ok
}

// textPC is an address in pid's executable mapping of file.
func textPC(t *testing.T, pid int, file string) uint64 {
	t.Helper()
	start, _, ok := findMapping(t, pid, func(perms, path string) bool { return perms == "r-xp" && path == file })
	if !ok {
		t.Fatalf("pid %d maps no text of %s", pid, file)
	}
	return start + 16
}

// The samples a process took before an exec, drained after it, when the
// exec's event was lost (the events ring was full) or is handled after the
// drain: the sampler's record of the exec keeps them in the image they ran,
// although a sample of the new image in the same drain made the Builder
// read the process again. The event, when it comes, is the same exec.
// (CI: TestRecordExecKeepsImagesApart had the shell's 117 samples named in
// the program it exec'd, every user frame in no mapping.)
func TestExecWithoutEvent(t *testing.T) {
	shPath := realPath(t, testfixture.NeedTool(t, "sh"))
	sleepPath := realPath(t, testfixture.NeedTool(t, "sleep"))
	cmd := exec.Command(shPath, "-c", `read x; exec "$0" 30`, sleepPath)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	exe := func() string { p, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe")); return p }

	execs := fakeExecs{}
	b := New(Options{Kernel: fakeKernel{}, ExecTimes: execs})
	b.HandleEvent(sampler.Event{Pid: uint32(pid), Kind: sampler.ProcessNew})
	shPC := textPC(t, pid, shPath)
	before := time.Now().UnixNano()
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { return exe() == sleepPath }) {
		t.Fatalf("the shell did not exec %s: exe %s", sleepPath, exe())
	}
	execs[pid] = before + 1 // the BPF side's stamp: after the write, before the wait saw it
	sleepPC := textPC(t, pid, sleepPath)
	now := time.Now().UnixNano()
	batch := sampler.Batch{Samples: []sampler.Sample{
		// The new image's sample first: its address is in no mapping of
		// the shell's snapshot, so the Builder reads the process again.
		{Pid: uint32(pid), Tid: uint32(pid), Comm: "sleep", UserPCs: []uint64{sleepPC}, Count: 1, FirstNs: now, LastNs: now},
		{Pid: uint32(pid), Tid: uint32(pid), Comm: "sh", UserPCs: []uint64{shPC}, Count: 2, FirstNs: before - 2e6, LastNs: before - 1e6},
	}}
	r := b.Build(batch, time.Now().Add(-time.Second), time.Now())
	if n := r.Failures[ReasonNoMapping]; n != 0 {
		t.Errorf("%d frames in no mapping: the shell's samples named in %s", n, sleepPath)
	}
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	got := map[string]int64{}
	for _, s := range v.samples(t, pid) {
		file, _ := v.mapping(s.locs[0])
		got[file] += s.count
	}
	if got[shPath] != 2 || got[sleepPath] != 1 || len(got) != 2 {
		t.Errorf("samples by image %v, want 2 in %s and 1 in %s", got, shPath, sleepPath)
	}

	// The event comes late, stamped a little after the sampler's record:
	// the same exec, not a second one that would lose the shell's image.
	b.HandleEvent(sampler.Event{Pid: uint32(pid), Kind: sampler.ProcessExec, TimeNs: before + 300})
	b.mu.Lock()
	pre := b.execs[pid]
	b.mu.Unlock()
	if pre.p == nil || pre.p.ExePath != shPath {
		t.Errorf("after the late event the image before the exec is %+v, want the shell's snapshot", pre.p)
	}
}
