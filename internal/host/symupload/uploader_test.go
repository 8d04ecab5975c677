package symupload

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

// counts is an Observer for both the store and the uploaders.
type counts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *counts) add(k string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[k] += n
}

func (c *counts) get(k string) int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.m[k] }

func (c *counts) Attempted()                  { c.add("attempted", 1) }
func (c *counts) Stored(n int64)              { c.add("stored", 1); c.add("bytes", n) }
func (c *counts) Deduped()                    { c.add("deduped", 1) }
func (c *counts) Failed(r string)             { c.add("failed:"+r, 1) }
func (c *counts) Skipped(r string)            { c.add("skipped:"+r, 1) }
func (c *counts) storeObs() symstore.Observer { return storeObs{c} }

type storeObs struct{ c *counts }

func (s storeObs) Rejected(r string)               { s.c.add("store_rejected:"+r, 1) }
func (s storeObs) Stored(_ symstore.Kind, n int64) { s.c.add("store_stored", 1) }
func (s storeObs) Deduped(symstore.Kind)           { s.c.add("store_deduped", 1) }
func (s storeObs) Served(symstore.Kind, int64)     {}
func (s storeObs) Queried(int, int)                { s.c.add("store_queries", 1) }

func startStore(t testing.TB, c *counts) (*symstore.Store, *httptest.Server) {
	t.Helper()
	be, err := symstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := symstore.New(context.Background(), symstore.Config{Backend: be, Observer: c.storeObs()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

// runFixture starts a real process of bin and returns its pid.
func runFixture(t testing.TB, bin string) int64 {
	t.Helper()
	cmd := exec.Command(bin, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	time.Sleep(50 * time.Millisecond) // let it exec
	return int64(cmd.Process.Pid)
}

func waitFor(t testing.TB, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newUploader(t testing.TB, url string, c *counts, mod func(*Config)) *Uploader {
	client, err := symstore.NewClient(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Client: client, QueryInterval: 100 * time.Millisecond, InitialBackoff: 100 * time.Millisecond,
		MaxBackoff: time.Second, ScratchDir: t.TempDir(), Observer: c}
	if mod != nil {
		mod(&cfg)
	}
	u := New(cfg)
	t.Cleanup(u.Stop)
	return u
}

// Ten agents on one host start at once on the same new build id: the store
// stores it once, and exactly one agent sends the file.
func TestTenAgentsUploadOnce(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "uploadonce", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=uploadonce"}})
	id := testfixture.BuildID(t, bin)
	pid := runFixture(t, bin)
	c := &counts{}
	store, srv := startStore(t, c)
	var agents []*Uploader
	for i := 0; i < 10; i++ {
		u := newUploader(t, srv.URL, c, nil)
		u.Observe(Candidate{PID: pid, Path: bin, BuildID: id})
		agents = append(agents, u)
	}
	var wg sync.WaitGroup
	for _, u := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); u.Start() }()
	}
	wg.Wait()
	waitFor(t, "all agents done", 20*time.Second, func() bool {
		for _, u := range agents {
			if _, _, d := u.Stats(); d != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("counts: %v", c.m)
	if c.get("attempted") != 1 || c.get("stored") != 1 || c.get("store_stored") != 1 || c.get("deduped") != 9 {
		t.Errorf("want 1 upload attempted and stored, 9 deduplicated: %v", c.m)
	}
	if !store.Has(id, symstore.DebugInfo) {
		t.Error("store lacks the id")
	}
}

// A stripped binary whose debug file sits in a .build-id tree configured on
// the agent uploads that debug file's sections.
func TestStrippedWithBuildIDDir(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "uploadstripped", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=uploadstripped"}})
	id := testfixture.BuildID(t, bin)
	stripped, debug := testfixture.SplitDebug(t, bin, false)
	dbgDir := t.TempDir()
	os.MkdirAll(filepath.Join(dbgDir, ".build-id", id[:2]), 0o755)
	data, _ := os.ReadFile(debug)
	os.WriteFile(filepath.Join(dbgDir, ".build-id", id[:2], id[2:]+".debug"), data, 0o644)
	pid := runFixture(t, stripped)

	c := &counts{}
	store, srv := startStore(t, c)
	// Without the debug dir: nothing to upload.
	u0 := newUploader(t, srv.URL, c, nil)
	u0.Observe(Candidate{PID: pid, Path: stripped, BuildID: id})
	u0.Start()
	waitFor(t, "skip", 10*time.Second, func() bool { _, _, d := u0.Stats(); return d == 1 })
	if c.get("skipped:no_debug_info") != 1 || store.Has(id, symstore.DebugInfo) {
		t.Fatalf("stripped binary without a debug file: %v", c.m)
	}

	u := newUploader(t, srv.URL, c, func(cfg *Config) { cfg.DebugDirs = []string{dbgDir} })
	u.Observe(Candidate{PID: pid, Path: filepath.Base(stripped), BuildID: id}) // a basename, as the upstream profiler sends
	u.Start()
	waitFor(t, "upload", 10*time.Second, func() bool { return store.Has(id, symstore.DebugInfo) })
	_, dbg, err := store.Locate(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elfx.Open(dbg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.HasSection(".debug_info") || !keepdebug.HasSymbols(f) {
		t.Error("stored file lacks the debug file's DWARF")
	}
}

// Exclude globs keep files from being uploaded.
func TestExclude(t *testing.T) {
	u := New(Config{Exclude: []string{"/opt/secret/**", "*.so.*", "/usr/bin/ba?h"}})
	for p, want := range map[string]bool{
		"/opt/secret/bin/x": true, "/opt/secret": true, "/opt/secrets/x": false,
		"/lib/libfoo.so.1": true, "/usr/bin/bash": true, "/usr/bin/zsh": false,
	} {
		if u.Excluded(p) != want {
			t.Errorf("Excluded(%s) = %v", p, !want)
		}
	}
}

// A gateway that is down only delays the upload: attempts back off, and
// the file goes up once the store listens.
func TestGatewayDownDelays(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "uploaddown", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=uploaddown"}})
	id := testfixture.BuildID(t, bin)
	pid := runFixture(t, bin)
	c := &counts{}
	port := testfixture.FreePort(t)
	u := newUploader(t, fmt.Sprintf("http://127.0.0.1:%d", port), c, nil)
	u.Observe(Candidate{PID: pid, Path: bin, BuildID: id})
	u.Start()
	waitFor(t, "failed attempts", 10*time.Second, func() bool { return c.get("failed:unreachable") >= 2 })

	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be})
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: store.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	waitFor(t, "upload after the gateway came up", 15*time.Second, func() bool { return store.Has(id, symstore.DebugInfo) })
}

// bigDebugFile makes a real binary carrying size bytes of incompressible
// .debug_info (objcopy --add-section), so the extracted upload is ~size.
func bigDebugFile(t testing.TB, size int) (string, string) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "uploadbig", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-Wl,--build-id", "-DE2E_ID=uploadbig"}})
	objcopy := testfixture.NeedTool(t, "objcopy")
	dir := t.TempDir()
	blob := filepath.Join(dir, "blob")
	b := make([]byte, size)
	rand.Read(b)
	os.WriteFile(blob, b, 0o644)
	out := filepath.Join(dir, "big")
	testfixture.Run(t, objcopy, "--add-section", ".debug_info="+blob, bin, out)
	return out, testfixture.BuildID(t, bin)
}

// BenchmarkThrottledUpload uploads a binary carrying 100 MB of
// incompressible debug info through an agent limited to max_bandwidth and
// reports the achieved rate against the limit (ratio ~1 means the limit
// holds), and the agent's CPU seconds for the whole upload (extraction,
// compression attempt, sending): the cost the sampled host pays.
func BenchmarkThrottledUpload(b *testing.B) {
	const size = 100 << 20
	const rate = 50 << 20 // bytes/s
	bin, id := bigDebugFile(b, size)
	for i := 0; i < b.N; i++ {
		c := &counts{}
		be, _ := symstore.NewDir(b.TempDir())
		store, _ := symstore.New(context.Background(), symstore.Config{Backend: be, Observer: c.storeObs()})
		// Time the PUT on the server: the wire rate, without extraction.
		var putStart, putEnd time.Time
		var mu sync.Mutex
		h := store.Handler()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				mu.Lock()
				putStart = time.Now()
				mu.Unlock()
				defer func() { mu.Lock(); putEnd = time.Now(); mu.Unlock() }()
			}
			h.ServeHTTP(w, r)
		}))
		client, _ := symstore.NewClient(srv.URL, "", nil)
		client.Limiter = symstore.NewLimiter(rate, 0)
		u := New(Config{Client: client, QueryInterval: 50 * time.Millisecond, ScratchDir: b.TempDir(), Observer: c})
		var ru0, ru1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		u.Observe(Candidate{Path: bin, BuildID: id})
		u.Start()
		for !store.Has(id, symstore.DebugInfo) {
			time.Sleep(5 * time.Millisecond)
		}
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		u.Stop()
		srv.Close()
		mu.Lock()
		el := putEnd.Sub(putStart)
		mu.Unlock()
		sent := c.get("bytes")
		b.ReportMetric(float64(sent)/(1<<20), "MB_sent")
		b.ReportMetric(float64(sent)/el.Seconds()/(1<<20), "MB/s")
		b.ReportMetric(float64(sent)/el.Seconds()/rate, "ratio_to_limit")
		cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) + syscall.TimevalToNsec(ru1.Stime) -
			syscall.TimevalToNsec(ru0.Utime) - syscall.TimevalToNsec(ru0.Stime))
		b.ReportMetric(cpu.Seconds(), "cpu_s_incl_store")
	}
}

// An extraction paced by max_bandwidth can outlast the store's lease: the
// agent renews it meanwhile, so another agent asking all along is told
// "pending", never given the id, and the file is sent once.
func TestPacedExtractionKeepsLease(t *testing.T) {
	bin, id := bigDebugFile(t, 6<<20)
	c := &counts{}
	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be, Lease: 2 * time.Second, Observer: c.storeObs()})
	srv := httptest.NewServer(store.Handler())
	defer srv.Close()
	u := newUploader(t, srv.URL, c, func(cfg *Config) {
		cfg.Client.Limiter = symstore.NewLimiter(2<<20, 0) // extraction alone takes 3 s
	})
	start := time.Now()
	u.Observe(Candidate{Path: bin, BuildID: id})
	u.Start()
	other, _ := symstore.NewClient(srv.URL, "", nil)
	waitFor(t, "the lease", 5*time.Second, func() bool { return c.get("attempted") == 1 })
	for !store.Has(id, symstore.DebugInfo) {
		res, err := other.Missing(context.Background(), []string{id})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Upload) > 0 {
			t.Fatalf("after %v another agent was given the id", time.Since(start).Round(time.Millisecond))
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("not stored within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The pacing itself is TestLimiter's (exact, on a virtual clock); here
	// it must only have outlasted the lease, or renewal was not tested.
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("stored after %v, within the 2 s lease: the extraction was not paced (6 MiB at 2 MiB/s)", took)
	}
	if c.get("store_stored") != 1 || c.get("stored") != 1 {
		t.Errorf("counts %v", c.m)
	}
}

// Build ids come from the profiles passing through: however many distinct
// ones arrive (excluded paths or not), the table stays within MaxTracked.
func TestTrackedBounded(t *testing.T) {
	u := New(Config{Exclude: []string{"/opt/secret/**"}, MaxTracked: 100})
	for i := 0; i < 1000; i++ {
		u.Observe(Candidate{Path: "/opt/secret/x", BuildID: fmt.Sprintf("%040x", i+1)})
		u.Observe(Candidate{Path: "/usr/bin/x", BuildID: fmt.Sprintf("%040x", 1<<20+i)})
	}
	u.mu.Lock()
	n := len(u.ids)
	u.mu.Unlock()
	if n > 100 {
		t.Errorf("%d build ids tracked, bound 100", n)
	}
}
