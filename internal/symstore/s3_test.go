package symstore

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/internal/testfixture"
)

// The S3 backend against a real S3-compatible server (versitygw): uploads
// are verified before they reach the bucket, served back with ranges,
// located in process through the local cache, found again by a second
// store over the same bucket (gateways scaling out), and a wrong secret is
// refused at start.
func TestS3Backend(t *testing.T) {
	srv := testfixture.StartS3(t)
	ctx := context.Background()
	cfg := S3Config{
		Endpoint: srv.Endpoint, Bucket: "symbols", Prefix: "fleet", AccessKeyID: srv.Access,
		SecretAccessKey: srv.Secret, Insecure: true, CreateBucket: true,
	}

	bad := cfg
	bad.SecretAccessKey = "wrong" + srv.Secret
	if _, err := NewS3(ctx, bad); err == nil {
		t.Fatal("a wrong secret was accepted")
	} else if !strings.Contains(err.Error(), "signature") && !strings.Contains(strings.ToLower(err.Error()), "access") {
		t.Logf("wrong secret refused: %v", err)
	}

	be, err := NewS3(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countObs{}
	s, err := New(ctx, Config{Backend: be, ScratchDir: t.TempDir(), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	c, _ := NewClient(hs.URL, "", nil)

	fx := buildFixture(t, "stores3")
	other := buildFixture(t, "stores3other")
	// Refused uploads never reach the bucket.
	if _, err := c.Upload(ctx, other.id, DebugInfo, fx.debug, ""); err == nil {
		t.Fatal("mismatched upload accepted")
	}
	if objs := regularFiles(filepath.Join(srv.Dir, "symbols")); len(objs) != 0 {
		t.Fatalf("bucket holds %v after a refused upload", objs)
	}

	res, err := c.Missing(ctx, []string{fx.id})
	if err != nil || len(res.Upload) != 1 {
		t.Fatalf("Missing = %+v %v", res, err)
	}
	if stored, err := c.Upload(ctx, fx.id, DebugInfo, fx.debug, res.Upload[0].Token); err != nil || !stored {
		t.Fatalf("Upload = %v %v", stored, err)
	}
	want, _ := os.ReadFile(fx.debug)
	req, _ := http.NewRequest("GET", hs.URL+"/buildid/"+fx.id+"/debuginfo", nil)
	req.Header.Set("Range", "bytes=100-199")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, want[100:200]) {
		t.Errorf("range from S3: %d, %d bytes", resp.StatusCode, len(got))
	}
	_, dbg, err := s.Locate(ctx, fx.id)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dbg); !bytes.Equal(b, want) {
		t.Errorf("located copy differs")
	}

	// A second gateway over the same bucket knows the id at start and
	// deduplicates an upload of it.
	s2, err := New(ctx, Config{Backend: be, ScratchDir: t.TempDir(), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Has(fx.id, DebugInfo) {
		t.Error("second store does not list the uploaded id")
	}
	data, _ := os.ReadFile(fx.debug)
	if r, err := s2.Put(ctx, fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), ""); err != nil || r.Stored {
		t.Errorf("second store stored again: %+v %v", r, err)
	}
}

// replicas is two stores (gateway replicas) over one bucket, each behind
// its own HTTP server.
type replicas struct {
	stores [2]*Store
	urls   [2]string
	obs    *countObs
}

func twoReplicas(t *testing.T, srv *testfixture.S3Server, bucket string, lease time.Duration) replicas {
	t.Helper()
	var r replicas
	r.obs = &countObs{}
	for i := range r.stores {
		be, err := NewS3(context.Background(), S3Config{
			Endpoint: srv.Endpoint, Bucket: bucket, AccessKeyID: srv.Access,
			SecretAccessKey: srv.Secret, Insecure: true, CreateBucket: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(context.Background(), Config{Backend: be, ScratchDir: t.TempDir(), Lease: lease, Observer: r.obs, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(s.Handler())
		t.Cleanup(hs.Close)
		r.stores[i], r.urls[i] = s, hs.URL
	}
	return r
}

// agents runs n clients at once on one id, half of them on each replica,
// until the store has it. With cross, each uploads to the other replica
// than the one it asked (a new connection through a Service may reach
// another pod). It returns how many uploads were sent.
func (r replicas) agents(t *testing.T, n int, id, debug string, cross bool) int64 {
	var sent atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		ask, _ := NewClient(r.urls[i%2], "", nil)
		put := ask
		if cross {
			put, _ = NewClient(r.urls[(i+1)%2], "", nil)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				res, err := ask.Missing(context.Background(), []string{id})
				if err != nil {
					t.Error(err)
					return
				}
				if len(res.Upload) == 1 {
					sent.Add(1)
					if _, err := put.Upload(context.Background(), id, DebugInfo, debug, res.Upload[0].Token); err != nil {
						t.Errorf("upload: %v", err)
					}
					return
				}
				if len(res.Pending) == 0 {
					return // stored: deduplicated
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Error("still pending after 20 s")
		}()
	}
	close(start)
	wg.Wait()
	return sent.Load()
}

// regularFiles lists the files under dir.
func regularFiles(dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// Gateway replicas over one bucket share upload leases through it: ten
// agents asking and uploading through either replica send one upload, and
// an expired lease is taken over by one replica only.
func TestS3SharedLeases(t *testing.T) {
	srv := testfixture.StartS3(t)
	if !srv.Conditional {
		testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
	}
	r := twoReplicas(t, srv, "shared", 2*time.Second)
	for _, s := range r.stores {
		if !s.LeasesShared() {
			ok, err := s.Backend().(*S3).Conditional()
			t.Fatalf("leases not shared over versitygw: %v %v", ok, err)
		}
	}
	fx := buildFixture(t, "s3shared")
	if sent := r.agents(t, 10, fx.id, fx.debug, true); sent != 1 {
		t.Errorf("10 agents over 2 replicas sent %d uploads, want 1", sent)
	}
	if r.obs.get("stored") != 1 {
		t.Errorf("stored %d times", r.obs.get("stored"))
	}
	if objs := regularFiles(filepath.Join(srv.Dir, "shared", "buildid")); len(objs) != 1 {
		t.Errorf("bucket holds %v", objs)
	}
	if leases := regularFiles(filepath.Join(srv.Dir, "shared", "leases")); len(leases) != 0 {
		t.Errorf("leases left after the upload: %v", leases)
	}

	// Expiry: A leases, B is told pending; once expired B takes it over,
	// and A's holder is refused.
	r = twoReplicas(t, srv, "expiry", 300*time.Millisecond)
	fx2 := buildFixture(t, "s3expiry")
	ctx := context.Background()
	a, err := r.stores[0].Missing(ctx, []string{fx2.id}, true)
	if err != nil || len(a.Upload) != 1 {
		t.Fatalf("A: %+v %v", a, err)
	}
	if b, _ := r.stores[1].Missing(ctx, []string{fx2.id}, true); len(b.Pending) != 1 {
		t.Fatalf("B while A's lease holds: %+v", b)
	}
	time.Sleep(400 * time.Millisecond)
	b, _ := r.stores[1].Missing(ctx, []string{fx2.id}, true)
	if len(b.Upload) != 1 || b.Upload[0].Token == a.Upload[0].Token {
		t.Fatalf("B after expiry: %+v", b)
	}
	if again, _ := r.stores[0].Missing(ctx, []string{fx2.id}, true); len(again.Pending) != 1 {
		t.Errorf("A after B took over: %+v", again)
	}
	data, _ := os.ReadFile(fx2.debug)
	if _, err := r.stores[0].Put(ctx, fx2.id, "debuginfo", bytes.NewReader(data), int64(len(data)), a.Upload[0].Token); err == nil {
		t.Error("the expired lease's holder stored")
	} else if re, ok := err.(*RejectError); !ok || re.Status != http.StatusConflict {
		t.Errorf("expired holder: %v", err)
	}
	if res, err := r.stores[0].Put(ctx, fx2.id, "debuginfo", bytes.NewReader(data), int64(len(data)), b.Upload[0].Token); err != nil || !res.Stored {
		t.Errorf("B's holder through A: %+v %v", res, err)
	}
}

// staleStat is an S3 backend whose first Stat answers "absent" only after
// running before: the moment between a replica's look in the bucket and
// its lease request, where another replica's upload can end.
type staleStat struct {
	*S3
	once   sync.Once
	before func()
}

func (b *staleStat) Stat(ctx context.Context, key Key, kind Kind) (int64, error) {
	stale := false
	b.once.Do(func() { b.before(); stale = true })
	if stale {
		return 0, fs.ErrNotExist
	}
	return b.S3.Stat(ctx, key, kind)
}

// A replica that looked in the bucket before another one stored the file
// and released its lease gets the lease, and must then find the file
// rather than tell its agent to upload it again (the third upload of
// TestS3SharedLeases in a loaded CI run).
func TestS3LeaseAfterStoreAndRelease(t *testing.T) {
	srv := testfixture.StartS3(t)
	if !srv.Conditional {
		testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
	}
	ctx := context.Background()
	fx := buildFixture(t, "s3stale")
	data, err := os.ReadFile(fx.debug)
	if err != nil {
		t.Fatal(err)
	}
	var stores [2]*Store
	var backB *staleStat
	for i := range stores {
		be, err := NewS3(ctx, S3Config{
			Endpoint: srv.Endpoint, Bucket: "stale", AccessKeyID: srv.Access,
			SecretAccessKey: srv.Secret, Insecure: true, CreateBucket: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		var backend Backend = be
		if i == 1 {
			backB = &staleStat{S3: be}
			backend = backB
		}
		if stores[i], err = New(ctx, Config{
			Backend: backend, ScratchDir: t.TempDir(), Lease: 5 * time.Second,
			Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := stores[0].Missing(ctx, []string{fx.id}, true)
	if err != nil || len(a.Upload) != 1 {
		t.Fatalf("A: %+v %v", a, err)
	}
	backB.before = func() {
		if res, err := stores[0].Put(ctx, fx.id, "debuginfo", bytes.NewReader(data), int64(len(data)), a.Upload[0].Token); err != nil || !res.Stored {
			t.Errorf("A's upload: %+v %v", res, err)
		}
	}
	b, err := stores[1].Missing(ctx, []string{fx.id}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Upload) != 0 || len(b.Pending) != 0 {
		t.Errorf("B after A stored and released: %+v, want the id known", b)
	}
	if leases := regularFiles(filepath.Join(srv.Dir, "stale", "leases")); len(leases) != 0 {
		t.Errorf("B kept the lease it took: %v", leases)
	}
}

// A server without conditional writes (versitygw without its metadata
// store ignores If-None-Match) is found at start; leases stay per replica
// and uploads still end with one object in the bucket.
func TestS3WithoutConditionalWrites(t *testing.T) {
	srv := testfixture.StartS3With(t, testfixture.S3Options{NoMeta: true})
	r := twoReplicas(t, srv, "plain", 2*time.Second)
	for _, s := range r.stores {
		if s.LeasesShared() {
			t.Fatal("leases shared over a server that ignores If-None-Match")
		}
	}
	if _, err := r.stores[0].Backend().(*S3).Conditional(); err == nil || !strings.Contains(err.Error(), "ignored") {
		t.Errorf("probe: %v", err)
	}
	fx := buildFixture(t, "s3plain")
	sent := r.agents(t, 10, fx.id, fx.debug, false)
	t.Logf("without shared leases: %d uploads sent for one id over 2 replicas", sent)
	if sent < 1 || sent > 2 {
		t.Errorf("%d uploads sent, want 1 or 2 (one lease per replica)", sent)
	}
	if objs := regularFiles(filepath.Join(srv.Dir, "plain", "buildid")); len(objs) != 1 {
		t.Errorf("bucket holds %v", objs)
	}
	if probes := regularFiles(filepath.Join(srv.Dir, "plain", "leases")); len(probes) != 0 {
		t.Errorf("probe objects left: %v", probes)
	}
}
