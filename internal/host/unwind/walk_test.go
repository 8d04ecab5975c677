//go:build linux

package unwind_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
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
}

func newHarness(t testing.TB, cfg sampler.Config) *harness {
	t.Helper()
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
	h := &harness{s: s, norm: normalize.New(normalize.Options{}), done: make(chan struct{}), evs: map[sampler.EventKind]int{}}
	go func() {
		defer close(h.done)
		u := s.Unwinder()
		for ev := range s.Events() {
			h.mu.Lock()
			h.evs[ev.Kind]++
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
	b, err := h.s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	var out []sampler.Sample
	for _, s := range b.Samples {
		if int(s.Pid) == pid {
			out = append(out, s)
		}
	}
	return pid, out
}

// symbols names addresses of the fixture's own files (others are "?").
type symbols struct {
	files map[string][]sym // real path -> sorted symbols
}

type sym struct {
	start, end uint64
	name       string
}

func loadSymbols(t testing.TB, paths ...string) *symbols {
	t.Helper()
	s := &symbols{files: map[string][]sym{}}
	for _, p := range paths {
		rp, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.Open(rp)
		if err != nil {
			t.Fatal(err)
		}
		syms, _ := f.Symbols()
		f.Close()
		var list []sym
		for _, y := range syms {
			if elf.ST_TYPE(y.Info) == elf.STT_FUNC && y.Value != 0 {
				list = append(list, sym{y.Value, y.Value + max(y.Size, 1), y.Name})
			}
		}
		sort.Slice(list, func(i, j int) bool { return list[i].start < list[j].start })
		s.files[rp] = list
	}
	return s
}

// names symbolizes a stack of p, leaf first.
func (s *symbols) names(p *normalize.Process, pcs []uint64) []string {
	out := make([]string, len(pcs))
	for i, pc := range pcs {
		if i > 0 {
			pc = addrmap.ReturnAddressAdjust(pc)
		}
		out[i] = "?"
		m, v, ok := p.Normalize(pc)
		if !ok {
			continue
		}
		rp, err := filepath.EvalSymlinks(m.Path)
		if err != nil {
			rp = m.Path
		}
		list := s.files[rp]
		j := sort.Search(len(list), func(j int) bool { return list[j].end > v })
		if j < len(list) && list[j].start <= v {
			out[i] = list[j].name
		}
	}
	return out
}

// chain checks one symbolized stack. The frames named from the fixture's
// files, in order, must be a non-empty suffix of want (leaf first, ending
// at main); with a signal frame at sig (the handler), the part after it is
// checked as a suffix of its own, since the signal may land anywhere.
type chain struct {
	want []*regexp.Regexp
	sig  int // index of the signal handler in want, -1 without
}

func newChain(sig int, names ...string) chain {
	c := chain{sig: sig}
	for _, n := range names {
		c.want = append(c.want, regexp.MustCompile("^(?:"+n+")$"))
	}
	return c
}

func (c chain) whole(names []string) bool {
	// Named frames up to the outermost wanted one (main); what follows it
	// (_start, libc's start code) is not part of the chain.
	var got []string
	last := c.want[len(c.want)-1]
	for _, n := range names {
		if n != "?" {
			got = append(got, n)
		}
		if last.MatchString(n) {
			break
		}
	}
	if len(got) == 0 || !last.MatchString(got[len(got)-1]) {
		return false
	}
	if c.sig >= 0 {
		for i, n := range got {
			if c.want[c.sig].MatchString(n) {
				return suffix(got[:i+1], c.want[:c.sig+1]) && suffix(got[i+1:], c.want[c.sig+1:])
			}
		}
		return suffix(got, c.want[c.sig+1:])
	}
	return suffix(got, c.want)
}

// suffix reports whether got matches a non-empty suffix of want.
func suffix(got []string, want []*regexp.Regexp) bool {
	if len(got) == 0 || len(got) > len(want) {
		return false
	}
	off := len(want) - len(got)
	for i, n := range got {
		if !want[off+i].MatchString(n) {
			return false
		}
	}
	return true
}

// startupWindow: samples this soon after a process's first one that are
// marked not_ready or unknown_mapping were taken before its tables could be
// loaded (the exec event and the table build race the program's start).
// They are counted apart; the 99% target is about the process's life after.
const startupWindow = 250 * time.Millisecond

// result summarizes the stacks of one fixture run.
type result struct {
	samples, whole uint64
	startup        uint64 // marked samples of the startup window, not in samples
	stops          map[sampler.StopReason]uint64
	bad            map[string]uint64 // symbolized stacks that were not whole
}

func (r result) fraction() float64 {
	if r.samples == 0 {
		return 0
	}
	return float64(r.whole) / float64(r.samples)
}

func (r result) String() string {
	return fmt.Sprintf("%d/%d samples whole (%.2f%%), stops %v, %d marked startup samples apart",
		r.whole, r.samples, 100*r.fraction(), r.stops, r.startup)
}

func evaluate(p *normalize.Process, syms *symbols, c chain, samples []sampler.Sample) result {
	r := result{stops: map[sampler.StopReason]uint64{}, bad: map[string]uint64{}}
	first := int64(0)
	for _, s := range samples {
		if first == 0 || s.FirstNs < first {
			first = s.FirstNs
		}
	}
	for _, s := range samples {
		if (s.Stop == sampler.StopNotReady || s.Stop == sampler.StopUnknownMapping) &&
			s.LastNs-first < int64(startupWindow) {
			r.startup += s.Count
			continue
		}
		r.samples += s.Count
		r.stops[s.Stop] += s.Count
		names := syms.names(p, s.UserPCs)
		if c.whole(names) {
			r.whole += s.Count
		} else {
			r.bad[fmt.Sprintf("%v %v", s.Stop, strings.Join(names, " <- "))] += s.Count
		}
	}
	return r
}

// checkWhole requires at least 99% whole stacks.
func checkWhole(t testing.TB, name string, r result) {
	t.Helper()
	t.Logf("%s: %v", name, r)
	if r.samples < 20 {
		t.Fatalf("%s: only %d samples", name, r.samples)
	}
	if r.fraction() < 0.99 {
		type kv struct {
			k string
			n uint64
		}
		var bad []kv
		for k, n := range r.bad {
			bad = append(bad, kv{k, n})
		}
		sort.Slice(bad, func(i, j int) bool { return bad[i].n > bad[j].n })
		for i, b := range bad {
			if i == 10 {
				break
			}
			t.Logf("  %4d × %s", b.n, b.k)
		}
		t.Errorf("%s: %.2f%% of samples carry the whole chain, want >= 99%%", name, 100*r.fraction())
	}
}

func buildC(t testing.TB, name string, srcs []string, args ...string) string {
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: srcs,
		Args: append([]string{"-O2", "-fomit-frame-pointer", "-Wall"}, args...)})
}

var cChain = newChain(-1, "leaf", "d", "c", "b", "a", "main")

// fixtureCase is one native fixture and the chain its samples must carry.
type fixtureCase struct {
	name  string
	bin   func(t testing.TB) string
	chain chain
	args  []string // after the CPU seconds
}

// nativeCases are the native fixtures of the 99% target (TestWholeChains)
// and of the comparison with perf (BenchmarkWholeChainVsPerf).
var nativeCases = []fixtureCase{
	{"c-pie", func(t testing.TB) string {
		return buildC(t, "unwind-chain-pie", []string{"unwind/chain.c"}, "-fPIE", "-pie")
	}, cChain, nil},
	{"c-nopie", func(t testing.TB) string {
		return buildC(t, "unwind-chain-nopie", []string{"unwind/chain.c"}, "-fno-PIE", "-no-pie")
	}, cChain, nil},
	{name: "c-syscall", bin: func(t testing.TB) string {
		return buildC(t, "unwind-chain-pie", []string{"unwind/chain.c"}, "-fPIE", "-pie")
	}, chain: cChain, args: []string{"syscall"}},
	{"c++", func(t testing.TB) string {
		return testfixture.Build(t, testfixture.Spec{Name: "unwind-chain-cc", Lang: "c++",
			Sources: []string{"unwind/chain.cc"}, Args: []string{"-O2"}})
	}, newChain(-1, "_ZN5chain4leafEm", `_ZN5chain4stepILi0EE3runEm`, `_ZN5chain4stepILi1EE3runEm`,
		`_ZN5chain4stepILi2EE3runEm`, "d", "c", "b", "a", "main"), nil},
	{"rust", func(t testing.TB) string {
		return testfixture.Build(t, testfixture.Spec{Name: "unwind-chain-rs", Lang: "rust",
			Sources: []string{"unwind/chain.rs"}, Args: []string{"-C", "opt-level=3"}})
	}, newChain(-1, "leaf", "d", "c", "b", "a", `_ZN5chain4main.*`), nil},
	{"qsort", func(t testing.TB) string {
		return buildC(t, "unwind-qsort", []string{"unwind/qsort.c"})
	}, newChain(-1, "leaf", "cmp", "c", "b", "a", "main"), nil},
	{"signal", func(t testing.TB) string {
		return buildC(t, "unwind-signal", []string{"unwind/signal.c"})
	}, newChain(2, "leaf", "d", "handler", "c", "b", "a", "main"), nil},
	// The leaf's CFA is in %rax, as in OpenSSL's assembly.
	{"cfa-register", func(t testing.TB) string {
		return buildC(t, "unwind-cfareg", []string{"unwind/cfareg.c"})
	}, cChain, nil},
	// The same in %rsi, making a system call each turn: the register comes
	// from what the kernel saved on entry.
	{name: "cfa-register-syscall", bin: func(t testing.TB) string {
		return buildC(t, "unwind-cfareg-syscall", []string{"unwind/cfareg.c"}, "-DIN_SYSCALL")
	}, chain: cChain, args: []string{"syscall"}},
	// The leaf's CFA is loaded from its realigned frame, as in OpenSSL.
	{"cfa-deref", func(t testing.TB) string {
		return buildC(t, "unwind-cfaderef", []string{"unwind/cfaderef.c"})
	}, cChain, nil},
}

func TestWholeChains(t *testing.T) {
	h := newHarness(t, sampler.Config{KernelStacks: true})
	cases := nativeCases
	for _, tc := range cases {
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
				t.Logf("%d of %d samples in kernel mode", inKernel, all)
				if inKernel*2 < all {
					t.Errorf("only %d of %d samples hit in kernel mode", inKernel, all)
				}
			}
			syms := loadSymbols(t, bin)
			checkWhole(t, tc.name, evaluate(p, syms, tc.chain, samples))
			if tc.name == "signal" {
				checkExactAfterSignal(t, p, syms, samples)
			}
		})
	}
	st, _ := h.s.Stats()
	t.Logf("sampler: %+v", st)
	t.Logf("tables: %+v", h.s.Unwinder().Stats())
}

// TestDlopenAfterStart loads the library holding d and leaf after the
// sampler has seen the process: the BPF side reports PCs in no known
// mapping, the maps are reread and the library's table is loaded.
func TestDlopenAfterStart(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	lib := testfixture.Build(t, testfixture.Spec{Name: "libunwindchain.so", Lang: "c",
		Sources: []string{"unwind/libchain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-shared", "-fPIC"}})
	bin := buildC(t, "unwind-dlopen", []string{"unwind/dlopen.c"}, "-ldl")
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
	bin := buildC(t, "unwind-chain-fp", []string{"unwind/chain.c"}, "-fno-omit-frame-pointer")
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
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, testfixture.Spec{Name: "sampler-gohot", Lang: "go", Sources: []string{"sampler/gohot"}})
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
	bin := buildC(t, "unwind-chain-pie", []string{"unwind/chain.c"}, "-fPIE", "-pie")
	sh := testfixture.NeedTool(t, "sh")
	script := `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec "$0" ` + fixtureSeconds
	pid, samples := h.run(t, sh, "-c", script, bin)
	p := h.norm.Cached(pid)
	if p == nil {
		t.Fatalf("no snapshot of pid %d", pid)
	}
	syms := loadSymbols(t, bin)
	var chainSamples []sampler.Sample
	shell := 0
	for _, s := range samples {
		if containsAny(syms.names(p, s.UserPCs), "leaf", "d", "c", "b", "a", "main") || s.Stop != sampler.StopOK {
			chainSamples = append(chainSamples, s)
		} else {
			shell += int(s.Count)
		}
	}
	t.Logf("%d samples of the shell before exec", shell)
	if h.events(sampler.ProcessExec) == 0 {
		t.Error("no exec event")
	}
	checkWhole(t, "exec", evaluate(p, syms, cChain, chainSamples))
}

// TestExitForgetsProcess: after a process exits, its mappings are gone from
// the kernel and the Manager, so a reused pid never walks with them.
func TestExitForgetsProcess(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	bin := buildC(t, "unwind-chain-pie", []string{"unwind/chain.c"}, "-fPIE", "-pie")
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
		names := syms.names(p, s.UserPCs)
		h := slices.Index(names, "handler")
		if h < 0 || s.Stop != sampler.StopOK {
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
