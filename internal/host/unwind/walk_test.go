//go:build linux

package unwind_test

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// fixtureSeconds of CPU per fixture: ~300 samples at 99 Hz, so that one
// stack in a hundred is three samples.
const fixtureSeconds = "4"

// harness runs a sampler that walks with unwind tables and feeds it process
// snapshots the way profbuild does.
type harness struct {
	s    *sampler.Sampler
	norm *normalize.Normalizer
	done chan struct{}
	mu   sync.Mutex
	evs  map[sampler.EventKind]int
	exec map[uint32]int64 // pid -> time of its last exec event (Unix ns)
	// onExit, if set, sees each ProcessExit before the Manager forgets it.
	onExit func(pid int)
}

func newHarness(t testing.TB, cfg sampler.Config) *harness {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	if cfg.SampleRate == 0 {
		cfg.SampleRate = 99
	}
	s, err := sampler.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, norm: normalize.New(normalize.Options{}), done: make(chan struct{}), evs: map[sampler.EventKind]int{}, exec: map[uint32]int64{}}
	go func() {
		defer close(h.done)
		u := s.Unwinder()
		for ev := range s.Events() {
			h.mu.Lock()
			h.evs[ev.Kind]++
			if ev.Kind == sampler.ProcessExec {
				h.exec[ev.Pid] = ev.TimeNs
			}
			h.mu.Unlock()
			switch ev.Kind {
			case sampler.ProcessNew, sampler.ProcessExec, sampler.ProcessMapsChanged:
				p, err := h.norm.Refresh(int(ev.Pid))
				if err == nil && u != nil {
					if err := u.Track(p); err != nil {
						t.Errorf("track %d: %v", ev.Pid, err)
					}
				}
			case sampler.ProcessExit:
				h.mu.Lock()
				f := h.onExit
				h.mu.Unlock()
				if f != nil {
					f(int(ev.Pid))
				}
				if u != nil {
					u.Forget(int(ev.Pid))
				}
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		<-h.done
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) events(k sampler.EventKind) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.evs[k]
}

// run runs a fixture to completion and returns the samples of its process.
func (h *harness) run(t testing.TB, bin string, args ...string) (int, []sampler.Sample) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	time.Sleep(50 * time.Millisecond) // let the exit event through
	return pid, h.drain(t, pid)
}

// drain returns the samples of pids, after the stack copies of their
// first samples are walked (they wait for the tables; at most the
// Manager's copyWait, 10 s, after which they come marked not_ready).
func (h *harness) drain(t testing.TB, pids ...int) []sampler.Sample {
	t.Helper()
	want := map[int]bool{}
	for _, p := range pids {
		want[p] = true
	}
	var out []sampler.Sample
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := h.s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range b.Samples {
			if want[int(s.Pid)] {
				out = append(out, s)
			}
		}
		waiting := 0
		if u := h.s.Unwinder(); u != nil {
			for _, p := range pids {
				waiting += u.CopiesPending(p)
			}
		}
		if waiting == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Errorf("%d stack copies still waiting after 15 s", waiting)
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cSpec is a C fixture built -O2 without frame pointers.
func cSpec(name string, srcs []string, args ...string) testfixture.Spec {
	return testfixture.Spec{
		Name: name, Lang: "c", Sources: srcs,
		Args: append([]string{"-O2", "-fomit-frame-pointer", "-Wall"}, args...),
	}
}

// The fixtures of this package's tests, as values: TestFixturesBuild
// builds them all, which is how test/kernels prebuilds them for a VM.
var (
	chainPIE   = cSpec("unwind-chain-pie", []string{"unwind/chain.c"}, "-fPIE", "-pie")
	chainNoPIE = cSpec("unwind-chain-nopie", []string{"unwind/chain.c"}, "-fno-PIE", "-no-pie")
	chainCC    = testfixture.Spec{Name: "unwind-chain-cc", Lang: "c++", Sources: []string{"unwind/chain.cc"}, Args: []string{"-O2"}}
	chainRust  = testfixture.Spec{Name: "unwind-chain-rs", Lang: "rust", Sources: []string{"unwind/chain.rs"}, Args: []string{"-C", "opt-level=3"}}
	qsortSpec  = cSpec("unwind-qsort", []string{"unwind/qsort.c"})
	signalSpec = cSpec("unwind-signal", []string{"unwind/signal.c"})
	cfaReg     = cSpec("unwind-cfareg", []string{"unwind/cfareg.c"})
	cfaRegSys  = cSpec("unwind-cfareg-syscall", []string{"unwind/cfareg.c"}, "-DIN_SYSCALL")
	cfaDeref   = cSpec("unwind-cfaderef", []string{"unwind/cfaderef.c"})
	chainLib   = testfixture.Spec{
		Name: "libunwindchain.so", Lang: "c", Sources: []string{"unwind/libchain.c"},
		Args: []string{"-O2", "-fomit-frame-pointer", "-shared", "-fPIC"},
	}
	dlopenSpec = cSpec("unwind-dlopen", []string{"unwind/dlopen.c"}, "-ldl")
	chainFP    = cSpec("unwind-chain-fp", []string{"unwind/chain.c"}, "-fno-omit-frame-pointer")
	goHot      = testfixture.Spec{Name: "sampler-gohot", Lang: "go", Sources: []string{"sampler/gohot"}}
	recurse    = cSpec("unwind-recurse", []string{"unwind/recurse.c"})
)

// x86Only are the fixtures of x86-64 assembly (OpenSSL's CFA rules).
var x86Only = []testfixture.Spec{cfaReg, cfaRegSys, cfaDeref}

var allSpecs = []testfixture.Spec{
	chainPIE, chainNoPIE, chainCC, chainRust, qsortSpec, signalSpec,
	cfaReg, cfaRegSys, cfaDeref, chainLib, dlopenSpec, chainFP, goHot, recurse,
}

func TestFixturesBuild(t *testing.T) {
	for _, s := range allSpecs {
		if testfixture.TargetArch() != "amd64" && slices.ContainsFunc(x86Only, func(x testfixture.Spec) bool { return x.Name == s.Name }) {
			continue
		}
		t.Run(s.Name, func(t *testing.T) { testfixture.Build(t, s) })
	}
}

var cChain = newChain(-1, "leaf", "d", "c", "b", "a", "main")

// fixtureCase is one native fixture and the chain its samples must carry.
type fixtureCase struct {
	name  string
	spec  testfixture.Spec
	chain chain
	args  []string // after the CPU seconds
}

func (c fixtureCase) bin(t testing.TB) string { return testfixture.Build(t, c.spec) }

// nativeCases are the native fixtures of the 99% target (TestWholeChains)
// and of the comparison with perf (BenchmarkWholeChainVsPerf).
var nativeCases = []fixtureCase{
	{"c-pie", chainPIE, cChain, nil},
	{"c-nopie", chainNoPIE, cChain, nil},
	{"c-syscall", chainPIE, cChain, []string{"syscall"}},
	{"c++", chainCC, newChain(-1, "_ZN5chain4leafEm", `_ZN5chain4stepILi0EE3runEm`, `_ZN5chain4stepILi1EE3runEm`,
		`_ZN5chain4stepILi2EE3runEm`, "d", "c", "b", "a", "main"), nil},
	{"rust", chainRust, newChain(-1, "leaf", "d", "c", "b", "a", `_ZN5chain4main.*`), nil},
	{"qsort", qsortSpec, newChain(-1, "leaf", "cmp", "c", "b", "a", "main"), nil},
	{"signal", signalSpec, newChain(2, "leaf", "d", "handler", "c", "b", "a", "main"), nil},
	// The leaf's CFA is in %rax, as in OpenSSL's assembly (x86-64).
	{"cfa-register", cfaReg, cChain, nil},
	// The same in %rsi, making a system call each turn: the register comes
	// from what the kernel saved on entry.
	{"cfa-register-syscall", cfaRegSys, cChain, []string{"syscall"}},
	// The leaf's CFA is loaded from its realigned frame, as in OpenSSL.
	{"cfa-deref", cfaDeref, cChain, nil},
}

func TestWholeChains(t *testing.T) {
	// The BPF time per sample is logged, not asserted (test/kernels reports
	// it per kernel); kernel.bpf_stats_enabled may be on already.
	if stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer stats.Close()
	}
	h := newHarness(t, sampler.Config{KernelStacks: true})
	cases := nativeCases
	for _, tc := range cases {
		if runtime.GOARCH != "amd64" && slices.ContainsFunc(x86Only, func(x testfixture.Spec) bool { return x.Name == tc.spec.Name }) {
			t.Logf("%s: x86-64 assembly, not on %s", tc.name, runtime.GOARCH)
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			bin := tc.bin(t)
			pid, samples := h.run(t, bin, append([]string{fixtureSeconds}, tc.args...)...)
			p := h.norm.Cached(pid)
			if p == nil {
				t.Fatalf("no snapshot of pid %d", pid)
			}
			if len(tc.args) > 0 && tc.args[0] == "syscall" {
				// The point of this case: samples taken in kernel mode,
				// whose user registers come from bpf_task_pt_regs.
				var inKernel, all uint64
				for _, s := range samples {
					all += s.Count
					if len(s.KernelPCs) > 0 {
						inKernel += s.Count
					}
				}
				// The fixture's system call (getrandom, 4 KiB) spends its
				// time with interrupts on, so its kernel time is sampled
				// in kernel mode on any machine (cfareg.c says why a cheap
				// call was not: 42% once under qemu TCG).
				t.Logf("%d of %d samples in kernel mode", inKernel, all)
				if inKernel*2 < all {
					t.Errorf("only %d of %d samples hit in kernel mode", inKernel, all)
				}
			}
			syms := loadSymbols(t, bin)
			r := evaluate(p, syms, tc.chain, samples)
			if r.samples == 0 {
				for _, m := range p.Mappings {
					t.Logf("  snapshot of %d: %#x-%#x %s", pid, m.Start, m.End, m.Path)
				}
			}
			checkWhole(t, tc.name, r)
			if tc.name == "c-pie" || tc.name == "c-nopie" {
				checkNotReady(t, tc.name, samples)
			}
			if tc.name == "signal" {
				checkExactAfterSignal(t, p, syms, samples)
			}
		})
	}
	st, _ := h.s.Stats()
	t.Logf("sampler: %+v", st)
	if d, n, err := h.s.ProgramStats(); err == nil && n > 0 {
		t.Logf("bpf_ns_per_sample=%d over %d samples (kernel.bpf_stats)", d.Nanoseconds()/int64(n), n)
	}
	t.Logf("tables: %+v", h.s.Unwinder().Stats())
}

// TestDlopenAfterStart loads the library holding d and leaf after the
// sampler has seen the process: the BPF side reports PCs in no known
// mapping, the maps are reread and the library's table is loaded.
func TestDlopenAfterStart(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	lib := testfixture.Build(t, chainLib)
	bin := testfixture.Build(t, dlopenSpec)
	before := h.events(sampler.ProcessMapsChanged)
	pid, samples := h.run(t, bin, fixtureSeconds, lib, "0.3")
	p := h.norm.Cached(pid)
	if p == nil {
		t.Fatalf("no snapshot of pid %d", pid)
	}
	// The spin before the sleep is in main alone; judge the rest, and
	// every stack that did not end cleanly.
	var chainSamples []sampler.Sample
	syms := loadSymbols(t, bin, lib)
	for _, s := range samples {
		names := syms.names(p, s.UserPCs)
		if containsAny(names, "a", "b", "c", "d", "leaf") || !containsAny(names, "main") || s.Stop != sampler.StopOK {
			chainSamples = append(chainSamples, s)
		}
	}
	r := evaluate(p, syms, newChain(-1, "leaf", "d", "c", "b", "a", "main"), chainSamples)
	checkWhole(t, "dlopen", r)
	if n := h.events(sampler.ProcessMapsChanged) - before; n == 0 {
		t.Errorf("no maps-changed event after dlopen")
	}
}

func containsAny(names []string, want ...string) bool {
	for _, n := range names {
		for _, w := range want {
			if n == w {
				return true
			}
		}
	}
	return false
}

// TestFramePointersMode keeps the old path: bpf_get_stackid, no tables.
func TestFramePointersMode(t *testing.T) {
	h := newHarness(t, sampler.Config{Unwinding: unwind.Config{Mode: unwind.ModeFramePointers}})
	if h.s.Unwinder() != nil {
		t.Fatal("frame pointer mode has an unwinder")
	}
	bin := testfixture.Build(t, chainFP)
	_, samples := h.run(t, bin, "1")
	if len(samples) == 0 {
		t.Fatal("no samples")
	}
	for _, s := range samples {
		if s.Stop != sampler.StopFramePointers {
			t.Fatalf("stop reason %v in frame pointer mode", s.Stop)
		}
	}
}

// TestGoReachesMain walks a Go program (no .eh_frame: its table comes from
// the pcsp tables of .gopclntab) from main.hot to main.main.
func TestGoReachesMain(t *testing.T) {
	// The fixture runs without asynchronous preemption: sysmon signals a
	// goroutine that runs 10 ms, and a sample in that handler has
	// runtime.asyncPreempt (and sigreturn) above main.hot: 4 of 375
	// under TCG on 5.10 (2026-11-29), right stacks but not the chain
	// this test pins. GODEBUG reaches it through the environment.
	t.Setenv("GODEBUG", "asyncpreemptoff=1")
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, goHot)
	pid, samples := h.run(t, bin, fixtureSeconds)
	p := h.norm.Cached(pid)
	if p == nil {
		t.Fatalf("no snapshot of pid %d", pid)
	}
	syms := loadSymbols(t, bin)
	var hot []sampler.Sample
	for _, s := range samples {
		if containsAny(syms.names(p, s.UserPCs), "main.hot", "main.middle") {
			hot = append(hot, s)
		}
	}
	if len(hot) == 0 {
		for i, s := range samples {
			if i == 5 {
				break
			}
			t.Logf("sample %v: %v", s.Stop, syms.names(p, s.UserPCs))
		}
		t.Logf("%d samples of pid %d, mappings %+v", len(samples), pid, p.Mappings)
	}
	checkWhole(t, "go", evaluate(p, syms, newChain(-1, "main.hot", "main.middle", "main.main"), hot))
}

// TestExecReplacesTables samples a shell that then execs the chain in the
// same process: the kernel side drops the shell's mappings at exec and the
// chain's are loaded from the exec event.
func TestExecReplacesTables(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, chainPIE)
	sh := testfixture.NeedTool(t, "sh")
	script := `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec "$0" ` + fixtureSeconds
	pid, samples := h.run(t, sh, "-c", script, bin)
	p := h.norm.Cached(pid)
	if p == nil {
		t.Fatalf("no snapshot of pid %d", pid)
	}
	syms := loadSymbols(t, bin)
	h.mu.Lock()
	execAt := h.exec[uint32(pid)]
	h.mu.Unlock()
	// The shell's samples are those before the exec (a shell without
	// full unwind tables, such as busybox's, may not be walked whole).
	var chainSamples []sampler.Sample
	shell, copiesBefore := 0, 0
	for _, s := range samples {
		if s.Stop == sampler.StopExec {
			// A copy of the shell's stack taken before its tables were
			// loaded, taken by the drain after the exec: of a program
			// the process no longer runs, so no user frames.
			copiesBefore++
			if len(s.UserPCs) != 0 || execAt == 0 || s.LastNs >= execAt {
				t.Errorf("stop exec with %d user frames at %d, exec at %d", len(s.UserPCs), s.LastNs, execAt)
			}
			continue
		}
		if execAt == 0 || s.LastNs >= execAt {
			chainSamples = append(chainSamples, s)
		} else {
			shell += int(s.Count)
		}
	}
	t.Logf("%d samples of the shell before exec, %d copies of its stack given stop exec", shell, copiesBefore)
	if h.events(sampler.ProcessExec) == 0 {
		t.Error("no exec event")
	}
	// The shell's first sample is always copied (nothing of it is loaded
	// yet), and the drain comes after the exec.
	if copiesBefore == 0 && runtime.GOARCH == "amd64" {
		t.Error("no copy of the shell's stack came with stop exec")
	}
	checkWhole(t, "exec", evaluate(p, syms, cChain, chainSamples))
}

// TestExitForgetsProcess: after a process exits, its mappings are gone from
// the kernel and the Manager, so a reused pid never walks with them.
func TestExitForgetsProcess(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, chainPIE)
	pid, samples := h.run(t, bin, "0.5")
	if len(samples) == 0 {
		t.Fatal("no samples")
	}
	u := h.s.Unwinder()
	if !waitUntil(2*time.Second, func() bool { return !u.Tracked(pid) }) {
		t.Fatalf("pid %d still tracked after its exit", pid)
	}
}

func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// checkExactAfterSignal: in a stack through the signal handler, the frame
// after the kernel's signal frame is the interrupted PC, not a return
// address, and is marked so (Sample.UserExact), once and only there.
func checkExactAfterSignal(t *testing.T, p *normalize.Process, syms *symbols, samples []sampler.Sample) {
	t.Helper()
	var through, marked int
	for _, s := range samples {
		names := syms.names(p, s.UserPCs, s.UserExact...)
		h := slices.Index(names, "handler")
		if h < 0 && len(names) > 1 && names[0] == "?" && slices.Equal(s.UserExact, []uint8{1}) {
			// The sample hit the trampoline itself (libc's __restore_rt,
			// the handler done): the interrupted PC follows it.
			continue
		}
		if h >= 0 && s.Stop != sampler.StopOK {
			continue // through the handler but not whole: judged elsewhere
		}
		if h < 0 {
			if len(s.UserExact) > 0 {
				t.Errorf("a stack without a signal frame has exact PCs %v: %v", s.UserExact, names)
			}
			continue
		}
		through++
		// handler <- __restore_rt <- the interrupted PC.
		if len(s.UserExact) == 1 && int(s.UserExact[0]) == h+2 {
			marked++
		} else {
			t.Errorf("exact PCs %v, want [%d]: %v", s.UserExact, h+2, names)
		}
	}
	if through == 0 {
		t.Error("no whole stack through the signal handler")
	}
	t.Logf("%d of %d stacks through the handler mark the interrupted PC", marked, through)
}

// TestMaxStackWords runs a recursion 40 calls deep under a walk that keeps
// 16 words (unwinding.max_stack_words at its least) and under the default
// 128: there every sample in the recursion ends depth_limit with 16
// frames, the innermost, and is counted truncated; here each reaches main.
// The first samples, copied and walked on the host, keep to the same limit.
func TestMaxStackWords(t *testing.T) {
	bin := testfixture.Build(t, recurse)
	syms := loadSymbols(t, bin)
	for _, words := range []int{16, unwind.DefaultMaxStackWords} {
		t.Run(strconv.Itoa(words), func(t *testing.T) {
			h := newHarness(t, sampler.Config{Unwinding: unwind.Config{MaxStackWords: words}})
			pid, samples := h.run(t, bin, "40", "1")
			p := h.norm.Cached(pid)
			if p == nil {
				t.Fatalf("no snapshot of pid %d", pid)
			}
			var n, cut, whole uint64
			for _, s := range samples {
				names := syms.names(p, s.UserPCs)
				if len(names) == 0 || names[0] != "down" && names[0] != "cpu" {
					continue // not yet in the recursion, or in clock_gettime
				}
				n += s.Count
				switch {
				case words < 40 && s.Stop == sampler.StopDepth && s.Truncated && len(s.UserPCs) == words && names[words-1] == "down":
					cut += s.Count
				case words > 40 && s.Stop == sampler.StopOK && slices.Contains(names, "main"):
					whole += s.Count
				default:
					t.Errorf("%d words: stop %v, truncated %v, %d frames: %v", words, s.Stop, s.Truncated, len(names), names)
				}
			}
			t.Logf("%d words: %d samples in the recursion, %d cut at the limit, %d whole", words, n, cut, whole)
			if n < 50 {
				t.Fatalf("%d samples in the recursion", n)
			}
		})
	}
}
