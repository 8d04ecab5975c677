package symboluploadprocessor

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/collector/processor/xprocessor"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
	"github.com/profsym/profsym/processor/symboluploadprocessor/internal/metadata"
	"github.com/profsym/profsym/processor/symboluploadprocessor/internal/metadatatest"
)

// profileOf builds a profile like the profiling receiver's: one resource per
// process, one sample whose stack has one location in each mapping. A
// mapping's id is its GNU build id, or "go:" and its Go build id for a
// mapping with no GNU one.
func profileOf(pid int64, mappings map[string]string) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	dict := pd.Dictionary()
	dict.StringTable().Append("", pframe.AttrBuildIDGNU, pframe.AttrBuildIDGo)
	dict.MappingTable().AppendEmpty()
	dict.LocationTable().AppendEmpty()
	dict.StackTable().AppendEmpty()
	stack := dict.StackTable().AppendEmpty()
	for path, id := range mappings {
		kv := dict.AttributeTable().AppendEmpty()
		kv.SetKeyStrindex(1)
		if goID, ok := strings.CutPrefix(id, "go:"); ok {
			kv.SetKeyStrindex(2)
			id = goID
		}
		kv.Value().SetStr(id)
		m := dict.MappingTable().AppendEmpty()
		m.SetFilenameStrindex(int32(dict.StringTable().Len()))
		dict.StringTable().Append(path)
		m.AttributeIndices().Append(int32(dict.AttributeTable().Len() - 1))
		loc := dict.LocationTable().AppendEmpty()
		loc.SetMappingIndex(int32(dict.MappingTable().Len() - 1))
		loc.SetAddress(0x1000)
		stack.LocationIndices().Append(int32(dict.LocationTable().Len() - 1))
	}
	rp := pd.ResourceProfiles().AppendEmpty()
	rp.Resource().Attributes().PutInt(pframe.AttrPID, pid)
	s := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples().AppendEmpty()
	s.SetStackIndex(1)
	s.Values().Append(1)
	return pd
}

// Profiles pass through unchanged while the mapped binary's symbols reach
// the store; disabled, nothing is uploaded.
func TestPassThroughAndUpload(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "procupload", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=procupload"}})
	id := testfixture.BuildID(t, bin)
	cmd := exec.Command(bin, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(50 * time.Millisecond)

	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be})
	var requests atomic.Int64
	h := store.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1); h.ServeHTTP(w, r) }))
	defer srv.Close()

	for _, enabled := range []bool{false, true} {
		cfg := createDefaultConfig()
		cfg.Enabled = enabled
		cfg.ClientConfig.Endpoint = srv.URL
		cfg.QueryInterval = 100 * time.Millisecond
		sink := new(consumertest.ProfilesSink)
		p, err := NewFactory().CreateProfiles(context.Background(), processortest.NewNopSettings(metadata.Type), cfg, sink)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
			t.Fatal(err)
		}
		pd := profileOf(int64(cmd.Process.Pid), map[string]string{bin: id, "/nonexistent/lib.so": "0011223344556677"})
		want := pprofile.NewProfiles()
		pd.CopyTo(want)
		if err := p.ConsumeProfiles(context.Background(), pd); err != nil {
			t.Fatal(err)
		}
		if len(sink.AllProfiles()) != 1 {
			t.Fatal("profile not forwarded")
		}
		m1, _ := (&pprofile.JSONMarshaler{}).MarshalProfiles(want)
		m2, _ := (&pprofile.JSONMarshaler{}).MarshalProfiles(sink.AllProfiles()[0])
		if string(m1) != string(m2) {
			t.Error("the profile was changed")
		}
		deadline := time.Now().Add(10 * time.Second)
		for enabled && !store.Has(id, symstore.DebugInfo) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		// Shutdown waits for the processor's background work, so what has
		// not reached the store by then never will.
		p.Shutdown(context.Background())
		if got := store.Has(id, symstore.DebugInfo); got != enabled {
			t.Errorf("enabled=%v: stored=%v", enabled, got)
		}
		if n := requests.Load(); !enabled && n != 0 {
			t.Errorf("disabled, yet %d requests reached the store", n)
		}
	}
}

// A Go binary linked without a GNU build id (Go before 1.24, or
// -ldflags=-B=none) is uploaded under its Go build id.
func TestUploadByGoBuildID(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "procgo", Lang: "go", Sources: []string{"sampler/gohot"},
		Args: []string{"-ldflags=-B=none -X main.fixture=procgo"}})
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	goID, err := buildid.Go(f)
	_, gnuErr := buildid.GNU(f)
	f.Close()
	if err != nil || gnuErr == nil {
		t.Fatalf("fixture: Go build id %q (%v), GNU build id error %v", goID, err, gnuErr)
	}
	cmd := exec.Command(bin, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(50 * time.Millisecond)

	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be})
	srv := httptest.NewServer(store.Handler())
	defer srv.Close()
	cfg := createDefaultConfig()
	cfg.ClientConfig.Endpoint = srv.URL
	cfg.QueryInterval = 100 * time.Millisecond
	p, err := NewFactory().CreateProfiles(context.Background(), processortest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if err := p.ConsumeProfiles(context.Background(), profileOf(int64(cmd.Process.Pid), map[string]string{bin: "go:" + goID})); err != nil {
		t.Fatal(err)
	}
	key, _ := symstore.GoKey(goID)
	deadline := time.Now().Add(10 * time.Second)
	for !store.Has(key.String(), symstore.DebugInfo) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !store.Has(key.String(), symstore.DebugInfo) {
		t.Fatalf("%s not stored", key)
	}
}

// counter sums a counter of the processors' telemetry (0 before it counts).
func counter(tel *componenttest.Telemetry, name string) int64 {
	m, err := tel.GetMetric(name)
	if err != nil {
		return 0
	}
	var n int64
	if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range sum.DataPoints {
			n += dp.Value
		}
	}
	return n
}

// BenchmarkSteadyState is the processor's cost on the agent's hot path once
// every build id has been handled: a profile with 200 mappings.
func BenchmarkSteadyState(b *testing.B) {
	maps := map[string]string{}
	for i := 0; i < 200; i++ {
		maps[fmt.Sprintf("/usr/lib/lib%d.so", i)] = fmt.Sprintf("%040x", i+1)
	}
	cfg := createDefaultConfig()
	cfg.ClientConfig.Endpoint = "http://127.0.0.1:1" // nothing listens: ids end up failing, never block
	p, err := NewFactory().CreateProfiles(context.Background(), processortest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	p.Start(context.Background(), componenttest.NewNopHost())
	defer p.Shutdown(context.Background())
	pd := profileOf(1, maps)
	p.ConsumeProfiles(context.Background(), pd)
	time.Sleep(500 * time.Millisecond) // ids resolved (their files do not exist) and done
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.ConsumeProfiles(context.Background(), pd)
	}
}

// Ten agents (processor instances, each with its own client) see the same
// new build id at once: the store receives one upload body in all.
func TestTenAgentsOneUpload(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "procten", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=procten"}})
	id := testfixture.BuildID(t, bin)
	cmd := exec.Command(bin, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(50 * time.Millisecond)

	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be})
	var puts, queries atomic.Int64
	h := store.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			puts.Add(1)
		} else {
			queries.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	tel := componenttest.NewTelemetry()
	defer tel.Shutdown(context.Background())
	var procs []xprocessor.Profiles
	for i := 0; i < 10; i++ {
		cfg := createDefaultConfig()
		cfg.ClientConfig.Endpoint = srv.URL
		cfg.QueryInterval = 100 * time.Millisecond
		p, err := NewFactory().CreateProfiles(context.Background(), metadatatest.NewSettings(tel), cfg, consumertest.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
			t.Fatal(err)
		}
		defer p.Shutdown(context.Background())
		procs = append(procs, p)
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.ConsumeProfiles(context.Background(), profileOf(int64(cmd.Process.Pid), map[string]string{bin: id}))
		}()
	}
	wg.Wait()
	// Done when every agent has settled the id: one stored it, the nine
	// others learned the store has it. Nothing is left to upload then.
	deadline := time.Now().Add(30 * time.Second)
	for counter(tel, "otelcol_symbolupload_uploads_stored")+counter(tel, "otelcol_symbolupload_uploads_deduped") < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d stored, %d deduped", counter(tel, "otelcol_symbolupload_uploads_stored"), counter(tel, "otelcol_symbolupload_uploads_deduped"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d missing queries, %d uploads", queries.Load(), puts.Load())
	if !store.Has(id, symstore.DebugInfo) || puts.Load() != 1 {
		t.Errorf("stored %v after %d uploads, want 1", store.Has(id, symstore.DebugInfo), puts.Load())
	}
}
