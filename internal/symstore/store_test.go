package symstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/clock"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/testfixture"
)

// countObs counts events by name.
type countObs struct {
	mu sync.Mutex
	m  map[string]int64
}

func (o *countObs) add(k string, n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]int64{}
	}
	o.m[k] += n
}
func (o *countObs) get(k string) int64 { o.mu.Lock(); defer o.mu.Unlock(); return o.m[k] }

func (o *countObs) Rejected(r string)        { o.add("rejected:"+r, 1) }
func (o *countObs) Stored(k Kind, n int64)   { o.add("stored", 1); o.add("stored_bytes", n) }
func (o *countObs) Deduped(Kind)             { o.add("deduped", 1) }
func (o *countObs) Served(k Kind, n int64)   { o.add("served", 1) }
func (o *countObs) Queried(ids, missing int) { o.add("queried", int64(ids)) }

// fixture is a real unstripped C binary, its id and its extracted debuginfo.
type fixture struct {
	bin, id, debug string
}

func buildFixture(t testing.TB, name string) fixture {
	t.Helper()
	bin := testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=" + name}})
	return fixture{bin: bin, id: testfixture.BuildID(t, bin), debug: extractTo(t, bin)}
}

func extractTo(t testing.TB, bin string) string {
	t.Helper()
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := filepath.Join(t.TempDir(), "debuginfo")
	w, _ := os.Create(out)
	defer w.Close()
	if _, err := keepdebug.Write(f, w, keepdebug.Zstd); err != nil {
		t.Fatal(err)
	}
	return out
}

func newServer(t testing.TB, maxUpload int64) (*Store, *httptest.Server, *countObs, string) {
	t.Helper()
	dir := t.TempDir()
	be, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countObs{}
	s, err := New(context.Background(), Config{Backend: be, MaxUploadBytes: maxUpload, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv, obs, dir
}

// storedFiles lists what the directory backend holds, temp files included.
func storedFiles(t testing.TB, dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	return out
}

func TestUploadServeAndDedup(t *testing.T) {
	fx := buildFixture(t, "storeup")
	s, srv, obs, _ := newServer(t, 0)
	c, _ := NewClient(srv.URL, "", nil)
	ctx := context.Background()

	res, err := c.Missing(ctx, []string{fx.id, strings.ToUpper(fx.id)})
	if err != nil || len(res.Upload) != 1 || res.Upload[0].Token == "" || len(res.Pending) != 1 {
		t.Fatalf("Missing = %+v, %v; want one lease and the same id pending", res, err)
	}
	stored, err := c.Upload(ctx, fx.id, DebugInfo, fx.debug, res.Upload[0].Token)
	if err != nil || !stored {
		t.Fatalf("Upload = %v, %v", stored, err)
	}
	// Now present: not missing, and a second upload is deduplicated.
	if res, _ := c.Missing(ctx, []string{fx.id}); len(res.Upload)+len(res.Pending) != 0 {
		t.Errorf("still missing after upload: %+v", res)
	}
	if stored, err := c.Upload(ctx, fx.id, DebugInfo, fx.debug, ""); err != nil || stored {
		t.Errorf("second upload = %v, %v; want deduplicated", stored, err)
	}
	if obs.get("stored") != 1 || obs.get("deduped") != 1 {
		t.Errorf("counters %v", obs.m)
	}
	if n, b := s.Size(); n != 1 || b == 0 {
		t.Errorf("Size = %d, %d", n, b)
	}

	// debuginfod protocol: whole file, a range, HEAD, 404 for the other kind.
	want, _ := os.ReadFile(fx.debug)
	resp, err := http.Get(srv.URL + "/buildid/" + fx.id + "/debuginfo")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, want) || resp.Header.Get("X-Debuginfod-Size") != fmt.Sprint(len(want)) {
		t.Errorf("GET: %d, %d bytes (want %d)", resp.StatusCode, len(got), len(want))
	}
	req, _ := http.NewRequest("GET", srv.URL+"/buildid/"+fx.id+"/debuginfo", nil)
	req.Header.Set("Range", "bytes=16-79")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, want[16:80]) {
		t.Errorf("range GET: %d, %d bytes", resp.StatusCode, len(got))
	}
	if r, _ := http.Get(srv.URL + "/buildid/" + fx.id + "/executable"); r.StatusCode != 404 {
		t.Errorf("executable: %d, want 404", r.StatusCode)
	}

	// In process: Locate returns the stored file as the debug file.
	bin, dbg, err := s.Locate(ctx, fx.id)
	if err != nil || bin != "" || dbg == "" {
		t.Errorf("Locate = %q, %q, %v", bin, dbg, err)
	}
}

// Every kind of bad input gets a 4xx naming its reason, is counted, and
// leaves nothing in the store (not even a temp file).
func TestBadInput(t *testing.T) {
	fx := buildFixture(t, "storebad")
	other := buildFixture(t, "storeother")
	stripped, _ := testfixture.SplitDebug(t, fx.bin, false)
	_, srv, obs, dir := newServer(t, 64<<10)
	full, _ := os.ReadFile(fx.debug)
	big := make([]byte, 100<<10)
	copy(big, full)
	strippedData, _ := os.ReadFile(stripped)

	cases := []struct {
		name, path string
		body       []byte
		status     int
		reason     string
	}{
		{"wrong build id", "/buildid/" + other.id + "/debuginfo", full, 422, ReasonMismatch},
		{"truncated ELF", "/buildid/" + fx.id + "/debuginfo", full[:len(full)/2], 422, ReasonNotELF},
		{"not ELF", "/buildid/" + fx.id + "/debuginfo", []byte("#!/bin/sh\necho hi\n"), 422, ReasonNotELF},
		{"oversized body", "/buildid/" + fx.id + "/debuginfo", big, 413, ReasonTooLarge},
		{"no symbols", "/buildid/" + fx.id + "/debuginfo", strippedData, 422, ReasonNoSymbols},
		{"path-like id", "/buildid/..%2F..%2Fetc%2Fpasswd/debuginfo", full, 400, ReasonInvalidBuildID},
		{"dot-dot id", "/buildid/../debuginfo", full, 400, ReasonInvalidBuildID},
		{"short id", "/buildid/abc/debuginfo", full, 400, ReasonInvalidBuildID},
		{"bad kind", "/buildid/" + fx.id + "/..", full, 400, ReasonInvalidKind},
	}
	if len(strippedData) > 64<<10 {
		t.Fatalf("stripped fixture of %d bytes exceeds the test's limit", len(strippedData))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A raw request: Go's client would clean "..".
			req, _ := http.NewRequest(http.MethodPut, srv.URL+"/x", bytes.NewReader(tc.body))
			req.URL.Opaque = "//" + req.URL.Host + tc.path
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("X-Profsym-Reason") != tc.reason {
				t.Errorf("%d %q (%s); want %d %s", resp.StatusCode, resp.Header.Get("X-Profsym-Reason"), msg, tc.status, tc.reason)
			}
			if obs.get("rejected:"+tc.reason) == 0 {
				t.Errorf("rejection %s not counted: %v", tc.reason, obs.m)
			}
		})
	}
	// A lease token is the store's own: a long one is refused before it
	// could reach a shared lease object.
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/buildid/"+fx.id+"/debuginfo", bytes.NewReader(full))
	req.Header.Set(HeaderLease, strings.Repeat("t", 4096))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 || resp.Header.Get("X-Profsym-Reason") != ReasonBadRequest {
		t.Errorf("long lease token: %v %v", resp, err)
	}
	// The missing query validates too, held leases included.
	if resp, _ := http.Post(srv.URL+PathMissing, "application/json", strings.NewReader(`{"build_ids":["`+fx.id+`"],"held":{"../x":"t"}}`)); resp.StatusCode != 400 {
		t.Errorf("held lease of a path-like id: %d", resp.StatusCode)
	}
	resp, _ := http.Post(srv.URL+PathMissing, "application/json", strings.NewReader(`{"build_ids":["../../etc"]}`))
	if resp.StatusCode != 400 {
		t.Errorf("missing query with a path-like id: %d", resp.StatusCode)
	}
	resp, _ = http.Post(srv.URL+PathMissing, "application/json", strings.NewReader(`{"build_ids":`))
	if resp.StatusCode != 400 {
		t.Errorf("truncated query: %d", resp.StatusCode)
	}
	if files := storedFiles(t, dir); len(files) != 0 {
		t.Errorf("bad input left files: %v", files)
	}
	if obs.get("stored") != 0 {
		t.Errorf("stored %d", obs.get("stored"))
	}
}

// An upload while another client holds the lease is refused with 409; the
// holder's upload goes through; an expired lease is granted again.
func TestLeases(t *testing.T) {
	fx := buildFixture(t, "storelease")
	be, _ := NewDir(t.TempDir())
	s, err := New(context.Background(), Config{Backend: be, Lease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Missing(context.Background(), []string{fx.id}, true)
	b, _ := s.Missing(context.Background(), []string{fx.id}, true)
	if len(a.Upload) != 1 || len(b.Pending) != 1 {
		t.Fatalf("a %+v b %+v", a, b)
	}
	data, _ := os.ReadFile(fx.debug)
	_, err = s.Put(context.Background(), fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), "not-the-lease")
	if re, ok := err.(*RejectError); !ok || re.Status != http.StatusConflict {
		t.Fatalf("put without the lease: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	c, _ := s.Missing(context.Background(), []string{fx.id}, true)
	if len(c.Upload) != 1 || c.Upload[0].Token == a.Upload[0].Token {
		t.Fatalf("expired lease not granted anew: %+v", c)
	}
	if res, err := s.Put(context.Background(), fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), c.Upload[0].Token); err != nil || !res.Stored {
		t.Fatalf("put with the lease: %+v %v", res, err)
	}
}

// The limiter holds a stream to its rate: on a virtual clock, 1 MiB past a
// 64 KiB burst at 1 MiB/s is made to wait one second, exactly.
func TestLimiter(t *testing.T) {
	clk := clock.NewVirtual(time.Unix(1_700_000_000, 0))
	start := clk.Now()
	l := NewLimiter(1<<20, 64<<10).WithClock(clk) // 1 MiB/s
	n, err := io.Copy(io.Discard, l.Reader(context.Background(), bytes.NewReader(make([]byte, 1<<20+64<<10))))
	if err != nil || n != 1<<20+64<<10 {
		t.Fatal(n, err)
	}
	if el := clk.Now().Sub(start); el < time.Second-time.Microsecond || el > time.Second+time.Microsecond {
		t.Errorf("1 MiB past a 64 KiB burst at 1 MiB/s waited %v, want 1s", el)
	}
}

// randomIDs makes n distinct 20-byte ids.
func randomIDs(n int) []string {
	ids := make([]string, n)
	var b [20]byte
	for i := range ids {
		rand.Read(b[:])
		ids[i] = hex.EncodeToString(b[:])
	}
	return ids
}

// BenchmarkMissing: a store holding 10,000 ids answers which of 1,000 ids
// (half stored) it lacks, over HTTP with JSON, as agents ask it. Target:
// under 50 ms per query (ms/query is reported).
func BenchmarkMissing(b *testing.B) {
	dir := b.TempDir()
	be, _ := NewDir(dir)
	stored := randomIDs(10_000)
	for _, id := range stored {
		os.MkdirAll(filepath.Join(dir, "buildid", id), 0o755)
		os.WriteFile(filepath.Join(dir, "buildid", id, "debuginfo"), []byte("x"), 0o644)
	}
	s, err := New(context.Background(), Config{Backend: be})
	if err != nil {
		b.Fatal(err)
	}
	if n, _ := s.Size(); n != 10_000 {
		b.Fatalf("store lists %d ids", n)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	c, _ := NewClient(srv.URL, "", nil)
	query := append(append([]string{}, stored[:500]...), randomIDs(500)...)
	var missing atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		res, err := c.Missing(context.Background(), query)
		if err != nil {
			b.Fatal(err)
		}
		missing.Store(int64(len(res.Upload) + len(res.Pending)))
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/query")
	if missing.Load() != 500 {
		b.Fatalf("%d missing, want 500", missing.Load())
	}
}

// elfutils' debuginfod-find, the reference client, fetches from the store.
func TestDebuginfodFindPeer(t *testing.T) {
	find := testfixture.NeedTool(t, "debuginfod-find")
	fx := buildFixture(t, "storepeer")
	s, srv, _, _ := newServer(t, 0)
	data, _ := os.ReadFile(fx.debug)
	if _, err := s.Put(context.Background(), fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(find, "debuginfo", fx.id)
	cmd.Env = append(os.Environ(), "DEBUGINFOD_URLS="+srv.URL, "DEBUGINFOD_CACHE_PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("debuginfod-find: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(strings.TrimSpace(string(out)))
	if !bytes.Equal(got, data) {
		t.Errorf("debuginfod-find got %d bytes, the store has %d", len(got), len(data))
	}
	cmd = exec.Command(find, "executable", fx.id)
	cmd.Env = append(os.Environ(), "DEBUGINFOD_URLS="+srv.URL, "DEBUGINFOD_CACHE_PATH="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("debuginfod-find executable found %s, the store has none", out)
	}
}

// slowReader hands out its data in small pieces, pausing between them.
type slowReader struct {
	data  []byte
	pause time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	n := copy(p[:min(len(p), 1+len(r.data)/8)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// An upload that outlasts the lease keeps it while its bytes arrive: others
// are told "pending", not given the id too.
func TestLeaseKeptWhileUploading(t *testing.T) {
	fx := buildFixture(t, "storeslow")
	be, _ := NewDir(t.TempDir())
	s, _ := New(context.Background(), Config{Backend: be, Lease: 200 * time.Millisecond})
	a, _ := s.Missing(context.Background(), []string{fx.id}, true)
	data, _ := os.ReadFile(fx.debug)
	done := make(chan error, 1)
	go func() {
		_, err := s.Put(context.Background(), fx.id, "debuginfo", &slowReader{data: data, pause: 60 * time.Millisecond}, int64(len(data)), a.Upload[0].Token)
		done <- err
	}()
	time.Sleep(450 * time.Millisecond) // past the lease, upload still streaming
	b, _ := s.Missing(context.Background(), []string{fx.id}, true)
	if len(b.Pending) != 1 {
		t.Errorf("during a long upload another client got %+v, want pending", b)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Another gateway reads the store with the processor's debuginfod source.
func TestDebuginfodClientReadsStore(t *testing.T) {
	fx := buildFixture(t, "storeclient")
	s, srv, _, _ := newServer(t, 0)
	data, _ := os.ReadFile(fx.debug)
	if _, err := s.Put(context.Background(), fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	c, err := debuginfod.New(debuginfod.Config{URLs: []string{srv.URL}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dbg, err := c.Fetch(context.Background(), fx.id, debuginfod.DebugInfo)
	if err != nil || dbg == "" {
		t.Fatalf("Fetch = %q %v", dbg, err)
	}
	if got, _ := os.ReadFile(dbg); !bytes.Equal(got, data) {
		t.Error("fetched file differs from the stored one")
	}
}

// Uploads beyond MaxUploads at once get 503 (busy), not scratch disk.
func TestUploadsBounded(t *testing.T) {
	a, b := buildFixture(t, "storebusya"), buildFixture(t, "storebusyb")
	be, _ := NewDir(t.TempDir())
	obs := &countObs{}
	s, _ := New(context.Background(), Config{Backend: be, MaxUploads: 1, Observer: obs})
	da, _ := os.ReadFile(a.debug)
	db, _ := os.ReadFile(b.debug)
	done := make(chan error, 1)
	go func() {
		_, err := s.Put(context.Background(), a.id, "debuginfo", &slowReader{data: da, pause: 30 * time.Millisecond}, int64(len(da)), "")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_, err := s.Put(context.Background(), b.id, "debuginfo", bytes.NewReader(db), int64(len(db)), "")
	if re, ok := err.(*RejectError); !ok || re.Status != http.StatusServiceUnavailable || obs.get("rejected:busy") != 1 {
		t.Errorf("second concurrent upload: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r, err := s.Put(context.Background(), b.id, "debuginfo", bytes.NewReader(db), int64(len(db)), ""); err != nil || !r.Stored {
		t.Errorf("after the first finished: %+v %v", r, err)
	}
}

// A holder asking again with its token renews its lease (an agent does
// while it extracts a large file); once someone else holds it, or the
// store has the id, renewing says so.
func TestLeaseRenewal(t *testing.T) {
	fx := buildFixture(t, "storerenew")
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			var be Backend
			if shared {
				srv := testfixture.StartS3(t)
				if !srv.Conditional {
					testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
				}
				s3, err := NewS3(context.Background(), S3Config{Endpoint: srv.Endpoint, Bucket: "renew", AccessKeyID: srv.Access,
					SecretAccessKey: srv.Secret, Insecure: true, CreateBucket: true})
				if err != nil {
					t.Fatal(err)
				}
				be = s3
			} else {
				be, _ = NewDir(t.TempDir())
			}
			s, _ := New(context.Background(), Config{Backend: be, ScratchDir: t.TempDir(), Lease: 300 * time.Millisecond})
			if s.LeasesShared() != shared {
				t.Fatalf("LeasesShared = %v", s.LeasesShared())
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			c, _ := NewClient(srv.URL, "", nil)
			ctx := context.Background()
			a, _ := c.Missing(ctx, []string{fx.id})
			if len(a.Upload) != 1 || a.LeaseSeconds != 0 {
				t.Fatalf("first: %+v", a)
			}
			tok := a.Upload[0].Token
			// Renewed past several lease durations, nobody else gets it.
			for i := 0; i < 4; i++ {
				time.Sleep(150 * time.Millisecond)
				if held, present, err := c.Renew(ctx, fx.id, tok); !held || present || err != nil {
					t.Fatalf("renewal %d: held %v present %v %v", i, held, present, err)
				}
				if b, _ := c.Missing(ctx, []string{fx.id}); len(b.Pending) != 1 {
					t.Fatalf("another client during renewals: %+v", b)
				}
			}
			// Expired and taken: renewal says so.
			time.Sleep(400 * time.Millisecond)
			b, _ := c.Missing(ctx, []string{fx.id})
			if len(b.Upload) != 1 {
				t.Fatalf("after expiry: %+v", b)
			}
			if held, present, _ := c.Renew(ctx, fx.id, tok); held || present {
				t.Errorf("renewed a lease someone else holds: %v %v", held, present)
			}
			if _, err := c.Upload(ctx, fx.id, DebugInfo, fx.debug, b.Upload[0].Token); err != nil {
				t.Fatal(err)
			}
			if held, present, _ := c.Renew(ctx, fx.id, tok); held || !present {
				t.Errorf("after the upload: held %v present %v", held, present)
			}
		})
	}
}

// Leases are keyed by ids agents send: a flood of made-up ids cannot grow
// them past their bound; the ids beyond it are answered pending (ask
// again), and leases are granted again once the old ones expire.
func TestLeasesBounded(t *testing.T) {
	be, _ := NewDir(t.TempDir())
	s, err := New(context.Background(), Config{Backend: be, Lease: 300 * time.Millisecond, MaxQueryIDs: 100})
	if err != nil {
		t.Fatal(err)
	}
	limit := s.maxLeases()
	leased, pending := 0, 0
	queries := 3 * limit / 100
	for q := 0; q < queries; q++ {
		ids := make([]string, 100)
		for i := range ids {
			ids[i] = fmt.Sprintf("%040x", q*100+i+1)
		}
		res, err := s.Missing(context.Background(), ids, true)
		if err != nil {
			t.Fatal(err)
		}
		leased += len(res.Upload)
		pending += len(res.Pending)
	}
	s.mu.Lock()
	held := len(s.leases)
	s.mu.Unlock()
	if held > limit || leased != limit || pending != queries*100-limit {
		t.Fatalf("%d leases held (bound %d), %d granted, %d pending", held, limit, leased, pending)
	}
	time.Sleep(400 * time.Millisecond)
	res, _ := s.Missing(context.Background(), []string{fmt.Sprintf("%040x", 1<<30)}, true)
	if len(res.Upload) != 1 || res.Upload[0].Token == "" {
		t.Fatalf("no lease once the old ones expired: %+v", res)
	}
	s.mu.Lock()
	held = len(s.leases)
	s.mu.Unlock()
	if held != 1 {
		t.Errorf("%d leases held after expiry, want 1", held)
	}
}

// An agent with the token cannot fill the disk or the index: uploads that
// would pass max_objects or max_stored_bytes get 507, are counted, and
// leave nothing behind; what was stored stays served.
func TestStoreCapacity(t *testing.T) {
	a, b, c := buildFixture(t, "storecapa"), buildFixture(t, "storecapb"), buildFixture(t, "storecapc")
	put := func(s *Store, fx fixture) (PutResult, error) {
		d, err := os.ReadFile(fx.debug)
		if err != nil {
			t.Fatal(err)
		}
		return s.Put(context.Background(), fx.id, "debuginfo", bytes.NewReader(d), int64(len(d)), "")
	}
	full := func(err error) bool {
		re, ok := err.(*RejectError)
		return ok && re.Status == http.StatusInsufficientStorage && re.Reason == ReasonStoreFull
	}
	t.Run("objects", func(t *testing.T) {
		dir := t.TempDir()
		be, _ := NewDir(dir)
		obs := &countObs{}
		s, _ := New(context.Background(), Config{Backend: be, MaxObjects: 2, Observer: obs})
		for _, fx := range []fixture{a, b} {
			if r, err := put(s, fx); err != nil || !r.Stored {
				t.Fatalf("%s: %+v %v", fx.id, r, err)
			}
		}
		before := storedFiles(t, dir)
		if _, err := put(s, c); !full(err) || obs.get("rejected:store_full") != 1 {
			t.Fatalf("third object: %v (store_full %d)", err, obs.get("rejected:store_full"))
		}
		if after := storedFiles(t, dir); len(after) != len(before) {
			t.Errorf("a refused upload left files: %v -> %v", before, after)
		}
		if !s.Has(a.id, DebugInfo) || !s.Has(b.id, DebugInfo) {
			t.Error("stored objects lost")
		}
	})
	t.Run("bytes", func(t *testing.T) {
		da, _ := os.ReadFile(a.debug)
		be, _ := NewDir(t.TempDir())
		obs := &countObs{}
		s, _ := New(context.Background(), Config{Backend: be, MaxStoredBytes: int64(len(da)) + 100, Observer: obs})
		if r, err := put(s, a); err != nil || !r.Stored {
			t.Fatalf("first: %+v %v", r, err)
		}
		// Refused on the declared size, before the body is read...
		if _, err := put(s, b); !full(err) {
			t.Fatalf("declared size over the limit: %v", err)
		}
		// ... and on the bytes received when the size is not declared.
		db, _ := os.ReadFile(b.debug)
		if _, err := s.Put(context.Background(), b.id, "debuginfo", bytes.NewReader(db), -1, ""); !full(err) {
			t.Fatalf("undeclared size over the limit: %v", err)
		}
		if n := obs.get("rejected:store_full"); n != 2 {
			t.Errorf("store_full counted %d times, want 2", n)
		}
		if objects, bytes := s.Size(); objects != 1 || bytes != int64(len(da)) {
			t.Errorf("size %d objects, %d bytes", objects, bytes)
		}
	})
}
