package symbolizationprocessor

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// Fleet-sized input against the configured cache budgets, each workload in
// a fresh process (this test binary re-run) so that RSS is the workload's
// own: 100,000 distinct build ids, and 1,000,000 distinct addresses of libc
// (with libc6-dbg's DWARF). After the run, and a GC that returns freed
// pages to the OS, RSS must exceed the baseline by at most the budget the
// configuration allows (otlpsym.Options.MemoryBudget) plus 20%.
func TestMemoryBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet-sized workloads take a while")
	}
	for _, w := range []string{"buildids", "addresses"} {
		t.Run(w, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryWorkload$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "PROFSYM_MEMORY_WORKLOAD="+w)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("workload: %v\n%s", err, out)
			}
			vals := map[string]int64{}
			for _, line := range strings.Split(string(out), "\n") {
				if i := strings.Index(line, "MEMORY "); i >= 0 {
					for _, kv := range strings.Fields(line[i+7:]) {
						k, v, _ := strings.Cut(kv, "=")
						vals[k], _ = strconv.ParseInt(v, 10, 64)
					}
				}
			}
			if vals["budget"] == 0 {
				t.Fatalf("no figures from the workload:\n%s", out)
			}
			grew := vals["rss_end"] - vals["rss_base"]
			t.Logf("%s: budget %d MB, RSS %d -> %d MB (grew %d MB), peak %d MB, heap live %d MB, caches say %d MB, %d batches in %d ms",
				w, vals["budget"]>>20, vals["rss_base"]>>20, vals["rss_end"]>>20, grew>>20, vals["rss_peak"]>>20,
				vals["heap_live"]>>20, vals["caches"]>>20, vals["batches"], vals["ms"])
			if limit := vals["budget"] * 12 / 10; grew > limit {
				t.Errorf("RSS grew %d MB, over the %d MB budget + 20%%", grew>>20, vals["budget"]>>20)
			}
			if vals["caches"] > vals["budget"] {
				t.Errorf("caches account %d MB, over the %d MB budget", vals["caches"]>>20, vals["budget"]>>20)
			}
		})
	}
}

func rss() (cur, peak int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			cur = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return cur, peak
}

func settle() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	cur, _ := rss()
	return cur
}

// TestMemoryWorkload is the child of TestMemoryBudget.
func TestMemoryWorkload(t *testing.T) {
	w := os.Getenv("PROFSYM_MEMORY_WORKLOAD")
	if w == "" {
		t.Skip("run by TestMemoryBudget")
	}
	var cfg *Config
	var batches []func() pprofile.Profiles
	switch w {
	case "buildids":
		// A gateway fed 100,000 build ids it has never seen, 1,000 per
		// batch, from a debug directory with none of them.
		dir := t.TempDir()
		edit := func(c *Config) {
			c.Sources = []string{locate.SourceDebugDirs}
			c.DebugDirectories = []string{dir}
			c.Cache = CacheConfig{MaxBytes: 1 << 20, MaxEntries: 1 << 20, MaxResultBytes: 8 << 20, MaxObjects: 20000,
				MaxDemangled: 1000, MaxDemangledBytes: 1 << 20}
		}
		cfg = createDefaultConfig()
		edit(cfg)
		for b := 0; b < 100; b++ {
			batches = append(batches, func() pprofile.Profiles {
				var ids []string
				for i := 0; i < 1000; i++ {
					ids = append(ids, fmt.Sprintf("%08x%032x", b, i))
				}
				return idsProfile(ids, 0x1234)
			})
		}
	case "addresses":
		libc := "/lib/x86_64-linux-gnu/libc.so.6"
		id := testfixture.BuildID(t, libc)
		if _, err := os.Stat(filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")); err != nil {
			testfixture.SkipOrFail(t, "libc6-dbg is not installed: %v", err)
		}
		f, err := elf.Open(libc)
		if err != nil {
			t.Fatal(err)
		}
		text := f.Section(".text")
		f.Close()
		cfg = createDefaultConfig()
		cfg.Sources = []string{locate.SourceDebugDirs}
		cfg.Cache = CacheConfig{MaxBytes: 32 << 20, MaxEntries: 1 << 20, MaxResultBytes: 48 << 20, MaxObjects: 1000,
			MaxDemangled: 10000, MaxDemangledBytes: 1 << 20}
		const total, per = 1_000_000, 10_000
		stride := max(text.Size/total, 1)
		for b := 0; b < total/per; b++ {
			batches = append(batches, func() pprofile.Profiles {
				addrs := make([]uint64, per)
				for i := range addrs {
					n := uint64(b*per + i)
					addrs[i] = text.Addr + (n*stride+n/(text.Size/stride+1))%text.Size
				}
				return addrProfile(id, addrs)
			})
		}
	default:
		t.Fatalf("unknown workload %q", w)
	}
	h := newHarness(t, func(c *Config) { *c = *cfg })
	// Warm up with one batch so the baseline holds the process's own code
	// and structures, not the caches.
	if err := h.p.ConsumeProfiles(context.Background(), batches[0]()); err != nil {
		t.Fatal(err)
	}
	h.sink.Reset()
	base := settle()
	start := time.Now()
	for _, mk := range batches[1:] {
		pd := mk()
		if err := h.p.ConsumeProfiles(context.Background(), pd); err != nil {
			t.Fatal(err)
		}
		h.sink.Reset()
	}
	ms := time.Since(start).Milliseconds()
	end := settle()
	_, peak := rss()
	var live runtime.MemStats
	runtime.ReadMemStats(&live)
	var caches int64
	for _, c := range sharedOf(h).sym.Caches() {
		caches += c.Bytes
		t.Logf("cache %s: %d entries, %d bytes, %d evictions", c.Name, c.Entries, c.Bytes, c.Evictions)
	}
	budget := cfg.Options(nil).MemoryBudget()
	fmt.Printf("MEMORY budget=%d rss_base=%d rss_end=%d rss_peak=%d heap_live=%d caches=%d batches=%d ms=%d\n",
		budget, base, end, peak, live.HeapAlloc, caches, len(batches), ms)
}

func sharedOf(h *harness) *sharedSym {
	e, _, _ := symbolizers.Get(h.cfg)
	return e
}

// idsProfile is one sample per build id, one raw frame each.
func idsProfile(ids []string, addr uint64) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	prof := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	native := d.AttrStr(pframe.AttrFrameType, "native")
	for _, id := range ids {
		mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x2000, File: "/opt/app", Attrs: []int32{d.AttrStr(pframe.AttrBuildIDGNU, id)}})
		loc := d.Location(pdict.Location{Mapping: mi, Address: addr, Attrs: []int32{native}})
		s := prof.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack([]int32{loc}))
		s.Values().Append(1)
	}
	return pd
}

// addrProfile is samples of 10 raw frames each over addrs of one build id.
func addrProfile(id string, addrs []uint64) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	prof := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	native := d.AttrStr(pframe.AttrFrameType, "native")
	mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x2000, File: "/lib/x86_64-linux-gnu/libc.so.6",
		Attrs: []int32{d.AttrStr(pframe.AttrBuildIDGNU, id)}})
	var locs []int32
	for _, a := range addrs {
		locs = append(locs, d.Location(pdict.Location{Mapping: mi, Address: a, Attrs: []int32{native}}))
		if len(locs) == 10 {
			s := prof.Samples().AppendEmpty()
			s.SetStackIndex(d.Stack(locs))
			s.Values().Append(1)
			locs = locs[:0]
		}
	}
	return pd
}
