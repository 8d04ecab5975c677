package symbolstoreextension

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/bearertokenauthextension"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configauth"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadatatest"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

type host struct {
	component.Host
	ext map[component.ID]component.Component
}

func (h host) GetExtensions() map[component.ID]component.Component { return h.ext }

// startWithToken runs the store behind contrib's bearertokenauth, as
// config/symbols-auth-gateway.yaml configures it.
func startWithToken(t *testing.T, token string) (*Store, string, *componenttest.Telemetry, string) {
	t.Helper()
	authID := component.MustNewIDWithName("bearertokenauth", "symbols")
	af := bearertokenauthextension.NewFactory()
	acfg := af.CreateDefaultConfig().(*bearertokenauthextension.Config)
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(token+"\n"), 0o600)
	acfg.Filename = tokFile
	auth, err := af.Create(context.Background(), extensiontest.NewNopSettings(af.Type()), acfg)
	if err != nil {
		t.Fatal(err)
	}
	h := host{Host: componenttest.NewNopHost(), ext: map[component.ID]component.Component{authID: auth}}
	if err := auth.Start(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { auth.Shutdown(context.Background()) })

	dir := t.TempDir()
	cfg := createDefaultConfig()
	cfg.ServerConfig.NetAddr.Endpoint = fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(t))
	cfg.ServerConfig.Auth = configoptional.Some(confighttp.AuthConfig{Config: configauth.Config{AuthenticatorID: authID}})
	cfg.Storage.Directory = dir
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { tt.Shutdown(context.Background()) })
	ext, err := newStore(metadatatest.NewSettings(tt), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ext.Start(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ext.Shutdown(context.Background()) })
	return ext, "http://" + cfg.ServerConfig.NetAddr.Endpoint, tt, dir
}

func debugFile(t *testing.T) (id, path string) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "extstore", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=extstore"}})
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	path = filepath.Join(t.TempDir(), "debuginfo")
	w, _ := os.Create(path)
	defer w.Close()
	if _, err := keepdebug.Write(f, w, keepdebug.Zstd); err != nil {
		t.Fatal(err)
	}
	return testfixture.BuildID(t, bin), path
}

// A wrong or missing token gets 401, is counted as unauthorized, and
// writes nothing; the right token uploads, and the processor's in-process
// Locate finds the file.
func TestAuthAndLocate(t *testing.T) {
	ext, url, tt, dir := startWithToken(t, "s3cr3t-token")
	id, path := debugFile(t)
	data, _ := os.ReadFile(path)
	for _, tok := range []string{"", "Bearer wrong", "Bearer s3cr3t-token-but-longer"} {
		req, _ := http.NewRequest(http.MethodPut, url+"/buildid/"+id+"/debuginfo", bytes.NewReader(data))
		if tok != "" {
			req.Header.Set("Authorization", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, resp.StatusCode)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "buildid")); len(ents) != 0 {
		t.Fatalf("unauthorized uploads wrote %d entries", len(ents))
	}
	metadatatest.AssertEqualSymbolstoreUploadsRejected(t, tt, []metricdata.DataPoint[int64]{
		{Value: 3, Attributes: attribute.NewSet(attribute.String("reason", "unauthorized"))},
	}, metricdatatest.IgnoreTimestamp())

	c, _ := symstore.NewClient(url, "s3cr3t-token", nil)
	if stored, err := c.Upload(context.Background(), id, symstore.DebugInfo, path, ""); err != nil || !stored {
		t.Fatalf("authorized upload: %v %v", stored, err)
	}
	if _, dbg, err := ext.Locate(context.Background(), id); err != nil || dbg == "" {
		t.Fatalf("Locate: %q %v", dbg, err)
	}
	metadatatest.AssertEqualSymbolstoreFiles(t, tt, []metricdata.DataPoint[int64]{{Value: 1}}, metricdatatest.IgnoreTimestamp())
}

// Listening beyond loopback without auth, the store serves reads and
// refuses writes (uploads and the missing query that hands out leases)
// with 401, unless allow_unauthenticated_uploads; both are warned about.
// On loopback only local processes reach it, and it takes uploads.
func TestUnauthenticatedWrites(t *testing.T) {
	id, path := debugFile(t)
	for _, tc := range []struct {
		name        string
		host        string
		allow, warn bool
		wantUpload  int
	}{
		{"loopback", "127.0.0.1", false, false, http.StatusCreated},
		{"beyond-loopback", "0.0.0.0", false, true, http.StatusUnauthorized},
		{"beyond-loopback-allowed", "0.0.0.0", true, true, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			tt := componenttest.NewTelemetry()
			t.Cleanup(func() { tt.Shutdown(context.Background()) })
			set := metadatatest.NewSettings(tt)
			set.Logger = zap.New(core)
			cfg := createDefaultConfig()
			port := testfixture.FreePort(t)
			cfg.ServerConfig.NetAddr.Endpoint = fmt.Sprintf("%s:%d", tc.host, port)
			cfg.Storage.Directory = t.TempDir()
			cfg.AllowUnauthenticatedUploads = tc.allow
			ext, err := newStore(set, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := ext.Start(context.Background(), componenttest.NewNopHost()); err != nil {
				t.Fatal(err)
			}
			defer ext.Shutdown(context.Background())
			if got := logs.FilterMessageSnippet("without authentication").Len() > 0; got != tc.warn {
				t.Errorf("warned %v, want %v", got, tc.warn)
			}
			url := fmt.Sprintf("http://127.0.0.1:%d", port)
			data, _ := os.ReadFile(path)
			do := func(method, p string, body []byte) int {
				req, _ := http.NewRequest(method, url+p, bytes.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if tc.wantUpload == http.StatusUnauthorized {
				if got := do(http.MethodPost, symstore.PathMissing, []byte(`{"build_ids":["`+id+`"],"lease":true}`)); got != http.StatusUnauthorized {
					t.Errorf("missing query with lease: %d, want 401", got)
				}
				// Index leases and index bodies are writes too.
				if got := do(http.MethodPost, symstore.PathMissing, []byte(`{"build_ids":["`+id+`"],"lease":true,"kind":"symindex"}`)); got != http.StatusUnauthorized {
					t.Errorf("index lease query: %d, want 401", got)
				}
				if got := do(http.MethodPut, symstore.PathIndex+"/"+id, []byte("PSYMIDX\x00")); got != http.StatusUnauthorized {
					t.Errorf("index upload: %d, want 401", got)
				}
			}
			// Index reads are served as the debuginfod reads are.
			if got := do(http.MethodGet, symstore.PathIndex+"/"+id, nil); got != http.StatusNotFound {
				t.Errorf("index read: %d, want 404", got)
			}
			if got := do(http.MethodPut, "/buildid/"+id+"/debuginfo", data); got != tc.wantUpload {
				t.Errorf("upload: %d, want %d", got, tc.wantUpload)
			}
			// Reads are served either way.
			wantRead := http.StatusNotFound
			if tc.wantUpload == http.StatusCreated {
				wantRead = http.StatusOK
			}
			if got := do(http.MethodGet, "/buildid/"+id+"/debuginfo", nil); got != wantRead {
				t.Errorf("read: %d, want %d", got, wantRead)
			}
			if tc.wantUpload == http.StatusUnauthorized {
				metadatatest.AssertEqualSymbolstoreUploadsRejected(t, tt, []metricdata.DataPoint[int64]{
					{Value: 4, Attributes: attribute.NewSet(attribute.String("reason", "unauthorized"))},
				}, metricdatatest.IgnoreTimestamp())
			}
		})
	}
}

// goDebugFile is the extracted symbols of a Go binary linked without a GNU
// build id (Go before 1.24, or -ldflags=-B=none), and its Go build id.
func goDebugFile(t *testing.T) (goID, path string) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "extgo", Lang: "go", Sources: []string{"sampler/gohot"},
		Args: []string{"-ldflags=-B=none -X main.fixture=extgo"}})
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if goID, err = buildid.Go(f); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "debuginfo")
	w, _ := os.Create(path)
	defer w.Close()
	if _, err := keepdebug.Write(f, w, keepdebug.Zstd); err != nil {
		t.Fatal(err)
	}
	return goID, path
}

// find asks the store's locate source for an identity.
func find(t *testing.T, ext *Store, id frame.Identity) ([]locate.Candidate, error) {
	t.Helper()
	return ext.SymbolSource().Find(context.Background(), &locate.Query{ID: id})
}

// The processor's locate source finds uploads by GNU build id and, for Go
// binaries without one, by Go build id.
func TestSymbolSourceByGoBuildID(t *testing.T) {
	ext, url, _, _ := startWithToken(t, "tok")
	id, path := debugFile(t)
	goID, goPath := goDebugFile(t)
	goKey, _ := symstore.GoKey(goID)
	c, _ := symstore.NewClient(url, "tok", nil)
	for k, p := range map[string]string{id: path, goKey.String(): goPath} {
		if stored, err := c.Upload(context.Background(), k, symstore.DebugInfo, p, ""); err != nil || !stored {
			t.Fatalf("upload %s: %v %v", k, stored, err)
		}
	}
	for _, q := range []frame.Identity{{GNU: id}, {Go: goID, HTL: "00112233445566778899aabbccddeeff"}} {
		cands, err := find(t, ext, q)
		if err != nil || len(cands) != 1 {
			t.Fatalf("%+v: %v %v", q, cands, err)
		}
		f, err := elfx.Open(cands[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		if got := buildid.Identify(f); !q.MatchesDebug(got) {
			t.Errorf("%+v: found a file of %+v", q, got)
		}
		f.Close()
	}
	if cands, err := find(t, ext, frame.Identity{Go: goID + "x"}); err != nil || len(cands) != 0 {
		t.Errorf("unknown Go build id: %v %v", cands, err)
	}
}

// A gateway reads a store another collector owns, over HTTP with the
// token: files uploaded to the owner are found, and the owner's new files
// move this store's generation within a rescan, so frames that failed
// before are retried.
func TestRemoteStore(t *testing.T) {
	_, url, _, _ := startWithToken(t, "tok")
	remote := func(token string) *Store {
		authID := component.MustNewIDWithName("bearertokenauth", "client")
		af := bearertokenauthextension.NewFactory()
		acfg := af.CreateDefaultConfig().(*bearertokenauthextension.Config)
		acfg.BearerToken = configopaque.String(token)
		auth, err := af.Create(context.Background(), extensiontest.NewNopSettings(af.Type()), acfg)
		if err != nil {
			t.Fatal(err)
		}
		h := host{Host: componenttest.NewNopHost(), ext: map[component.ID]component.Component{authID: auth}}
		auth.Start(context.Background(), h)
		t.Cleanup(func() { auth.Shutdown(context.Background()) })
		cfg := createDefaultConfig()
		cfg.ServerConfig.NetAddr.Endpoint = "" // nothing served in remote mode
		cfg.Storage.Remote.ClientConfig.Endpoint = url
		cfg.Storage.Remote.ClientConfig.Auth = configoptional.Some(configauth.Config{AuthenticatorID: authID})
		cfg.Storage.ScratchDirectory = t.TempDir()
		cfg.Storage.Rescan = 200 * time.Millisecond
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		ext, err := newStore(extensiontest.NewNopSettings(NewFactory().Type()), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := ext.Start(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ext.Shutdown(context.Background()) })
		return ext
	}
	gw, bad := remote("tok"), remote("wrong")
	id, path := debugFile(t)
	if cands, err := find(t, gw, frame.Identity{GNU: id}); err != nil || len(cands) != 0 {
		t.Fatalf("before the upload: %v %v", cands, err)
	}
	gen := gw.Generation()
	c, _ := symstore.NewClient(url, "tok", nil)
	if stored, err := c.Upload(context.Background(), id, symstore.DebugInfo, path, ""); err != nil || !stored {
		t.Fatalf("upload to the owner: %v %v", stored, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gw.Generation() == gen && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if gw.Generation() == gen {
		t.Error("the remote store's generation did not move after the owner stored a file")
	}
	cands, err := find(t, gw, frame.Identity{GNU: id})
	if err != nil || len(cands) != 1 {
		t.Fatalf("after the upload: %v %v", cands, err)
	}
	want, _ := os.ReadFile(path)
	if got, _ := os.ReadFile(cands[0].Path); !bytes.Equal(got, want) {
		t.Error("local copy differs from the owner's file")
	}
	// A wrong token is a failure to fetch, not an absence to remember.
	if _, err := find(t, bad, frame.Identity{GNU: id}); !errors.Is(err, frame.ErrFetchFailed) {
		t.Errorf("wrong token: %v, want fetch_failed", err)
	}

	// Symbol indexes go through the owner with the same token; a wrong
	// token gets no lease.
	held, release, err := gw.LeaseIndex(context.Background(), id)
	if err != nil || !held {
		t.Fatalf("LeaseIndex with the token: %v %v", held, err)
	}
	defer release()
	if h, r, err := bad.LeaseIndex(context.Background(), id); err == nil || h {
		t.Errorf("LeaseIndex with a wrong token: %v %v", h, err)
	} else {
		r()
	}
	idx := append([]byte("PSYMIDX\x00"), bytes.Repeat([]byte("i"), 1000)...)
	ip := filepath.Join(t.TempDir(), "idx")
	os.WriteFile(ip, idx, 0o600)
	if err := gw.PutIndex(context.Background(), id, ip); err != nil {
		t.Fatalf("PutIndex with the token: %v", err)
	}
	release()
	if _, err := bad.LocateIndex(context.Background(), id); errors.Is(err, frame.ErrNotFound) || err == nil {
		t.Errorf("LocateIndex with a wrong token: %v, want a fetch failure", err)
	}
	gw2 := remote("tok")
	p, err := gw2.LocateIndex(context.Background(), id)
	if err != nil {
		t.Fatalf("another gateway's LocateIndex: %v", err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, idx) {
		t.Error("another gateway reads a different index")
	}
}
