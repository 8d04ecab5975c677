package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// A gateway built from the distribution with config/jfr.yaml takes a
// Datadog-style upload and a Pyroscope-style upload of recordings with
// remote frames into a stripped C library, names every remote frame with
// file and line from a debuginfod server that has the debug files, answers
// hostile uploads with 4xx, and keeps serving.
func TestJFRIntakeGateway(t *testing.T) {
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	fx := jfrtest.BuildRemoteFixture(t)
	served := t.TempDir()
	var ready []string
	for _, o := range fx.Objects {
		data, err := os.ReadFile(o.Debug)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(served, o.Name+".debug"), data, 0o644)
		ready = append(ready, o.BuildID+"/debuginfo")
	}
	srv := testfixture.StartDebuginfod(t, served, ready...)

	work := t.TempDir()
	out := filepath.Join(work, "gateway.json")
	jfrPort := testfixture.FreePort(t)
	env := []string{
		fmt.Sprintf("PROFSYM_GATEWAY_LISTEN=127.0.0.1:%d", testfixture.FreePort(t)),
		fmt.Sprintf("PROFSYM_GATEWAY_HTTP_LISTEN=127.0.0.1:%d", testfixture.FreePort(t)),
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
		fmt.Sprintf("PROFSYM_JFR_LISTEN=127.0.0.1:%d", jfrPort),
		"PROFSYM_OUTPUT=" + out,
		"PROFSYM_DEBUGINFOD_CACHE=" + filepath.Join(work, "cache"),
		// The gateway's symbol store (its symbol indexes), else ./out in
		// the package's folder.
		"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, "symbols"),
		"PROFSYM_LOCAL_ROOT=/nonexistent", // names must come from debuginfod, not this host's files
		"DEBUGINFOD_URLS=" + srv.URL,
	}
	gw := startCollector(t, bin, "gateway", env, filepath.Join(root, "config", "gateway.yaml"), filepath.Join(root, "config", "jfr.yaml"))
	base := fmt.Sprintf("http://127.0.0.1:%d", jfrPort)

	rec := fx.Recording(1_700_000_000_000_000_000, 3, 4).Bytes()

	// Hostile first: each is refused and the gateway keeps serving.
	for name, body := range map[string][]byte{"bomb": jfrtest.ZstdBomb(1024), "truncated": rec[:len(rec)/2], "magic": append([]byte("XLR\x00"), rec[4:]...)} {
		code, msg := ddPost(t, base, "service:evil", body)
		if code < 400 || code >= 500 {
			t.Errorf("%s upload: %d %s", name, code, msg)
		}
	}

	if code, msg := ddPost(t, base, "service:dd-app,env:e2e,host:jvm-1,runtime-id:rt-1", jfrtest.Zstd(rec)); code != http.StatusOK {
		t.Fatalf("datadog upload: %d %s\n%s", code, msg, gw.log.String())
	}
	resp, err := http.Post(base+"/ingest?name=pyro-app%7Benv%3De2e%7D&format=jfr&event=itimer", "application/octet-stream", bytes.NewReader(rec))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pyroscope upload: %d", resp.StatusCode)
	}
	gw.stop(t)

	// Ground truth: llvm-symbolizer-19 on each frame's ELF address in the
	// unstripped file.
	want := map[string]bool{}
	for _, st := range fx.Stacks {
		for _, f := range st {
			fr := testfixture.LLVMSymbolize(t, f.Obj.Unstrip, []uint64{f.ELFAddr})[0][0]
			want[fmt.Sprintf("%s %s:%d", fr.FunctionName, filepath.Base(fr.FileName), fr.Line)] = true
		}
	}
	t.Logf("llvm-symbolizer-19 names the remote frames %v", want)
	named := namedRemote(t, out)
	for _, svc := range []string{"dd-app", "pyro-app"} {
		got := map[string]bool{}
		for _, g := range named[svc] {
			got[g] = true
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: remote frames named %v, llvm-symbolizer-19 says %v\ngateway log:\n%s", svc, got, want, gw.log.String())
		}
		if raw := named[svc+"/raw"]; len(raw) > 0 {
			t.Errorf("%s: remote frames left raw: %v", svc, raw)
		}
	}

	// profsym top on the gateway's output shows the native leaf under its
	// Java callers.
	profsym := filepath.Join(root, "_build", "profsym")
	if _, err := os.Stat(profsym); err == nil {
		b, err := exec.Command(profsym, "top", out, "--n", "3").CombinedOutput()
		if err != nil || !strings.Contains(string(b), "lib_leaf <- lib_mid <- lib_outer <- exe_call <- com.example.Native.call") {
			t.Errorf("profsym top: %v\n%s", err, b)
		}
	}
}

func ddPost(t *testing.T, base, tags string, body []byte) (int, string) {
	buf, ct := jfrtest.DatadogUpload(tags, body)
	resp, err := http.Post(base+"/profiling/v1/input", ct, buf)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var msg bytes.Buffer
	msg.ReadFrom(resp.Body)
	return resp.StatusCode, msg.String()
}

// namedRemote reads the gateway's output and lists, per service, the
// "function file:line" of every location on a mapping with a build id (the
// remote frames), and under "SERVICE/raw" those left unnamed.
func namedRemote(t *testing.T, path string) map[string][]string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var um pprofile.JSONUnmarshaler
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			t.Fatal(err)
		}
		d := pdict.New(pd.Dictionary())
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			v, _ := rp.Resource().Attributes().Get("service.name")
			svc := v.Str()
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					for _, s := range p.Samples().All() {
						for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
							loc := dict.LocationTable().At(int(li))
							if loc.MappingIndex() <= 0 {
								continue
							}
							m := dict.MappingTable().At(int(loc.MappingIndex()))
							if _, ok := d.FindAttr(m.AttributeIndices(), "process.executable.build_id.gnu"); !ok {
								continue
							}
							if loc.Lines().Len() == 0 {
								out[svc+"/raw"] = append(out[svc+"/raw"], fmt.Sprintf("%#x", loc.Address()))
								continue
							}
							ln := loc.Lines().At(0)
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							out[svc] = append(out[svc], fmt.Sprintf("%s %s:%d", d.Str(fn.NameStrindex()), filepath.Base(d.Str(fn.FilenameStrindex())), ln.Line()))
						}
					}
				}
			}
		}
	}
	return out
}
