package symbolizationprocessor

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/confmap"

	"github.com/profsym/profsym/internal/testfixture"
)

// A private debuginfod server behind TLS with its own CA and a bearer
// token: reached through debuginfod.http, the collector's confighttp
// settings, written as a user would in YAML.
func TestDebuginfodHTTPClientConfig(t *testing.T) {
	v := buildVariant(t, 7)
	debug, err := os.ReadFile(v.debug)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		if strings.TrimPrefix(r.URL.Path, "/buildid/") != v.id+"/debuginfo" {
			http.NotFound(w, r)
			return
		}
		w.Write(debug)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(t *testing.T, http map[string]any) *Config {
		cfg := createDefaultConfig()
		cm := confmap.NewFromStringMap(map[string]any{
			"debuginfod": map[string]any{"urls": []any{srv.URL}, "http": http},
		})
		if err := cm.Unmarshal(cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	for _, c := range []struct {
		name       string
		http       map[string]any
		wantName   string
		wantReason string
	}{
		{"tls and header", map[string]any{
			"tls":     map[string]any{"ca_file": ca},
			"headers": map[string]any{"Authorization": "Bearer s3cret"},
		}, "hot", ""},
		{"no token", map[string]any{"tls": map[string]any{"ca_file": ca}}, "", "fetch_failed"},
		{"unknown CA", map[string]any{"headers": map[string]any{"Authorization": "Bearer s3cret"}}, "", "fetch_failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			loaded := load(t, c.http)
			h := newHarness(t, func(cfg *Config) {
				dir := cfg.Debuginfod.CacheDir
				cfg.Debuginfod = loaded.Debuginfod
				cfg.Debuginfod.CacheDir = dir
			})
			got := h.run(t, profile(v))
			t.Logf("%s: %+v", c.name, got)
			if got[0].name != c.wantName || got[0].reason != c.wantReason {
				t.Errorf("got %+v, want name %q reason %q", got[0], c.wantName, c.wantReason)
			}
		})
	}
}

// TestDefaultSourcesReadDebuginfodURLs: the processor's default
// configuration (config/default.yaml's: sources and debuginfod.urls unset)
// asks the servers DEBUGINFOD_URLS names, as Debian and Fedora hosts set
// it, so a binary this host only has stripped is named.
func TestDefaultSourcesReadDebuginfodURLs(t *testing.T) {
	v := buildVariant(t, 11)
	srv := testfixture.StartDebuginfod(t, serveDir(t, v), v.id+"/debuginfo")
	t.Cleanup(srv.Stop)
	t.Setenv("DEBUGINFOD_URLS", srv.URL)
	h := newHarness(t, func(c *Config) {
		def := createDefaultConfig()
		c.Sources = def.Sources
		c.Debuginfod.URLs = nil
		c.FetchWait = c.Timeout
	})
	if err := h.p.ConsumeProfiles(context.Background(), profile(v)); err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, h.sink.AllProfiles()[0]); got[0].name != "hot" {
		t.Fatalf("with DEBUGINFOD_URLS=%s and the default sources: %+v", srv.URL, got)
	}
}
