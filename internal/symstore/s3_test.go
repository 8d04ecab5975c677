package symstore

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

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
	cfg := S3Config{Endpoint: srv.Endpoint, Bucket: "symbols", Prefix: "fleet", AccessKeyID: srv.Access,
		SecretAccessKey: srv.Secret, Insecure: true, CreateBucket: true}

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
	if ents, _ := os.ReadDir(srv.Dir + "/symbols"); len(ents) != 0 {
		t.Fatalf("bucket holds %d entries after a refused upload", len(ents))
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
