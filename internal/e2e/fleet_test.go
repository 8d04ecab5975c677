package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// promMetrics scrapes a collector's Prometheus self-metrics endpoint and
// sums the samples of each metric family by name (labels dropped).
func promMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name := line[:sp]
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			out[name] = v // the series, for metricWhere
			name = name[:i]
		}
		out[name] += v
	}
	return out
}

// metric reads one counter from scraped metrics, whatever suffix the
// Prometheus exporter gave it (_total for sums).
func metric(m map[string]float64, name string) float64 {
	return m["otelcol_"+name+"_total"] + m["otelcol_"+name]
}

// metricWhere sums the series of one counter whose labels hold label
// (`kind="debuginfo"`).
func metricWhere(m map[string]float64, name, label string) float64 {
	var n float64
	for _, full := range []string{"otelcol_" + name + "_total{", "otelcol_" + name + "{"} {
		for k, v := range m {
			if strings.HasPrefix(k, full) && strings.Contains(k, label) {
				n += v
			}
		}
	}
	return n
}

// telemetryOverlay makes a collector serve its own metrics to Prometheus.
func telemetryOverlay(port int) string {
	return fmt.Sprintf(`
service:
  telemetry:
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: %d
`, port)
}

// profileMapping builds one OTLP profile as the profiling receiver writes
// it: a resource for process pid, one sample in the given file, known by
// its GNU build id.
func profileMapping(pid int64, path, id string) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	dict := pd.Dictionary()
	dict.StringTable().Append("", pframe.AttrBuildIDGNU, path)
	dict.MappingTable().AppendEmpty()
	dict.LocationTable().AppendEmpty()
	dict.StackTable().AppendEmpty()
	dict.AttributeTable().AppendEmpty() // index 0 is the zero value
	kv := dict.AttributeTable().AppendEmpty()
	kv.SetKeyStrindex(1)
	kv.Value().SetStr(id)
	m := dict.MappingTable().AppendEmpty()
	m.SetFilenameStrindex(2)
	m.AttributeIndices().Append(int32(dict.AttributeTable().Len() - 1))
	loc := dict.LocationTable().AppendEmpty()
	loc.SetMappingIndex(1)
	loc.SetAddress(0x1139)
	dict.StackTable().AppendEmpty().LocationIndices().Append(1)
	rp := pd.ResourceProfiles().AppendEmpty()
	rp.Resource().Attributes().PutInt(pframe.AttrPID, pid)
	p := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	s := p.Samples().AppendEmpty()
	s.SetStackIndex(1)
	s.Values().Append(1)
	return pd
}

// TestTenAgentProcessesUploadOnce is issue 11's "10 agents starting at
// once on the same new build id upload it once", with real processes: ten
// agent collectors built from the distribution (config/agent.yaml, its
// symbolupload processor fed over OTLP instead of by the eBPF receiver, so
// no root is needed) start together and receive, together, a profile
// naming a binary that runs on this host under a build id the gateway's
// store has never seen. The counts come from the collectors' own
// Prometheus self-metrics: the gateways stored one upload, one agent
// attempted and stored it, the other nine were deduplicated.
//
// directory: one gateway (config/gateway.yaml). s3: two gateways over one
// bucket of a real S3-compatible server (config/symbols-s3.yaml), half the
// agents on each: the upload lease lives in the bucket, so one upload
// across both.
func TestTenAgentProcessesUploadOnce(t *testing.T) {
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	t.Run("directory", func(t *testing.T) { runFleet(t, root, bin, "e2efleetdir", nil) })
	t.Run("s3", func(t *testing.T) {
		srv := testfixture.StartS3(t)
		if !srv.Conditional {
			testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
		}
		runFleet(t, root, bin, "e2efleets3", srv)
	})
}

// gateway is one running gateway and where to reach it.
type gateway struct {
	c                   *collector
	otlp, symbols, prom int
}

// startGateway starts a gateway collector, on new ports as long as one it
// picked turns out taken (by the ephemeral port of another process's
// connection).
func startGateway(t *testing.T, root, bin, work, name string, s3 *testfixture.S3Server) gateway {
	t.Helper()
	var env []string
	configs := []string{filepath.Join(root, "config", "gateway.yaml")}
	if s3 != nil {
		env = append(env, "PROFSYM_SYMBOLS_S3_ENDPOINT="+s3.Endpoint, "PROFSYM_SYMBOLS_S3_BUCKET=fleet",
			"PROFSYM_SYMBOLS_S3_ACCESS_KEY="+s3.Access, "PROFSYM_SYMBOLS_S3_SECRET_KEY="+s3.Secret,
			"PROFSYM_SYMBOLS_S3_INSECURE=true", "PROFSYM_SYMBOLS_S3_CREATE_BUCKET=true")
		configs = append(configs, filepath.Join(root, "config", "symbols-s3.yaml"))
	}
	return startGatewayWith(t, bin, work, name, env, configs...)
}

// startGatewayWith starts a gateway collector from configs (its ports,
// output and telemetry overlay added), on new ports as long as one it
// picked turns out taken.
func startGatewayWith(t *testing.T, bin, work, name string, more []string, configs ...string) gateway {
	t.Helper()
	for attempt := 0; ; attempt++ {
		g := gateway{otlp: testfixture.FreePort(t), symbols: testfixture.FreePort(t), prom: testfixture.FreePort(t)}
		tel := filepath.Join(work, name+"-telemetry.yaml")
		os.WriteFile(tel, []byte(telemetryOverlay(g.prom)), 0o644)
		env := append([]string{
			fmt.Sprintf("PROFSYM_GATEWAY_LISTEN=127.0.0.1:%d", g.otlp),
			fmt.Sprintf("PROFSYM_GATEWAY_HTTP_LISTEN=127.0.0.1:%d", testfixture.FreePort(t)),
			fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
			fmt.Sprintf("PROFSYM_SYMBOLS_LISTEN=127.0.0.1:%d", g.symbols),
			"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, name, "symbols"),
			"PROFSYM_OUTPUT=" + filepath.Join(work, name, "profiles.json"),
			"PROFSYM_DEBUGINFOD_CACHE=" + filepath.Join(work, name, "cache"),
			"DEBUGINFOD_URLS=",
		}, more...)
		c, err := launchCollector(t, bin, name, env, append(configs, tel)...)
		if err == nil {
			g.c = c
			return g
		}
		if !errors.Is(err, errPortTaken) || attempt == 2 {
			t.Fatal(err)
		}
	}
}

func runFleet(t *testing.T, root, bin, name string, s3 *testfixture.S3Server) {
	const agents = 10
	private := testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=" + name}})
	id := testfixture.BuildID(t, private)
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proc := exec.CommandContext(ctx, private, "120")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })

	gateways := []gateway{startGateway(t, root, bin, work, "gateway-a", s3)}
	if s3 != nil {
		gateways = append(gateways, startGateway(t, root, bin, work, "gateway-b", s3))
		for _, g := range gateways {
			if !strings.Contains(g.c.log.String(), "leases live in the bucket") {
				t.Fatalf("%s does not share leases through the bucket:\n%s", g.c.name, g.c.log.String())
			}
		}
	}

	// Ten agents start at once, half on each gateway.
	type agent struct {
		c          *collector
		otlp, prom int
	}
	all := make([]agent, agents)
	var wg sync.WaitGroup
	errs := make(chan error, agents)
	for i := range all {
		a, g := &all[i], gateways[i%len(gateways)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempt := 0; a.c == nil; attempt++ {
				a.otlp, a.prom = testfixture.FreePort(t), testfixture.FreePort(t)
				overlay := filepath.Join(work, fmt.Sprintf("agent%d.yaml", i))
				os.WriteFile(overlay, []byte(fmt.Sprintf(`
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
processors:
  symbolupload:
    query_interval: 1s
    retry:
      initial_interval: 1s
service:
  pipelines:
    profiles:
      receivers: [otlp]
      processors: [symbolupload]
      exporters: [otlp_grpc]
`, a.otlp)), 0o644)
				tel := filepath.Join(work, fmt.Sprintf("agent%d-telemetry.yaml", i))
				os.WriteFile(tel, []byte(telemetryOverlay(a.prom)), 0o644)
				env := []string{
					fmt.Sprintf("PROFSYM_GATEWAY_ENDPOINT=127.0.0.1:%d", g.otlp),
					fmt.Sprintf("PROFSYM_SYMBOLS_ENDPOINT=http://127.0.0.1:%d", g.symbols),
					fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
				}
				c, err := launchCollector(t, bin, fmt.Sprintf("agent %d", i), env, filepath.Join(root, "config", "agent.yaml"), overlay, tel)
				if err != nil && (!errors.Is(err, errPortTaken) || attempt == 2) {
					errs <- err
					return
				}
				a.c = c
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Each gets, at once, a profile naming the binary by its new build id.
	start := make(chan struct{})
	errs = make(chan error, agents)
	for _, a := range all {
		go func() {
			conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", a.otlp), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			req := pprofileotlp.NewExportRequestFromProfiles(profileMapping(int64(proc.Process.Pid), private, id))
			<-start
			_, err = pprofileotlp.NewGRPCClient(conn).Export(ctx, req)
			errs <- err
		}()
	}
	close(start)
	for range all {
		if err := <-errs; err != nil {
			t.Fatalf("sending the profile: %v", err)
		}
	}

	// Every agent settles (stored or deduplicated); then the counts.
	var attempted, stored, deduped, failed, gwStored, gwDeduped, gwQueried float64
	deadline := time.Now().Add(60 * time.Second)
	for {
		attempted, stored, deduped, failed = 0, 0, 0, 0
		for _, a := range all {
			m := promMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", a.prom))
			attempted += metric(m, "symbolupload_uploads_attempted")
			stored += metric(m, "symbolupload_uploads_stored")
			deduped += metric(m, "symbolupload_uploads_deduped")
			failed += metric(m, "symbolupload_uploads_failed")
		}
		gwStored, gwDeduped, gwQueried = 0, 0, 0
		for _, g := range gateways {
			m := promMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", g.prom))
			// Debug files only: the gateways also store the symbol
			// indexes they compile (kind symindex).
			gwStored += metricWhere(m, "symbolstore_uploads_stored", `kind="debuginfo"`)
			gwDeduped += metricWhere(m, "symbolstore_uploads_deduped", `kind="debuginfo"`)
			gwQueried += metric(m, "symbolstore_missing_queries")
		}
		if stored+deduped >= agents || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("%d agents on %d gateways: %v attempted, %v stored, %v deduplicated, %v failed; gateways: %v stored, %v deduplicated, %v ids queried",
		agents, len(gateways), attempted, stored, deduped, failed, gwStored, gwDeduped, gwQueried)
	if attempted != 1 || stored != 1 || deduped != agents-1 {
		t.Errorf("agents attempted %v uploads, stored %v, deduplicated %v; want 1, 1, %d", attempted, stored, deduped, agents-1)
	}
	if gwStored != 1 {
		t.Errorf("the gateways stored %v uploads, want 1", gwStored)
	}
	if gwQueried < agents {
		t.Errorf("the gateways answered %v ids, want at least one per agent", gwQueried)
	}
	if t.Failed() {
		for _, a := range all {
			a.c.stop(t)
			t.Logf("%s log:\n%s", a.c.name, a.c.log.String())
		}
		for _, g := range gateways {
			g.c.stop(t)
			t.Logf("%s log:\n%s", g.c.name, g.c.log.String())
		}
	}
}
