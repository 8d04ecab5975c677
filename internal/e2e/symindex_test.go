package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestGatewayReplicasParseOnce is issue 32's "each binary's debug info
// parsed once per fleet": four gateway collectors built from the
// distribution get, at once and then again, the same profile of a binary
// whose debug file was uploaded to their store. One of them parses it and
// writes its symbol index into the store; the other three wait for the
// index and read it. Counted from the collectors' own Prometheus
// self-metrics; every gateway's output names the frame.
//
// s3: the gateways run the store over one bucket of a real S3-compatible
// server (config/symbols-s3.yaml). remote: the Helm chart's default, a
// store collector of its own (config/symbols-store.yaml) that the gateways
// read and write over HTTP (config/symbols-remote.yaml), with its token.
func TestGatewayReplicasParseOnce(t *testing.T) {
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	t.Run("s3", func(t *testing.T) {
		srv := testfixture.StartS3(t)
		if !srv.Conditional {
			testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
		}
		work := t.TempDir()
		runReplicas(t, work, "e2eidxs3", "", func(name string) gateway {
			return startGateway(t, root, bin, work, name, srv)
		}, 0)
	})
	t.Run("remote", func(t *testing.T) {
		work := t.TempDir()
		token := "e2e-index-token-remote" //nolint:gosec // a test's own token
		_, symPort, remoteGateway := storeAndGateways(t, root, bin, work, token)
		runReplicas(t, work, "e2eidxrem", token, remoteGateway, symPort)
		// The index is the store's, on its disk, next to the debug file.
		if ents, _ := filepath.Glob(filepath.Join(work, "store", "buildid", "*", "symindex")); len(ents) != 1 {
			t.Errorf("the store holds %d indexes, want 1", len(ents))
		}
	})
	// From CI: profsym upload --index stores the debug file and its index;
	// no gateway parses anything.
	t.Run("ci-upload", func(t *testing.T) {
		cli := filepath.Join(root, "_build", "profsym")
		if _, err := os.Stat(cli); err != nil {
			testfixture.SkipOrFail(t, "%s is not built: run make build (make test does)", cli)
		}
		work := t.TempDir()
		token := "e2e-index-token-ci" //nolint:gosec // a test's own token
		tokenFile := filepath.Join(work, "token")
		os.WriteFile(tokenFile, []byte(token), 0o600)
		symURL, _, remoteGateway := storeAndGateways(t, root, bin, work, token)
		runReplicasWith(t, work, "e2eidxci", remoteGateway, func(ctx context.Context, _ []gateway, private, id string) {
			out, err := exec.CommandContext(ctx, cli, "upload", "--index", "--endpoint", symURL, "--token-file", tokenFile, private).CombinedOutput()
			if err != nil {
				t.Fatalf("profsym upload --index: %v\n%s", err, out)
			}
			t.Logf("profsym upload --index:\n%s", out)
			if !strings.Contains(string(out), "uploaded "+id) || !strings.Contains(string(out), "index of "+id+" stored") {
				t.Fatalf("profsym upload --index did not store both the debug file and the index")
			}
		}, true)
	})
}

// storeAndGateways starts a symbol store collector of its own
// (config/symbols-store.yaml, with token), as the Helm chart's StatefulSet
// runs it, and returns its URL, its port and a starter of gateways that
// read and write it over HTTP (config/symbols-remote.yaml).
func storeAndGateways(t *testing.T, root, bin, work, token string) (string, int, func(name string) gateway) {
	t.Helper()
	symPort := testfixture.FreePort(t)
	startCollector(t, bin, "symbol store", []string{
		fmt.Sprintf("PROFSYM_SYMBOLS_LISTEN=127.0.0.1:%d", symPort),
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, "store"),
		"PROFSYM_SYMBOLS_TOKEN=" + token,
	}, filepath.Join(root, "config", "symbols-store.yaml"), filepath.Join(root, "config", "symbols-auth-gateway.yaml"))
	symURL := fmt.Sprintf("http://127.0.0.1:%d", symPort)
	return symURL, symPort, func(name string) gateway {
		return startGatewayWith(t, bin, work, name, []string{"PROFSYM_SYMBOLS_ENDPOINT=" + symURL, "PROFSYM_SYMBOLS_TOKEN=" + token},
			filepath.Join(root, "config", "gateway.yaml"), filepath.Join(root, "config", "symbols-auth-gateway.yaml"),
			filepath.Join(root, "config", "symbols-remote.yaml"))
	}
}

// runReplicas starts four gateways with start, uploads a fresh binary's
// debug file to the store (at storePort, else the first gateway's) and
// checks the parse-once counts.
func runReplicas(t *testing.T, work, name, token string, start func(name string) gateway, storePort int) {
	runReplicasWith(t, work, name, start, func(ctx context.Context, gws []gateway, private, id string) {
		// The build's debug file reaches the store as an agent's upload would.
		if storePort == 0 {
			storePort = gws[0].symbols
		}
		cl, err := symstore.NewClient(fmt.Sprintf("http://127.0.0.1:%d", storePort), token, nil)
		if err != nil {
			t.Fatal(err)
		}
		miss, err := cl.Missing(ctx, []string{id})
		if err != nil || len(miss.Upload) != 1 {
			t.Fatalf("missing query: %+v, %v", miss, err)
		}
		if stored, err := cl.Upload(ctx, id, symstore.DebugInfo, private, miss.Upload[0].Token); err != nil || !stored {
			t.Fatalf("upload: stored %v, %v", stored, err)
		}
	}, false)
}

// runReplicasWith starts four gateways with start, has upload put a fresh
// binary's symbols into their store, sends them its profile and checks the
// counts: parsed once and indexed once by a gateway, or (ciIndexed: the
// upload brought the index) parsed by none.
func runReplicasWith(t *testing.T, work, name string, start func(name string) gateway,
	upload func(ctx context.Context, gws []gateway, private, id string), ciIndexed bool,
) {
	const replicas = 4
	private := testfixture.Build(t, testfixture.Spec{
		Name: name, Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=" + name},
	})
	id := testfixture.BuildID(t, private)
	fn := "spin_" + name
	spin, _ := testfixture.Func(t, private, fn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var gws []gateway
	for i := range replicas {
		gws = append(gws, start(fmt.Sprintf("replica-%d", i)))
	}
	defer func() {
		for _, g := range gws {
			g.c.stop(t)
			if t.Failed() {
				t.Logf("%s log:\n%s", g.c.name, g.c.log.String())
			}
		}
	}()

	upload(ctx, gws, private, id)

	// The same profile to every replica at once, then again every half
	// second until each has written the frame named.
	send := func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", g.otlp), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				pd := profileMapping(1, private, id)
				pd.Dictionary().LocationTable().At(1).SetAddress(spin + 4)
				if _, err := pprofileotlp.NewGRPCClient(conn).Export(ctx, pprofileotlp.NewExportRequestFromProfiles(pd)); err != nil {
					t.Errorf("%s: %v", g.c.name, err)
				}
			}()
		}
		wg.Wait()
	}
	named := func(g gateway) bool {
		b, _ := os.ReadFile(filepath.Join(work, g.c.name, "profiles.json"))
		return strings.Contains(string(b), `"`+fn+`"`) && strings.Contains(string(b), "e2e/hot.c")
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		send()
		all := true
		for _, g := range gws {
			all = all && named(g)
		}
		if all || time.Now().After(deadline) || t.Failed() {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// A builder counts its index once PutIndex has returned, which may be
	// after the others have read it: the counters settle within seconds.
	var parsed, opened, written, failed, refused float64
	for settle := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		parsed, opened, written, failed, refused = 0, 0, 0, 0, 0
		for _, g := range gws {
			m := promMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", g.prom))
			parsed += metric(m, "symbolization_objects_parsed")
			opened += metric(m, "symbolization_index_opened")
			written += metric(m, "symbolization_index_written")
			failed += metric(m, "symbolization_index_failed")
			refused += metric(m, "symbolization_index_refused")
		}
		if written >= 1 || ciIndexed || time.Now().After(settle) {
			break
		}
	}
	for _, g := range gws {
		if !named(g) {
			b, _ := os.ReadFile(filepath.Join(work, g.c.name, "profiles.json"))
			t.Errorf("%s never named the frame; its output ends:\n%s", g.c.name, b[max(0, len(b)-3000):])
		}
		m := promMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", g.prom))
		t.Logf("%s: parsed %v, index opened %v, written %v", g.c.name, metric(m, "symbolization_objects_parsed"),
			metric(m, "symbolization_index_opened"), metric(m, "symbolization_index_written"))
	}
	wantParsed, wantOpened := 1.0, float64(replicas-1)
	if ciIndexed {
		wantParsed, wantOpened = 0, replicas
	}
	if parsed != wantParsed || written != wantParsed || opened != wantOpened || failed != 0 || refused != 0 {
		t.Errorf("%d replicas: debug info parsed %v times, indexes written %v, opened %v, failed %v, refused %v; want %v, %v, %v, 0, 0",
			replicas, parsed, written, opened, failed, refused, wantParsed, wantParsed, wantOpened)
	}
}
