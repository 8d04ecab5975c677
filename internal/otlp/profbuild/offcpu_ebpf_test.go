package profbuild

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

const offCPUFixtureSeconds = 4

// minOwnTime is the least allowed for what one recorded wait spends in
// profsym's programs, part of which the fixtures' clocks count as
// waiting; TestOffCPUAccuracy measures it (bpf_stats), and on a loaded
// machine it is several times this.
const minOwnTime = 3 * time.Microsecond

func buildWait(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{
		Name: "offcpu-wait", Lang: "c", Sources: []string{"offcpu/wait.c"},
		Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-pthread"},
	})
}

// truthKey is a fixture thread's blocking call.
type truthKey struct {
	call string
	tid  int
}

// waitCase is one way the fixture blocks: in call, from fn (whose callers
// up to the thread's root are chain), for reason.
type waitCase struct {
	call, reason string
	chain        []string // leaf first: the fixture's own functions
	threadChain  []string // the same in the second thread (mutex)
}

var waitCases = map[string][]waitCase{
	"sleep": {{call: "nanosleep", reason: offcpu.ReasonSleep, chain: []string{"wait_sleep", "loop_sleep", "main"}}},
	"pipe":  {{call: "read", reason: offcpu.ReasonPipe, chain: []string{"wait_pipe", "loop_pipe", "main"}}},
	"mutex": {
		{
			call: "pthread_mutex_lock", reason: offcpu.ReasonFutex, chain: []string{"wait_mutex", "loop_mutex", "main"},
			threadChain: []string{"wait_mutex", "loop_mutex", "mutex_thread"},
		},
		{
			call: "nanosleep", reason: offcpu.ReasonSleep, chain: []string{"hold_mutex", "loop_mutex", "main"},
			threadChain: []string{"hold_mutex", "loop_mutex", "mutex_thread"},
		},
	},
	"fsync": {{call: "fsync", reason: offcpu.ReasonIO, chain: []string{"wait_fsync", "loop_fsync", "main"}}},
}

// TestOffCPUAccuracy: fixtures that block in known ways, through the
// receiver's path at the default probability: per thread and blocking call,
// the off-CPU time of the stacks through the fixture's function is within
// 5% of what the fixture measured itself, its reason is right, and >= 99%
// of those samples have the whole chain to the thread's root (the fixture
// is built without frame pointers). offcputime (libbpf-tools, or bcc's
// where the kernel has headers and kprobes) runs on the same fixture run,
// and its figures are logged beside.
func TestOffCPUAccuracy(t *testing.T) {
	built := buildWait(t)
	// A copy of its own, selected by name (off_cpu.targets): the limits of
	// a whole busy host's waits are TestOffCPULimits', not this test's.
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	comm := fmt.Sprintf("acc%08x", rand.Uint32())
	bin := filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	target, err := CompileTarget(nil, "^"+comm+"$", "")
	if err != nil {
		t.Fatal(err)
	}
	f := &Filter{Targets: []Target{target}}
	oc := offcpu.Config{Enabled: true, Select: func(pid int) bool { return f.MatchPID("", pid) }}
	h := newHarness(t, sampler.Config{SampleRate: 99, KernelStacks: true, OffCPU: oc},
		Options{SampleRate: 99, KernelSymbols: true})
	// The programs' own time, to allow for it (checkOffCPU): kernel
	// bpf_stats, which adds its clock reads to every run.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		testfixture.SkipOrFail(t, "kernel.bpf_stats: %v", err)
	}
	defer stats.Close()
	for _, mode := range []string{"sleep", "pipe", "mutex", "fsync"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{mode, strconv.Itoa(offCPUFixtureSeconds)}
			if mode == "fsync" {
				args = append(args, filepath.Join(t.TempDir(), "fsync.dat"))
			}
			st0, _ := h.s.Stats()
			run0, _, _ := h.s.OffCPUProgramStats()
			truths, pid, peer := runStopped(t, bin, args)
			h.exitSeen(pid, 5*time.Second)
			r := h.collect(t)
			st, _ := h.s.Stats()
			run1, _, _ := h.s.OffCPUProgramStats()
			// Every switch's program time over the waits recorded: the
			// walks of the recorded waits are nearly all of it (the
			// target's filter ends the others' runs after one lookup).
			own := minOwnTime
			if chosen := st.OffCPU.Chosen - st0.OffCPU.Chosen; chosen > 0 {
				own = max(own, (run1-run0)/time.Duration(chosen))
			}
			t.Logf("sampler off-CPU stats %+v; report: %d waits, %v; programs' time %v per recorded wait", st.OffCPU, r.OffCPUWaits, r.UnwindStops, own)
			checkOffCPU(t, r, pid, bin, truths, waitCases[mode], peer, own)
		})
	}
}

// runStopped starts the fixture stopped, attaches the peer to its pid,
// lets it run to the end and returns the truths it printed, its pid and
// the peer's off-CPU time by thread and reason (nil without a peer).
func runStopped(t *testing.T, bin string, args []string) (map[truthKey]int64, int, map[truthKey]int64) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "WAIT_STOPPED=1")
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Process.Kill()
	if !waitFor(10*time.Second, func() bool { return procState(pid) == "T" }) {
		t.Fatalf("fixture %d did not stop itself", pid)
	}
	peer := startPeer(t, pid, offCPUFixtureSeconds+4)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	truths := map[truthKey]int64{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 5 && f[0] == "truth" {
			tid, _ := strconv.Atoi(f[2])
			ns, _ := strconv.ParseInt(f[3], 10, 64)
			truths[truthKey{f[1], tid}] = ns
		}
	}
	if len(truths) == 0 {
		t.Fatalf("fixture printed no truth: %q", out.String())
	}
	return truths, pid, peer()
}

func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+3 > len(b) {
		return ""
	}
	return string(b[i+2 : i+3])
}

// startPeer runs offcputime on pid for secs and returns a function that
// waits for its report: microseconds off CPU by thread and reason (the
// reason read from its kernel frames, as ours). bcc's offcputime-bpfcc
// needs kernel headers and kprobes, which not every kernel has; the
// libbpf-tools build of the same tool needs BTF only.
func startPeer(t *testing.T, pid, secs int) func() map[truthKey]int64 {
	t.Helper()
	var tools [][]string
	if p, err := exec.LookPath("offcputime-bpfcc"); err == nil {
		tools = append(tools, []string{p, "-p", strconv.Itoa(pid), strconv.Itoa(secs)})
	}
	for _, p := range []string{"/usr/sbin/offcputime", "offcputime"} {
		if p, err := exec.LookPath(p); err == nil {
			tools = append(tools, []string{p, "-p", strconv.Itoa(pid), "-u", strconv.Itoa(secs)})
			break
		}
	}
	for _, argv := range tools {
		var out, errb bytes.Buffer
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			continue
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		attached := waitFor(30*time.Second, func() bool {
			select {
			case err := <-exited:
				exited <- err
				return true
			default:
			}
			return hasBPFLink(cmd.Process.Pid)
		})
		select {
		case err := <-exited:
			t.Logf("peer %s failed (%v): %s", filepath.Base(argv[0]), err, lastLine(errb.String()))
			continue
		default:
		}
		if !attached {
			cmd.Process.Kill()
			<-exited
			continue
		}
		name := filepath.Base(argv[0])
		return func() map[truthKey]int64 {
			if err := <-exited; err != nil {
				t.Logf("peer %s: %v", name, err)
				return nil
			}
			t.Logf("peer: %s", name)
			return parsePeer(out.String())
		}
	}
	t.Logf("no offcputime peer could run here")
	return func() map[truthKey]int64 { return nil }
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// hasBPFLink reports whether process pid holds a BPF link: its programs
// are attached.
func hasBPFLink(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); strings.Contains(l, "bpf_link") || strings.Contains(l, "bpf-link") {
			return true
		}
	}
	return false
}

// parsePeer reads offcputime's stacks: frames one per line (kernel first),
// then "- COMM (TID)", then microseconds. Folded by thread and the reason
// of the kernel frames.
func parsePeer(out string) map[truthKey]int64 {
	got := map[truthKey]int64{}
	var frames []string
	tid := -1
	for _, line := range strings.Split(out, "\n") {
		f := strings.TrimSpace(line)
		switch {
		case f == "":
			frames, tid = nil, -1
		case strings.HasPrefix(f, "- ") && strings.HasSuffix(f, ")"):
			i := strings.LastIndexByte(f, '(')
			tid, _ = strconv.Atoi(f[i+1 : len(f)-1])
		case tid >= 0:
			if us, err := strconv.ParseInt(f, 10, 64); err == nil {
				got[truthKey{offcpu.Reason(frames, false), tid}] += us * 1000
			}
		default:
			frames = append(frames, f)
		}
	}
	return got
}

// checkOffCPU compares pid's off-CPU profile with the fixture's truths.
func checkOffCPU(t *testing.T, r Report, pid int, bin string, truths map[truthKey]int64, cases []waitCase, peer map[truthKey]int64, ownTime time.Duration) {
	t.Helper()
	real := realPath(t, bin)
	id := gnuBuildID(t, real)
	funcs := map[string][2]uint64{}
	for _, c := range cases {
		for _, n := range append(append([]string{}, c.chain...), c.threadChain...) {
			lo, hi := symRange(t, real, n)
			funcs[n] = [2]uint64{lo, hi}
		}
	}
	name := func(addr uint64) string {
		for n, rg := range funcs {
			if addr >= rg[0] && addr < rg[1] {
				return n
			}
		}
		return ""
	}
	v := view{pd: r.Profiles, dict: r.Profiles.Dictionary()}
	samples := v.typedSamples(t, pid, TypeOffCPU)
	var t0 uint64
	for _, s := range samples {
		if t0 == 0 || s.first < t0 {
			t0 = s.first
		}
	}
	for key, truth := range truths {
		var c *waitCase
		for i := range cases {
			if cases[i].call == key.call {
				c = &cases[i]
			}
		}
		if c == nil {
			t.Fatalf("no case for %v", key)
		}
		var got, waits, whole, startup int64
		var variance float64
		reasons := map[string]int64{}
		for _, s := range samples {
			if s.attrs[pframe.AttrThreadID] != int64(key.tid) {
				continue
			}
			var fns []string
			for _, l := range s.locs {
				if _, a := v.mapping(l); a[pframe.AttrBuildIDGNU] == id {
					if n := name(l.Address()); n != "" {
						fns = append(fns, n)
					}
				}
			}
			if os.Getenv("OFFCPU_DEBUG") != "" {
				var all []string
				for _, l := range s.locs {
					f, _ := v.mapping(l)
					all = append(all, fmt.Sprintf("%s:%s:%#x", filepath.Base(f), v.function(l), l.Address()))
				}
				t.Logf("tid %v %d ns: %v %v", s.attrs[pframe.AttrThreadID], s.value, s.attrs, all)
			}
			if len(fns) == 0 || fns[0] != c.chain[0] {
				continue // another call of the thread
			}
			stop, _ := s.attrs[pframe.AttrUnwindStop].(string)
			if (stop == "not_ready" || stop == "unknown_mapping") && s.first-t0 < uint64(250*time.Millisecond) {
				startup += s.waits
				continue
			}
			got += s.value
			waits += s.waits
			variance += s.variance
			reason, _ := s.attrs[pframe.AttrOffCPUReason].(string)
			reasons[reason] += s.value
			if stop == "" && (slicesEqual(fns, c.chain) || slicesEqual(fns, c.threadChain)) {
				whole += s.waits
			}
		}
		top, topNs := "", int64(0)
		for rs, ns := range reasons {
			if ns > topNs {
				top, topNs = rs, ns
			}
		}
		errPct := 100 * float64(got-truth) / float64(truth)
		peerNs, hasPeer := peer[truthKey{c.reason, key.tid}]
		peerTxt := "no peer"
		if hasPeer {
			peerTxt = fmt.Sprintf("offcputime %.3fs (%+.2f%%)", float64(peerNs)/1e9, 100*float64(peerNs-truth)/float64(truth))
		}
		t.Logf("%s tid %d: truth %.3fs, profsym %.3fs (%+.2f%%, sd %.2f%%) over %d waits, %d whole, %d start-up apart; reasons %v; %s",
			key.call, key.tid, float64(truth)/1e9, float64(got)/1e9, errPct, 100*math.Sqrt(variance)/float64(truth),
			waits, whole, startup, reasons, peerTxt)
		// The fixture's clock also counts, as waiting, part of the time each
		// recorded wait spends in profsym's own programs (taking its
		// stacks: a few microseconds, measured as ownTime), which no
		// switch-to-switch timer sees; that matters only for waits of tens
		// of microseconds (the disk's fast phases, where fsync waits page
		// by page).
		// The thread loses more than the programs' own run time (their
		// cache footprint, the switch path around them): 1.9 times it in
		// the fsync case, quiet, on a 2-core EPYC VM. Twice is allowed.
		allow := 5 + 100*float64(waits)*float64(2*ownTime)/float64(truth)
		if math.Abs(errPct) > allow {
			t.Errorf("%s tid %d: off-CPU time %.3fs is %+.2f%% off the fixture's %.3fs (allowed %.2f%%)", key.call, key.tid,
				float64(got)/1e9, errPct, float64(truth)/1e9, allow)
		}
		if top != c.reason {
			t.Errorf("%s tid %d: reason %q, want %q (%v)", key.call, key.tid, top, c.reason, reasons)
		}
		if waits == 0 || float64(whole) < 0.99*float64(waits) {
			t.Errorf("%s tid %d: %d/%d waits with the whole chain %v, want >= 99%%", key.call, key.tid, whole, waits, c.chain)
		}
	}
}

func slicesEqual(a, b []string) bool {
	return len(b) > 0 && strings.Join(a, " ") == strings.Join(b, " ")
}

// offSample is an off_cpu sample read back.
type offSample struct {
	viewSample
	value, waits int64
	variance     float64
}

// typedSamples returns pid's samples of the profiles of type typ.
func (v view) typedSamples(t testing.TB, pid int, typ string) []offSample {
	t.Helper()
	var out []offSample
	for _, rp := range v.pd.ResourceProfiles().All() {
		if p, _ := rp.Resource().Attributes().Get(pframe.AttrPID); p.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				if v.str(prof.SampleType().TypeStrindex()) != typ {
					continue
				}
				for _, s := range prof.Samples().All() {
					o := offSample{viewSample: viewSample{attrs: v.attrs(s.AttributeIndices().AsRaw())}, value: s.Values().At(0)}
					o.count = o.value
					if s.TimestampsUnixNano().Len() > 0 {
						o.first = s.TimestampsUnixNano().At(0)
					}
					for _, li := range v.dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						o.locs = append(o.locs, v.dict.LocationTable().At(int(li)))
					}
					o.waits, _ = o.attrs[pframe.AttrOffCPUWaits].(int64)
					if sd, ok := o.attrs[pframe.AttrOffCPUStderr].(int64); ok {
						o.variance = float64(sd) * float64(sd)
					}
					out = append(out, o)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s samples for pid %d", typ, pid)
	}
	return out
}
