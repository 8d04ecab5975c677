package symstore

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzVerify feeds upload bodies to the store's verification: it must
// answer (accept or refuse with a reason), never panic or hang.
func FuzzVerify(f *testing.F) {
	bin := testfixture.Build(f, testfixture.Spec{Name: "fuzzverify", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=fuzzverify"}})
	data, err := os.ReadFile(extractTo(f, bin))
	if err != nil {
		f.Fatal(err)
	}
	id := testfixture.BuildID(f, bin)
	f.Add(data)
	f.Add(data[:len(data)/3])
	f.Add([]byte("\x7fELF"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "body")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if rerr := Verify(p, id, DebugInfo); rerr != nil && rerr.Reason == "" {
			t.Fatalf("refusal without a reason: %v", rerr)
		}
	})
}

// FuzzMissingQuery feeds query bodies and paths to the handler: every
// request gets an answer (200, a 4xx or 404), never a panic or a 5xx.
func FuzzMissingQuery(f *testing.F) {
	be, err := NewDir(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(context.Background(), Config{Backend: be, MaxQueryIDs: 100})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Add(PathMissing, []byte(`{"build_ids":["00112233445566778899aabbccddeeff00112233"],"lease":true}`))
	f.Add(PathMissing, []byte(`{"build_ids":["../../etc"]}`))
	f.Add("/buildid/..%2F..%2Fetc/debuginfo", []byte(""))
	f.Add("/buildid/0011223344556677/executable", []byte(""))
	f.Add("/gobuildid/676f2f6964/debuginfo", []byte("\x7fELF"))
	f.Add("/gobuildid/..%2F2e2e/debuginfo", []byte(""))
	f.Add(PathMissing, []byte(`{"build_ids":["gobuildid/676f2f6964","gobuildid/2e2e2f2e2e"],"lease":true}`))
	f.Add(PathMissing, []byte(`{"build_ids":["00112233445566778899aabbccddeeff00112233"],"lease":true,"held":{"00112233445566778899aabbccddeeff00112233":"abc","../x":"y"}}`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\r\n?#") {
			return
		}
		if _, err := url.ParseRequestURI(path); err != nil {
			return // not a request line a server would parse
		}
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			req := httptest.NewRequest(method, "http://store"+path, bytes.NewReader(body))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code >= 500 {
				t.Fatalf("%s %q: %d %s", method, path, w.Code, w.Body.String())
			}
		}
	})
}

// FuzzParseKey: whatever a client sends as an id, a key that parses names
// one folder of [0-9a-f] inside its namespace and reads back as itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"00112233445566778899aabbccddeeff00112233", "gobuildid/676f2f6964",
		"gobuildid/2e2e2f2e2e", "buildid/ABCDEF0123", "../../etc", "gobuildid/", "x/y/z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		if strings.Trim(k.ID, "0123456789abcdef") != "" || k.ID == "" {
			t.Fatalf("%q: id %q is not lowercase hex", s, k.ID)
		}
		if k.NS != NSBuildID && k.NS != NSGoBuildID {
			t.Fatalf("%q: namespace %q", s, k.NS)
		}
		if back, err := ParseKey(k.String()); err != nil || back != k {
			t.Fatalf("%q: %v reads back as %v, %v", s, k, back, err)
		}
	})
}
