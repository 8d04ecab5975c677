package symbolizationprocessor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

type hostileFrame struct {
	file     string
	gnu, htl string
	addr     uint64
}

// hostileProfile is one sample per frame, each frame in its own mapping.
func hostileProfile(frames []hostileFrame) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	prof := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	for i, f := range frames {
		var attrs []int32
		if f.gnu != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDGNU, f.gnu))
		}
		if f.htl != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDHTL, f.htl))
		}
		mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x2000, File: f.file, Attrs: attrs})
		loc := d.Location(pdict.Location{Mapping: mi, Address: f.addr, Attrs: []int32{d.AttrStr(frame.AttrFrameType, "native")}})
		s := prof.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack([]int32{loc}))
		s.Values().Append(int64(10 + i))
	}
	return pd
}

// A gateway fed every hostile case of issue 10 at once, local source over a
// root: each bad frame keeps flowing with its reason, nothing outside the
// root is used, and the healthy frame of the same batch is named.
func TestHostileBatch(t *testing.T) {
	v := buildVariant(t, 7)
	full := testfixture.Build(t, testfixture.Spec{Name: "prog-7", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id", "-DSEED=7"}})
	data, _ := os.ReadFile(full)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "bin", "prog"), data, 0o755)
	os.WriteFile(filepath.Join(dir, "outside"), data, 0o755) // what an escape would reach
	syscall.Mkfifo(filepath.Join(root, "bin", "fifo"), 0o644)
	huge := filepath.Join(root, "bin", "huge")
	f, _ := os.Create(huge)
	f.Write(data)
	f.Truncate(1 << 40) // a sparse 1 TiB file
	f.Close()
	os.WriteFile(filepath.Join(root, "bin", "corrupt"), append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 200)...), 0o755)
	dd := filepath.Join(dir, "debug")
	os.MkdirAll(dd, 0o755)

	cases := []struct {
		frame  hostileFrame
		reason string
	}{
		{hostileFrame{"/bin/x", strings.Repeat("ab", 1<<19), "", v.hot}, "invalid_build_id"},             // F1: 1 MiB id
		{hostileFrame{"/bin/x", "..//../../outside", "", v.hot}, "invalid_build_id"},                     // F2
		{hostileFrame{"/../../outside", "", "00112233445566778899aabbccddeeff", v.hot}, "no_debug_info"}, // F3: stays in root
		{hostileFrame{"/bin/fifo", "", "0102030405060708090a0b0c0d0e0f10", v.hot}, "invalid_path"},       // F4: not a regular file
		{hostileFrame{"/bin/huge", "", "1102030405060708090a0b0c0d0e0f10", v.hot}, "limit_exceeded"},     // F5: 1 TiB
		{hostileFrame{"/bin/corrupt", "", "2102030405060708090a0b0c0d0e0f10", v.hot}, "corrupt_file"},
		{hostileFrame{"/bin/prog", v.id, "", v.hot}, ""}, // healthy
	}
	var frames []hostileFrame
	for _, c := range cases {
		frames = append(frames, c.frame)
	}
	h := newHarness(t, func(cfg *Config) {
		cfg.Sources = []string{locate.SourceLocal, locate.SourceDebugDirs}
		cfg.Local.Root = root
		cfg.DebugDirectories = []string{dd}
		cfg.Limits.MaxFileBytes = 1 << 30
	})
	done := make(chan []outcome)
	go func() { done <- h.run(t, hostileProfile(frames)) }()
	var got []outcome
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the batch hung")
	}
	for i, c := range cases {
		if c.reason == "" {
			if got[i].name != "hot" {
				t.Errorf("healthy frame: %+v", got[i])
			}
			continue
		}
		if got[i].name != "" || got[i].reason != c.reason {
			t.Errorf("case %d: %+v, want reason %s", i, got[i], c.reason)
		}
	}
	if n := h.value(t, "otelcol_symbolization_frames_resolved"); n != 1 {
		t.Errorf("frames_resolved %d", n)
	}
}

// Every cache reports bytes, entries and evictions per cache; the
// debuginfod latency histogram gets one real value per download attempt;
// the batch histogram one per batch.
func TestTelemetry(t *testing.T) {
	a, b := buildVariant(t, 8), buildVariant(t, 9)
	srv := testfixture.StartDebuginfod(t, serveDir(t, a, b), a.id+"/debuginfo", b.id+"/debuginfo")
	h := newHarness(t, func(cfg *Config) {
		cfg.Debuginfod.URLs = []string{srv.URL}
		cfg.Cache.MaxObjects = 1 // forces evictions of object numbers and located answers
	})
	for i := 0; i < 3; i++ {
		h.run(t, profile(a, b))
	}
	m, err := h.tel.GetMetric("otelcol_symbolization_cache_entries")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		name, _ := dp.Attributes.Value("cache")
		seen[name.AsString()] = true
	}
	for _, c := range []string{"objects", "results", "partial_results", "demangle", "functions", "object_ids", "located", "file_ids"} {
		if !seen[c] {
			t.Errorf("no cache_entries for cache %s (have %v)", c, seen)
		}
	}
	if n := h.value(t, "otelcol_symbolization_cache_evictions"); n == 0 {
		t.Error("no evictions counted with max_objects 1")
	}
	lat, err := h.tel.GetMetric("otelcol_symbolization_debuginfod_latency")
	if err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, dp := range lat.Data.(metricdata.Histogram[float64]).DataPoints {
		count += dp.Count
		sum += dp.Sum
	}
	if count == 0 || sum <= 0 {
		t.Errorf("latency histogram: %d values, sum %v", count, sum)
	}
	bd, _ := h.tel.GetMetric("otelcol_symbolization_batch_duration")
	var batches uint64
	for _, dp := range bd.Data.(metricdata.Histogram[float64]).DataPoints {
		batches += dp.Count
	}
	if batches != 3 {
		t.Errorf("batch_duration has %d values for 3 batches", batches)
	}
	t.Logf("debuginfod attempts %d, %.3fs in all", count, sum)
}

// limits.max_decompressed_bytes: a binary whose compressed DWARF expands
// past the bound keeps flowing, named from its symbol table only (no
// lines), with the location attribute profsym.symbolization.incomplete
// saying why its lines are missing, counted in frames_incomplete.
func TestMaxDecompressedBytes(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "prog-gz", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-gz=zlib", "-Wl,--build-id", "-DSEED=12"}})
	start, size := testfixture.Func(t, bin, "hot")
	v := variant{id: testfixture.BuildID(t, bin), hot: start + size/2}
	dir := t.TempDir()
	data, _ := os.ReadFile(bin)
	os.WriteFile(filepath.Join(dir, "prog"), data, 0o755)
	for _, tc := range []struct {
		limit int64
		lines bool
	}{{0, true}, {1024, false}} {
		h := newHarness(t, func(cfg *Config) {
			cfg.Sources = []string{locate.SourceSymbolDirs}
			cfg.SymbolDirectories = []string{dir}
			if tc.limit > 0 {
				cfg.Limits.MaxDecompressedBytes = tc.limit
			}
		})
		h.run(t, profile(v))
		pd := h.sink.AllProfiles()[0]
		loc := pd.Dictionary().LocationTable().At(1)
		gotLines := loc.Lines().Len() > 0 && loc.Lines().At(0).Line() != 0
		if gotLines != tc.lines || loc.Lines().Len() == 0 {
			t.Errorf("limit %d: %d lines, first line %v; want lines %v and a name", tc.limit, loc.Lines().Len(), gotLines, tc.lines)
		}
		d := pdict.New(pd.Dictionary())
		why, has := d.FindAttr(loc.AttributeIndices(), frame.AttrIncomplete)
		if _, raw := d.FindAttr(loc.AttributeIndices(), frame.AttrError); raw {
			t.Errorf("limit %d: a named frame carries %s", tc.limit, frame.AttrError)
		}
		incomplete := h.value(t, "otelcol_symbolization_frames_incomplete")
		switch {
		case tc.lines && (has || incomplete != 0):
			t.Errorf("limit %d: lines present, yet %s=%q and frames_incomplete %d", tc.limit, frame.AttrIncomplete, why.Str(), incomplete)
		case !tc.lines && (why.Str() != "limit_exceeded" || incomplete != 1):
			t.Errorf("limit %d: %s=%q (present %v), frames_incomplete %d; want limit_exceeded and 1", tc.limit, frame.AttrIncomplete, why.Str(), has, incomplete)
		}
	}
	// A binary without any DWARF is named from its symbol table as before,
	// without the attribute: nothing failed, there is nothing to read.
	stripped := filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("strip", "--strip-debug", "-o", stripped, bin).CombinedOutput(); err != nil {
		testfixture.SkipOrFail(t, "strip: %v %s", err, out)
	}
	h := newHarness(t, func(cfg *Config) {
		cfg.Sources = []string{locate.SourceSymbolDirs}
		cfg.SymbolDirectories = []string{filepath.Dir(stripped)}
	})
	h.run(t, profile(v))
	pd := h.sink.AllProfiles()[0]
	loc := pd.Dictionary().LocationTable().At(1)
	if _, has := pdict.New(pd.Dictionary()).FindAttr(loc.AttributeIndices(), frame.AttrIncomplete); has || loc.Lines().Len() == 0 {
		t.Errorf("no DWARF at all: %d lines, %s present %v; want a name and no attribute", loc.Lines().Len(), frame.AttrIncomplete, has)
	}
}
