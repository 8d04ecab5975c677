//go:build linux

package unwind_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// checkNotReady requires at most 0.1% of a fixture's samples, its first
// ones included, to end not_ready: the first samples of a process are
// walked from a copy of their stack once its tables are loaded (issue 31;
// before, 1-3 per process, 8 of 496 on Debian's 6.1 in qemu). The host
// walk of copies follows x86-64's rules only; elsewhere they are off.
func checkNotReady(t *testing.T, name string, samples []sampler.Sample) {
	t.Helper()
	var all, notReady uint64
	for _, s := range samples {
		all += s.Count
		if s.Stop == sampler.StopNotReady {
			notReady += s.Count
		}
	}
	t.Logf("%s: %d of %d samples not_ready", name, notReady, all)
	if runtime.GOARCH != "amd64" {
		return
	}
	if notReady*1000 > all {
		t.Errorf("%s: %d of %d samples not_ready, want at most 0.1%%", name, notReady, all)
	}
}

// TestShortLivedWhole runs the C chain in processes that live 0.3 s, two at
// a time: each is sampled from its first instructions, before the agent has
// read its mappings or built its binary's table, so about one of its ~30
// samples used to end at the leaf (not_ready). Issue 31's target: at most
// 0.1% of the samples in the chain end not_ready or stack_copy_truncated,
// counting every stack copy dropped as one more such sample. The other
// incomplete stacks are logged: a snapshot read while the loader was still
// mapping libraries leaves 0-2 in 1,450 unknown_mapping at main's caller
// (the process exits before its one reread a second), which is not
// readiness and is left to its own fix.
func TestShortLivedWhole(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("stack copies are walked on x86-64 only, not %s", runtime.GOARCH)
	}
	// BPF time per sample, copies included (their tail call is part of
	// the sampling program's run): logged for docs/unwinding.md.
	if stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer stats.Close()
	}
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, chainPIE)
	syms := loadSymbols(t, bin)
	st0, _ := h.s.Stats()
	u0 := h.s.Unwinder().Stats()

	const procs, parallel = 48, 2
	pids := make([]int, procs)
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range procs {
		sem <- struct{}{}
		cmd := exec.Command(bin, "0.3")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pids[i] = cmd.Process.Pid
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := cmd.Wait(); err != nil {
				t.Errorf("chain: %v", err)
			}
		}()
	}
	wg.Wait()
	samples := h.drain(t, pids...)

	var total, whole, outside, notReady uint64
	bad := map[string]uint64{}
	example := map[string]string{}
	byPid := map[uint32][]sampler.Sample{}
	for _, s := range samples {
		byPid[s.Pid] = append(byPid[s.Pid], s)
	}
	for _, pid := range pids {
		p := h.norm.Cached(pid)
		if p == nil {
			t.Errorf("no snapshot of pid %d", pid)
			continue
		}
		for _, s := range byPid[uint32(pid)] {
			if len(s.UserPCs) > 0 && !inMapping(p, s.UserPCs[0]) {
				continue // the test's vfork child before exec: another image
			}
			names := syms.names(p, s.UserPCs, s.UserExact...)
			if s.Stop == sampler.StopOK && !cChain.any(names) {
				outside += s.Count // the loader before main, the exit path after it
				continue
			}
			total += s.Count
			if s.Stop == sampler.StopOK && cChain.whole(names) {
				whole += s.Count
				continue
			}
			if s.Stop == sampler.StopNotReady || s.Stop == sampler.StopStackCopyTruncated {
				notReady += s.Count
			}
			k := s.Stop.String() + " " + strings.Join(names, " <- ")
			bad[k] += s.Count
			var where []string
			for _, pc := range s.UserPCs {
				m, _, ok := p.Normalize(pc)
				if !ok {
					where = append(where, fmt.Sprintf("%#x(none)", pc))
					continue
				}
				where = append(where, fmt.Sprintf("%#x(%s)", pc, filepath.Base(m.Path)))
			}
			example[k] = strings.Join(where, " ")
		}
	}
	st1, _ := h.s.Stats()
	u1 := h.s.Unwinder().Stats()
	// A copy that could not be sent, or waited too long, is a sample
	// marked not_ready (counted above); one dropped is no sample at all.
	// Dropped ones are counted for every process of the host: a failure
	// here either way.
	dropped := u1.CopiesDropped - u0.CopiesDropped
	t.Logf("%d processes: %d/%d samples whole, %d dropped copies, %d outside main; copies %d sent, %d not sent, %d walked on the host, %d given up on",
		procs, whole, total, dropped, outside, st1.StackCopies-st0.StackCopies, st1.StackCopyLost-st0.StackCopyLost,
		u1.CopiesWalked-u0.CopiesWalked, u1.CopiesExpired-u0.CopiesExpired)
	for k, n := range bad {
		t.Logf("  %4d × %s  %s", n, k, example[k])
	}
	if d, n, err := h.s.ProgramStats(); err == nil && n > 0 {
		t.Logf("bpf_ns_per_sample=%d over %d samples of the host (kernel.bpf_stats)", d.Nanoseconds()/int64(n), n)
	}
	total += dropped
	notReady += dropped
	t.Logf("%d of %d samples not ready (not_ready, stack_copy_truncated, dropped copies)", notReady, total)
	if total < 500 {
		t.Fatalf("only %d samples in the chain", total)
	}
	if notReady*1000 > total {
		t.Errorf("%d of %d samples not ready (dropped copies counted), want at most 0.1%%", notReady, total)
	}
}

// TestStackCopyTruncated copies the least the config allows (64 bytes)
// of the C chain's first samples: the walks that run past it end with
// stack_copy_truncated, and every frame before that is the chain's, in
// order from the leaf, or at least in a mapping of the process: a short
// copy may cut a stack, never make up a caller.
func TestStackCopyTruncated(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("stack copies are walked on x86-64 only, not %s", runtime.GOARCH)
	}
	h := newHarness(t, sampler.Config{Unwinding: unwind.Config{StackCopyBytes: 64}})
	bin := testfixture.Build(t, chainPIE)
	syms := loadSymbols(t, bin)
	var pids []int
	for range 16 {
		cmd := exec.Command(bin, "0.05")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	samples := h.drain(t, pids...)
	truncated := 0
	for _, s := range samples {
		if s.Stop != sampler.StopStackCopyTruncated {
			continue
		}
		truncated++
		p := h.norm.Cached(int(s.Pid))
		if p == nil {
			t.Fatalf("no snapshot of pid %d", s.Pid)
		}
		for _, pc := range s.UserPCs {
			if !inMapping(p, pc) {
				t.Errorf("truncated stack %#x: %#x in no mapping", s.UserPCs, pc)
			}
		}
		names := syms.names(p, s.UserPCs, s.UserExact...)
		if !syms.inFiles(p, s.UserPCs[:1]) {
			continue // the loader's or libc's code, before main
		}
		// The leaf is any function of the chain (main's own code too);
		// its callers must follow the chain from there up to main.
		k := slices.IndexFunc(cChain.want, func(w *regexp.Regexp) bool { return w.MatchString(names[0]) })
		if k < 0 {
			continue // the fixture's start-up code
		}
		for i, n := range names {
			if k+i >= len(cChain.want) {
				break // past main: libc's start code
			}
			if !cChain.want[k+i].MatchString(n) {
				t.Errorf("truncated stack %v (%#x): frame %d is not the chain's", names, s.UserPCs, i)
				break
			}
		}
	}
	st, _ := h.s.Stats()
	t.Logf("%d stacks truncated at 64 bytes of %d samples; copies sent %d", truncated, len(samples), st.StackCopies)
	if truncated == 0 {
		t.Errorf("no copy of 64 bytes was truncated")
	}
}
