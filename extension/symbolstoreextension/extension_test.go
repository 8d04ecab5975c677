package symbolstoreextension

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/bearertokenauthextension"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configauth"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadatatest"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
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

// Listening beyond loopback without auth is allowed but warned about.
func TestWarnsWithoutAuth(t *testing.T) {
	for endpoint, warn := range map[string]bool{
		fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(t)): false,
		fmt.Sprintf("0.0.0.0:%d", testfixture.FreePort(t)):   true,
	} {
		core, logs := observer.New(zap.WarnLevel)
		set := extensiontest.NewNopSettings(NewFactory().Type())
		set.Logger = zap.New(core)
		cfg := createDefaultConfig()
		cfg.ServerConfig.NetAddr.Endpoint = endpoint
		cfg.Storage.Directory = t.TempDir()
		ext, err := newStore(set, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := ext.Start(context.Background(), componenttest.NewNopHost()); err != nil {
			t.Fatal(err)
		}
		ext.Shutdown(context.Background())
		if got := logs.FilterMessageSnippet("without authentication").Len() > 0; got != warn {
			t.Errorf("%s: warned %v, want %v", endpoint, got, warn)
		}
	}
}
