package symbolizationprocessor

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/collector/processor/xprocessor"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

// variant is one build of testdata/src/processor/prog.c, stripped, with its
// debug file kept aside: the binary the profile came from is not on this
// machine, so names can only come from the debug file.
type variant struct {
	id    string
	debug string
	hot   uint64 // an address inside hot()
}

func buildVariant(t *testing.T, seed int) variant {
	t.Helper()
	bin := testfixture.Build(t, testfixture.Spec{Name: fmt.Sprintf("prog-%d", seed), Lang: "c",
		Sources: []string{"processor/prog.c"}, Args: []string{"-O2", "-g", "-Wl,--build-id", fmt.Sprintf("-DSEED=%d", seed)}})
	_, debug := testfixture.SplitDebug(t, bin, false)
	start, size := testfixture.Func(t, bin, "hot")
	v := variant{id: testfixture.BuildID(t, bin), debug: debug, hot: start + size/2}
	return v
}

// serveDir puts debug files where debuginfod's scan finds them.
func serveDir(t *testing.T, vs ...variant) string {
	dir := t.TempDir()
	for i, v := range vs {
		data, err := os.ReadFile(v.debug)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("v%d.debug", i)), data, 0o644)
	}
	return dir
}

// profile makes a batch in the frame format with one sample per variant,
// each a single raw frame in hot() of a binary this machine does not have.
func profile(vs ...variant) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	prof := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	for i, v := range vs {
		mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x2000, File: fmt.Sprintf("/opt/gone/prog-%d", i),
			Attrs: []int32{d.AttrStr(pframe.AttrBuildIDGNU, v.id)}})
		loc := d.Location(pdict.Location{Mapping: mi, Address: v.hot, Attrs: []int32{d.AttrStr(pframe.AttrFrameType, "native")}})
		s := prof.Samples().AppendEmpty()
		s.SetStackIndex(d.Stack([]int32{loc}))
		s.Values().Append(int64(10 + i))
	}
	return pd
}

type outcome struct {
	name, reason string
}

// outcomes reads, per sample, the leaf's function name or its reason.
func outcomes(t *testing.T, pd pprofile.Profiles) []outcome {
	t.Helper()
	d := pdict.New(pd.Dictionary())
	samples := pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0).Samples()
	var out []outcome
	for i, s := range samples.All() {
		if s.Values().At(0) != int64(10+i) {
			t.Fatalf("sample %d value changed to %d", i, s.Values().At(0))
		}
		loc := pd.Dictionary().LocationTable().At(int(pd.Dictionary().StackTable().At(int(s.StackIndex())).LocationIndices().At(0)))
		var o outcome
		if loc.Lines().Len() > 0 {
			fn := pd.Dictionary().FunctionTable().At(int(loc.Lines().At(loc.Lines().Len() - 1).FunctionIndex()))
			o.name = d.Str(fn.NameStrindex())
		}
		if v, ok := d.FindAttr(loc.AttributeIndices(), pframe.AttrError); ok {
			o.reason = v.Str()
		}
		out = append(out, o)
	}
	return out
}

type harness struct {
	p    xprocessor.Profiles
	sink *consumertest.ProfilesSink
	cfg  *Config
	tel  *componenttest.Telemetry
}

func newHarness(t testing.TB, mutate func(*Config)) *harness {
	t.Helper()
	cfg := createDefaultConfig()
	cfg.Sources = []string{locate.SourceDebuginfod}
	cfg.Debuginfod.CacheDir = t.TempDir()
	cfg.Debuginfod.NegativeTTL = time.Millisecond
	mutate(cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	sink := new(consumertest.ProfilesSink)
	p, err := NewFactory().CreateProfiles(context.Background(), set, cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	return &harness{p: p, sink: sink, tel: tel, cfg: cfg}
}

func (h *harness) run(t *testing.T, pd pprofile.Profiles) []outcome {
	t.Helper()
	n := len(h.sink.AllProfiles())
	if err := h.p.ConsumeProfiles(context.Background(), pd); err != nil {
		t.Fatalf("ConsumeProfiles: %v", err)
	}
	all := h.sink.AllProfiles()
	if len(all) != n+1 {
		t.Fatalf("batch not forwarded")
	}
	return outcomes(t, all[n])
}

// value reads a counter's total or a gauge's current value.
func (h *harness) value(t *testing.T, name string) int64 {
	t.Helper()
	m, err := h.tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var total int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			total += dp.Value
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			total = dp.Value
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return total
}

// The gateway case: stripped binaries, names only from a real debuginfod
// server; the server dies mid-run; earlier build ids keep resolving.
func TestDebuginfod(t *testing.T) {
	a, b, c := buildVariant(t, 1), buildVariant(t, 2), buildVariant(t, 3)
	srv := testfixture.StartDebuginfod(t, serveDir(t, a, b), a.id+"/debuginfo", b.id+"/debuginfo")
	h := newHarness(t, func(cfg *Config) { cfg.Debuginfod.URLs = []string{srv.URL} })

	got := h.run(t, profile(a, b, c))
	if got[0].name != "hot" || got[1].name != "hot" {
		t.Fatalf("served build ids not resolved: %+v", got)
	}
	if r := h.value(t, "otelcol_symbolization_frames_resolved"); r != 2 {
		t.Errorf("frames_resolved = %d, want 2", r)
	}
	if r := h.value(t, "otelcol_symbolization_debuginfod_requests"); r == 0 {
		t.Error("debuginfod_requests did not move")
	}
	if got[2].reason != "no_debug_info" {
		t.Errorf("unknown build id: %+v, want no_debug_info", got[2])
	}

	srv.Stop()
	got = h.run(t, profile(a, b, c))
	if got[0].name != "hot" || got[1].name != "hot" {
		t.Errorf("after the server died, cached build ids must still resolve: %+v", got)
	}
	if got[2].reason != "fetch_failed" && got[2].reason != "no_debug_info" {
		t.Errorf("dead server: %+v", got[2])
	}
}

// loopServer serves scripted bytes per path on loopback.
func loopServer(t *testing.T, h http.HandlerFunc) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// Bad servers: a corrupt body, another build's file, a server slower than
// the batch timeout. Each gives its reason; nothing is lost; a slow fetch
// (pending meanwhile) that finishes later serves the next batch.
func TestBadServers(t *testing.T) {
	a, b := buildVariant(t, 4), buildVariant(t, 5)
	bDebug, _ := os.ReadFile(b.debug)
	aDebug, _ := os.ReadFile(a.debug)
	var slowReqs atomic.Int64
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		reason  string
	}{
		{"corrupt", func(w http.ResponseWriter, r *http.Request) {
			w.Write(append([]byte("\x7fELF"), bytes.Repeat([]byte{0xee}, 4096)...))
		}, "corrupt_file"},
		{"other build", func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/debuginfo") {
				w.Write(bDebug)
				return
			}
			http.NotFound(w, r)
		}, "build_id_mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := loopServer(t, tc.handler)
			h := newHarness(t, func(cfg *Config) { cfg.Debuginfod.URLs = []string{url} })
			if got := h.run(t, profile(a)); got[0].reason != tc.reason {
				t.Errorf("got %+v, want reason %s", got[0], tc.reason)
			}
		})
	}
	t.Run("slow", func(t *testing.T) {
		url := loopServer(t, func(w http.ResponseWriter, r *http.Request) {
			slowReqs.Add(1)
			time.Sleep(1500 * time.Millisecond)
			if strings.HasSuffix(r.URL.Path, "/debuginfo") {
				w.Write(aDebug)
				return
			}
			http.NotFound(w, r)
		})
		h := newHarness(t, func(cfg *Config) {
			cfg.Debuginfod.URLs = []string{url}
			cfg.Timeout = 300 * time.Millisecond
			cfg.Debuginfod.Timeout = 10 * time.Second
		})
		start := time.Now()
		got := h.run(t, profile(a))
		if took := time.Since(start); took > 1200*time.Millisecond {
			t.Errorf("a slow server held the batch %v; the bound is %v", took, 300*time.Millisecond)
		}
		if got[0].reason != "pending" {
			t.Errorf("slow server: %+v, want pending", got[0])
		}
		// The download goes on; a later batch gets the names.
		deadline := time.Now().Add(15 * time.Second)
		for {
			time.Sleep(500 * time.Millisecond)
			got = h.run(t, profile(a))
			if got[0].name == "hot" || time.Now().After(deadline) {
				break
			}
		}
		if got[0].name != "hot" {
			t.Errorf("after the slow fetch finished: %+v", got[0])
		}
	})
}

// 1,000 distinct build ids through a small object cache: memory stays
// within the bound. The objects are copies of one debug file with the build
// id rewritten, served from a symbol directory.
func TestCacheBound(t *testing.T) {
	v := buildVariant(t, 6)
	orig, err := os.ReadFile(v.debug)
	if err != nil {
		t.Fatal(err)
	}
	idBytes, _ := hex.DecodeString(v.id)
	at := bytes.Index(orig, idBytes)
	if at < 0 {
		t.Fatal("build id not found in the debug file")
	}
	dir := t.TempDir()
	const n = 1000
	vs := make([]variant, n)
	for i := range vs {
		data := bytes.Clone(orig)
		copy(data[at:], fmt.Sprintf("%020d", i)) // 20 bytes: a new id
		id := hex.EncodeToString(data[at : at+len(idBytes)])
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d.debug", i)), data, 0o644)
		vs[i] = variant{id: id, hot: v.hot}
	}
	const bound = 4 << 20 // about a dozen of these objects
	h := newHarness(t, func(cfg *Config) {
		cfg.Sources = []string{locate.SourceSymbolDirs}
		cfg.SymbolDirectories = []string{dir}
		cfg.Cache.MaxBytes = bound
		cfg.Cache.MaxEntries = 100
	})
	var peak int64
	for i := 0; i < n; i += 50 {
		got := h.run(t, profile(vs[i:i+50]...))
		if held := h.value(t, "otelcol_symbolization_cache_bytes"); held > bound+int64(len(orig))*4 {
			t.Fatalf("after %d objects the cache holds %d bytes, bound %d", i+50, held, bound)
		}
		for j, o := range got {
			if o.name != "hot" {
				t.Fatalf("object %d: %+v", i+j, o)
			}
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, int64(ms.HeapAlloc))
	}
	held := h.value(t, "otelcol_symbolization_cache_bytes")
	one := int64(len(orig)) * 4 // an object: its mapping plus parsed state, generously
	t.Logf("object cache holds %d bytes (bound %d); peak heap after GC %d MB", held, bound, peak>>20)
	if held > bound+one {
		t.Errorf("object cache holds %d bytes, bound %d", held, bound)
	}
	if peak > 256<<20 {
		t.Errorf("heap grew to %d MB over 1,000 objects", peak>>20)
	}
}

// The profiles and logs pipelines of one configuration share a symbolizer:
// one set of caches, one debuginfod client.
func TestSharedAcrossPipelines(t *testing.T) {
	cfg := createDefaultConfig()
	cfg.Sources = []string{locate.SourceDebugDirs}
	set := processortest.NewNopSettings(metadata.Type)
	f := NewFactory()
	pp, err := f.CreateProfiles(context.Background(), set, cfg, new(consumertest.ProfilesSink))
	if err != nil {
		t.Fatal(err)
	}
	lp, err := f.CreateLogs(context.Background(), set, cfg, new(consumertest.LogsSink))
	if err != nil {
		t.Fatal(err)
	}
	host := componenttest.NewNopHost()
	if err := pp.Start(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if err := lp.Start(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if e, users, _ := symbolizers.Get(cfg); e == nil || users != 2 {
		t.Fatalf("want one shared symbolizer with 2 users, got %+v (%d users)", e, users)
	}
	pp.Shutdown(context.Background())
	lp.Shutdown(context.Background())
	if _, _, ok := symbolizers.Get(cfg); ok {
		t.Fatal("shared symbolizer not released after the last shutdown")
	}
}
