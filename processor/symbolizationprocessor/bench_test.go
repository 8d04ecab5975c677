package symbolizationprocessor

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/testfixture"
)

// benchSet is 50 binaries (copies of the C++ fixture, each with its own
// build id, in a symbol directory) and addresses spread over their text.
type benchSet struct {
	dir   string
	ids   []string
	paths []string
	addrs []uint64
}

const (
	benchBinaries  = 50
	benchSamples   = 10_000
	benchStack     = 20
	benchLocations = benchSamples * benchStack // 200,000
)

func makeBenchSet(b *testing.B) benchSet {
	bin := testfixture.Build(b, testfixture.Spec{Name: "bench-cpp", Lang: "c++", Sources: []string{"engine/cpp/main.cc"},
		Args: []string{"-O2", "-g", "-std=c++17", "-Wl,--build-id"}})
	orig, err := os.ReadFile(bin)
	if err != nil {
		b.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		b.Fatal(err)
	}
	note, _ := f.Section(".note.gnu.build-id").Data()
	text := f.Section(".text")
	f.Close()
	id := note[16:]
	at := bytes.Index(orig, id)
	set := benchSet{dir: b.TempDir()}
	for i := 0; i < benchBinaries; i++ {
		data := bytes.Clone(orig)
		copy(data[at:], fmt.Sprintf("bench%015d", i))
		p := filepath.Join(set.dir, fmt.Sprintf("bin%02d", i))
		os.WriteFile(p, data, 0o755)
		set.ids = append(set.ids, hex.EncodeToString(data[at:at+len(id)]))
		set.paths = append(set.paths, p)
	}
	// Distinct addresses per binary: 200,000 locations over 50 binaries.
	per := benchLocations / benchBinaries
	step := text.Size / uint64(per)
	for i := 0; i < per; i++ {
		set.addrs = append(set.addrs, text.Addr+uint64(i)*step+uint64(i%7))
	}
	return set
}

// batch builds 10,000 samples of 20 raw frames each, every (binary, address)
// pair used once: 200,000 distinct locations.
func (s benchSet) batch() pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	native := d.AttrStr(pframe.AttrFrameType, "native")
	maps := make([]int32, benchBinaries)
	for i := range maps {
		maps[i] = d.Mapping(pdict.Mapping{Start: 0x400000, Limit: 0x800000, File: "/remote/bin",
			Attrs: []int32{d.AttrStr(pframe.AttrBuildIDGNU, s.ids[i])}})
	}
	locs := make([]int32, 0, benchLocations)
	for bi := range maps {
		for _, a := range s.addrs {
			locs = append(locs, d.Location(pdict.Location{Mapping: maps[bi], Address: a, Attrs: []int32{native}}))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(locs), func(i, j int) { locs[i], locs[j] = locs[j], locs[i] })
	prof := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	for i := 0; i < benchSamples; i++ {
		s := prof.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack(locs[i*benchStack : (i+1)*benchStack]))
		s.Values().Append(1)
	}
	return pd
}

func benchHarness(b *testing.B, set benchSet) *harness {
	return newHarness(b, func(cfg *Config) {
		cfg.Sources = []string{locate.SourceSymbolDirs}
		cfg.SymbolDirectories = []string{set.dir}
		// The cold batch measures opening all 50 binaries: it waits for
		// them rather than leaving the slower ones pending.
		cfg.FetchWait = cfg.Timeout
	})
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkProcessor measures the processor on a batch of 10,000 samples /
// 200,000 locations over 50 binaries: the first batch (cold: every object
// opened and parsed) against the engine's own cold cost on the same
// addresses (target: cold-vs-engine <= 1.1), then warm batches
// (ns/location, target <= 150), and the heap; next to them, pdata's own
// cost of writing the same lines, which every processor pays.
func BenchmarkProcessor(b *testing.B) {
	set := makeBenchSet(b)
	template := set.batch()
	// The floor's own copy: template is dead once the warm batches are
	// done, and so out of the heap figure, as it should be.
	floorSrc := pprofile.NewProfiles()
	template.CopyTo(floorSrc)

	// The engine alone, cold: the floor the processor's cold cost is
	// compared with; then the processor's first batch. Both three times,
	// alternating, each from scratch, keeping the least of each figure (a
	// shared machine only ever adds time).
	const coldRuns = 3
	var engineCold, engineColdCPU, cold, coldCPU time.Duration
	var h *harness
	var base uint64
	for k := 0; k < coldRuns; k++ {
		runtime.GC()
		eng := symbolize.New(symbolize.DefaultOptions())
		start, startCPU := time.Now(), cpuTime()
		for _, p := range set.paths {
			eng.Symbolize(context.Background(), p, "", set.addrs)
		}
		w, c := time.Since(start), cpuTime()-startCPU
		eng.Close()
		if k == 0 || w < engineCold {
			engineCold = w
		}
		if k == 0 || c < engineColdCPU {
			engineColdCPU = c
		}

		h = benchHarness(b, set)
		base = heapInUse()
		pd := pprofile.NewProfiles()
		template.CopyTo(pd)
		runtime.GC() // the engine's garbage is not the processor's
		start, startCPU = time.Now(), cpuTime()
		h.p.ConsumeProfiles(context.Background(), pd)
		w, c = time.Since(start), cpuTime()-startCPU
		if k == 0 || w < cold {
			cold = w
		}
		if k == 0 || c < coldCPU {
			coldCPU = c
		}
		if k < coldRuns-1 {
			h.p.Shutdown(context.Background()) // its caches go before the next run
		}
	}
	out := h.sink.AllProfiles()[0]
	resolved := 0
	for _, l := range out.Dictionary().LocationTable().All() {
		if l.Lines().Len() > 0 {
			resolved++
		}
	}
	if resolved < benchLocations*9/10 {
		b.Fatalf("only %d of %d locations resolved", resolved, benchLocations)
	}
	h.sink.Reset()
	peak := heapInUse()

	b.ResetTimer()
	var warm, warmCPU, warmMin time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		pd := pprofile.NewProfiles()
		template.CopyTo(pd)
		h.sink.Reset()
		runtime.GC() // the copy's garbage is not the processor's
		b.StartTimer()
		t0, c0 := time.Now(), cpuTime()
		h.p.ConsumeProfiles(context.Background(), pd)
		w := time.Since(t0)
		warm += w
		warmCPU += cpuTime() - c0
		if i == 0 || w < warmMin {
			warmMin = w
		}
	}
	peak = max(peak, heapInUse())
	counts := lineCounts(h.sink.AllProfiles()[0]) // the last warm batch's output
	floor := linesFloor(floorSrc, counts, 1)
	floorAll := linesFloor(floorSrc, counts, runtime.GOMAXPROCS(0))
	if sh := sharedOf(h); sh != nil {
		for _, c := range sh.sym.Caches() {
			b.Logf("cache %s: %d entries, %d bytes, %d hits, %d misses, %d evictions", c.Name, c.Entries, c.Bytes, c.Hits, c.Misses, c.Evictions)
		}
	}
	b.ReportMetric(float64(warm.Nanoseconds())/float64(b.N)/benchLocations, "warm-ns/location")
	// The fastest warm batch: on a shared machine the mean carries the
	// other jobs' share of the cores.
	b.ReportMetric(float64(warmMin.Nanoseconds())/benchLocations, "warm-min-ns/location")
	// CPU time, GC included, is steadier than wall time on a shared machine.
	b.ReportMetric(float64(warmCPU.Nanoseconds())/float64(b.N)/benchLocations, "warm-cpu-ns/location")
	// What pdata alone takes to give every location the lines the
	// processor gave it (one core): a floor no processor goes below, to
	// read the warm CPU figure against.
	b.ReportMetric(float64(floor.Nanoseconds())/benchLocations, "pdata-lines-cpu-ns/location")
	// The same on every core, as the processor writes lines: the floor of
	// the warm wall figure on this machine.
	b.ReportMetric(float64(floorAll.Nanoseconds())/benchLocations, "pdata-lines-wall-ns/location")
	b.ReportMetric(float64(cold.Nanoseconds())/benchLocations, "cold-ns/location")
	b.ReportMetric(float64(cold.Milliseconds()), "cold-ms")
	b.ReportMetric(float64(engineCold.Milliseconds()), "engine-cold-ms")
	// CPU time of the cold batch (GC included): steadier than wall time on
	// a shared machine, and what opening files twice would show in.
	b.ReportMetric(float64(coldCPU.Milliseconds()), "cold-cpu-ms")
	b.ReportMetric(float64(engineColdCPU.Milliseconds()), "engine-cold-cpu-ms")
	b.ReportMetric(float64(cold)/float64(engineCold), "cold-vs-engine")
	b.ReportMetric(float64(peak-min(peak, base))/(1<<20), "heap-MB")
}

// lineCounts is the number of lines of each location of named.
func lineCounts(named pprofile.Profiles) []int {
	nl := named.Dictionary().LocationTable()
	counts := make([]int, nl.Len())
	for i := range counts {
		counts[i] = nl.At(i).Lines().Len()
	}
	return counts
}

// linesFloor times appending to a copy of template's locations as many
// lines as counts says (the processor's output has), each set as setLines
// sets it, and nothing else, on the given number of goroutines (a share of
// the locations each): the least of three runs.
func linesFloor(template pprofile.Profiles, counts []int, workers int) time.Duration {
	var best time.Duration
	for k := 0; k < 3; k++ {
		pd := pprofile.NewProfiles()
		template.CopyTo(pd)
		locs := pd.Dictionary().LocationTable()
		n := min(locs.Len(), len(counts))
		runtime.GC()
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := max(1, n*w/workers); i < n*(w+1)/workers; i++ {
					ls := locs.At(i).Lines()
					if counts[i] > 1 {
						ls.EnsureCapacity(counts[i])
					}
					for j := 0; j < counts[i]; j++ {
						l := ls.AppendEmpty()
						l.SetFunctionIndex(int32(j + 1))
						l.SetLine(int64(i))
						l.SetColumn(int64(j))
					}
				}
			}()
		}
		wg.Wait()
		if d := time.Since(start); k == 0 || d < best {
			best = d
		}
	}
	return best
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
