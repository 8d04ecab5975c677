package symstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

func TestParseKey(t *testing.T) {
	gnu := "00112233445566778899AABBCCDDEEFF00112233"
	goID := "abc_DEF-123/xyz/uvw/rst"
	for _, tc := range []struct {
		in   string
		want Key
	}{
		{gnu, Key{NSBuildID, strings.ToLower(gnu)}},
		{"buildid/" + gnu, Key{NSBuildID, strings.ToLower(gnu)}},
		{"gobuildid/" + hex.EncodeToString([]byte(goID)), Key{NSGoBuildID, hex.EncodeToString([]byte(goID))}},
		{"gobuildid/" + strings.ToUpper(hex.EncodeToString([]byte(goID))), Key{NSGoBuildID, hex.EncodeToString([]byte(goID))}},
	} {
		if k, err := ParseKey(tc.in); err != nil || k != tc.want {
			t.Errorf("ParseKey(%q) = %v, %v; want %v", tc.in, k, err, tc.want)
		}
	}
	if k, _ := GoKey(goID); k.GoBuildID() != goID || k.String() != "gobuildid/"+hex.EncodeToString([]byte(goID)) {
		t.Errorf("GoKey round trip: %v %q", k, k.GoBuildID())
	}
	for _, bad := range []string{
		"", "../../etc", "buildid/../x", "gobuildid/..", "gobuildid/2e2e2f2e2e2f", // "../../" is not a Go build id
		"gobuildid/zz", "gobuildid/" + strings.Repeat("61", MaxGoKeyBytes+1), "source/0011223344556677",
		"gobuildid/" + hex.EncodeToString([]byte("a//b")), "gobuildid/" + hex.EncodeToString([]byte("a b")),
	} {
		if k, err := ParseKey(bad); err == nil || !errors.Is(err, frame.ErrInvalidBuildID) {
			t.Errorf("ParseKey(%q) = %v, %v; want invalid_build_id", bad, k, err)
		}
	}
}

// goFixture is a Go binary with a Go build id and no GNU build id: what Go
// before 1.24 links by default (internal linker), and Go 1.24+ with
// -ldflags=-B=none.
func goFixture(t *testing.T, name string) (bin, goID string) {
	t.Helper()
	bin = testfixture.Build(t, testfixture.Spec{Name: name, Lang: "go", Sources: []string{"sampler/gohot"},
		Args: []string{"-ldflags=-B=none -X main.fixture=" + name}})
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if id, err := buildid.GNU(f); err == nil {
		t.Fatalf("%s has a GNU build id %x; the test needs one without", bin, id)
	}
	if goID, err = buildid.Go(f); err != nil {
		t.Fatal(err)
	}
	return bin, goID
}

// A Go binary without a GNU build id is stored, verified and served by its
// Go build id under its own namespace, next to GNU ids and never mixed with
// them; bad Go keys are refused before anything is written.
func TestGoBuildIDKeys(t *testing.T) {
	bin, goID := goFixture(t, "storegokey")
	other, otherID := goFixture(t, "storegokeyother")
	key, err := GoKey(goID)
	if err != nil {
		t.Fatal(err)
	}
	s, srv, obs, dir := newServer(t, 0)
	c, _ := NewClient(srv.URL, "", nil)
	ctx := context.Background()
	dbg := extractTo(t, bin)

	res, err := c.Missing(ctx, []string{key.String()})
	if err != nil || len(res.Upload) != 1 || res.Upload[0].BuildID != key.String() {
		t.Fatalf("Missing = %+v, %v", res, err)
	}
	// The other binary's debuginfo under this key: refused by its Go note.
	if _, err := c.Upload(ctx, key.String(), DebugInfo, extractTo(t, other), res.Upload[0].Token); err == nil || !strings.Contains(err.Error(), ReasonMismatch) {
		t.Fatalf("upload of another Go build: %v", err)
	}
	if stored, err := c.Upload(ctx, key.String(), DebugInfo, dbg, res.Upload[0].Token); err != nil || !stored {
		t.Fatalf("Upload = %v, %v", stored, err)
	}
	if !s.Has(key.String(), DebugInfo) || s.Has(mustKey(t, otherID).String(), DebugInfo) {
		t.Error("index after upload")
	}
	if _, err := os.Stat(filepath.Join(dir, "gobuildid", key.ID, "debuginfo")); err != nil {
		t.Errorf("not under gobuildid/: %v", err)
	}
	want, _ := os.ReadFile(dbg)
	resp, err := http.Get(srv.URL + "/gobuildid/" + key.ID + "/debuginfo")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, want) {
		t.Errorf("GET by Go build id: %d, %d bytes", resp.StatusCode, len(got))
	}
	// The same hex under the debuginfod namespace is another key (and, at
	// over 64 bytes, not a GNU build id at all).
	if r, _ := http.Get(srv.URL + "/buildid/" + key.ID + "/debuginfo"); r.StatusCode == 200 {
		t.Errorf("a Go key served under /buildid/")
	}
	_, p, err := s.LocateKey(ctx, key)
	if err != nil || p == "" {
		t.Fatalf("LocateKey = %q %v", p, err)
	}
	f, err := elfx.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if id := buildid.Identify(f); id.Go != goID || id.GNU != "" {
		t.Errorf("located file identifies as %+v", id)
	}
	f.Close()

	before := storedFiles(t, dir)
	for _, path := range []string{
		"/gobuildid/..%2F..%2Fetc/debuginfo", "/gobuildid/2e2e2f2e2e/debuginfo",
		"/gobuildid/" + strings.Repeat("61", MaxGoKeyBytes+1) + "/debuginfo", "/gobuildid/" + otherID + "/debuginfo",
	} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/x", bytes.NewReader(want))
		req.URL.Opaque = "//" + req.URL.Host + path
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 || resp.Header.Get("X-Profsym-Reason") != ReasonInvalidBuildID {
			t.Errorf("PUT %s: %d %s", path, resp.StatusCode, resp.Header.Get("X-Profsym-Reason"))
		}
	}
	if after := storedFiles(t, dir); len(after) != len(before) {
		t.Errorf("bad keys left files: %v", after)
	}
	if obs.get("stored") != 1 {
		t.Errorf("stored %d", obs.get("stored"))
	}

	// A restarted store lists both namespaces.
	be, _ := NewDir(dir)
	s2, err := New(ctx, Config{Backend: be})
	if err != nil || !s2.Has(key.String(), DebugInfo) {
		t.Errorf("relisted store lacks the Go key: %v", err)
	}
}

func mustKey(t *testing.T, goID string) Key {
	k, err := GoKey(goID)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
