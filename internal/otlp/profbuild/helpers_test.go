package profbuild

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// harness runs a real sampler feeding a Builder, as the receiver does.
type harness struct {
	s     *sampler.Sampler
	b     *Builder
	start time.Time
}

func newHarness(t testing.TB, scfg sampler.Config, opt Options) *harness {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	s, err := sampler.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	if u := s.Unwinder(); u != nil && opt.Unwinder == nil {
		opt.Unwinder = u
	}
	if opt.ExecTimes == nil {
		opt.ExecTimes = s
	}
	h := &harness{s: s, b: New(opt), start: time.Now()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range s.Events() {
			h.b.HandleEvent(ev)
		}
	}()
	t.Cleanup(func() { s.Close(); <-done })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) collect(t testing.TB) Report {
	t.Helper()
	r, err := h.b.Collect(h.s, h.start)
	if err != nil {
		t.Fatal(err)
	}
	h.start = time.Now()
	return r
}

// exitSeen waits until the builder has been told that pid exited, at most d.
func (h *harness) exitSeen(pid int, d time.Duration) bool {
	return waitFor(d, func() bool {
		h.b.mu.Lock()
		defer h.b.mu.Unlock()
		_, ok := h.b.exited[pid]
		return ok
	})
}

// waitFor polls cond until it holds (true) or d has passed (false).
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// eventStats says whether process events were dropped, for failure messages.
func (h *harness) eventStats() string {
	st, err := h.s.Stats()
	if err != nil {
		return fmt.Sprintf("sampler stats: %v", err)
	}
	return fmt.Sprintf("%d process events lost, %d samples", st.LostEvents, st.Samples)
}

func buildC(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{
		Name: "sampler-hot", Lang: "c",
		Sources: []string{"sampler/hot.c"}, Args: []string{"-O1", "-g", "-fno-omit-frame-pointer"},
	})
}

func buildGo(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{Name: "sampler-gohot", Lang: "go", Sources: []string{"sampler/gohot"}})
}

// runFixture runs bin to completion; it returns the pid and CPU time used.
func runFixture(t testing.TB, bin string, args ...string) (int, time.Duration) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	return cmd.Process.Pid, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// symRange returns the ELF virtual address range of a function.
func symRange(t testing.TB, bin, name string) (lo, hi uint64) {
	start, size := testfixture.Func(t, bin, name)
	return start, start + size
}

func gnuBuildID(t testing.TB, bin string) string {
	t.Helper()
	out, err := exec.Command("readelf", "-n", bin).Output()
	if err != nil {
		testfixture.SkipOrFail(t, "readelf: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if _, id, ok := strings.Cut(sc.Text(), "Build ID: "); ok {
			return strings.TrimSpace(id)
		}
	}
	t.Fatalf("%s has no GNU build id", bin)
	return ""
}

// view reads a built profile back the way a consumer would.
type view struct {
	pd   pprofile.Profiles
	dict pprofile.ProfilesDictionary
}

type viewSample struct {
	count int64
	first uint64 // Unix ns of the first of these samples
	attrs map[string]any
	locs  []pprofile.Location
}

func (v view) str(i int32) string { return v.dict.StringTable().At(int(i)) }

// attrs decodes attribute indices.
func (v view) attrs(idx []int32) map[string]any {
	out := map[string]any{}
	for _, i := range idx {
		kv := v.dict.AttributeTable().At(int(i))
		out[v.str(kv.KeyStrindex())] = kv.Value().AsRaw()
	}
	return out
}

func (v view) mapping(l pprofile.Location) (file string, attrs map[string]any) {
	m := v.dict.MappingTable().At(int(l.MappingIndex()))
	return v.str(m.FilenameStrindex()), v.attrs(m.AttributeIndices().AsRaw())
}

func (v view) function(l pprofile.Location) string {
	if l.Lines().Len() == 0 {
		return ""
	}
	ln := l.Lines().At(l.Lines().Len() - 1)
	return v.str(v.dict.FunctionTable().At(int(ln.FunctionIndex())).NameStrindex())
}

// samples returns the samples of pid's resource.
func (v view) samples(t testing.TB, pid int) []viewSample {
	t.Helper()
	var out []viewSample
	found := false
	for _, rp := range v.pd.ResourceProfiles().All() {
		p, _ := rp.Resource().Attributes().Get(pframe.AttrPID)
		if p.Int() != int64(pid) {
			continue
		}
		found = true
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					vs := viewSample{count: s.Values().At(0), attrs: v.attrs(s.AttributeIndices().AsRaw())}
					if s.TimestampsUnixNano().Len() > 0 {
						vs.first = s.TimestampsUnixNano().At(0)
					}
					for _, li := range v.dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						vs.locs = append(vs.locs, v.dict.LocationTable().At(int(li)))
					}
					out = append(out, vs)
				}
			}
		}
	}
	if !found {
		t.Fatalf("no resource for pid %d", pid)
	}
	return out
}

func realPath(t testing.TB, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// findMapping gives the first mapping of pid's /proc/PID/maps whose
// permissions and path match.
func findMapping(t testing.TB, pid int, match func(perms, path string) bool) (start, end uint64, ok bool) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 6 && match(fields[1], fields[5]) {
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("/proc/%d/maps: %q", pid, sc.Text())
			}
			return start, end, true
		}
	}
	return 0, 0, false
}
