package helmtest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/testfixture"
)

// gateway.jfr adds the jfr receiver to the gateway: its port on the pod and
// the Service, its limits, the profiles pipeline, and a token Secret wired
// to a bearertokenauth extension as the symbol store's is. Off by default.
func TestJFR(t *testing.T) {
	d := mustTemplate(t)
	cfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	if mapping(cfg, "receivers", "jfr") != nil || slices.Contains(strs(cfg, "service", "pipelines", "profiles", "receivers"), "jfr") ||
		d.find("Secret", release+"-jfr-token") != nil || servicePort(d, "jfr") != "" {
		t.Error("the jfr receiver is rendered by default")
	}

	d = mustTemplate(t, "--set", "gateway.jfr.enabled=true", "--set", "gateway.jfr.auth.value=k3y",
		"--set", "gateway.jfr.auth.header=DD-API-KEY", "--set", "gateway.jfr.auth.scheme=",
		"--set", "gateway.jfr.pyroscope.enabled=false", "--set", "gateway.jfr.maxRecordingSize=1000000")
	cfg = collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	r := mapping(cfg, "receivers", "jfr")
	wantEqual(t, "jfr endpoint", str(r, "endpoint"), "${env:PROFSYM_JFR_LISTEN}")
	wantEqual(t, "jfr auth", str(r, "auth", "authenticator"), "bearertokenauth/jfr")
	wantEqual(t, "datadog path", str(r, "datadog", "path"), "/profiling/v1/input")
	wantEqual(t, "pyroscope off", fmt.Sprint(get(r, "pyroscope", "enabled")), "false")
	wantEqual(t, "max_recording_size", fmt.Sprint(get(r, "max_recording_size")), "1000000")
	wantEqual(t, "max_request_body_size", fmt.Sprint(get(r, "max_request_body_size")), "33554432")
	wantEqual(t, "token header", str(cfg, "extensions", "bearertokenauth/jfr", "header"), "DD-API-KEY")
	wantEqual(t, "token scheme", str(cfg, "extensions", "bearertokenauth/jfr", "scheme"), "")
	wantEqual(t, "token file", str(cfg, "extensions", "bearertokenauth/jfr", "filename"), "/etc/profsym-jfr/token")
	if !slices.Contains(strs(cfg, "service", "extensions"), "bearertokenauth/jfr") ||
		!slices.Equal(strs(cfg, "service", "pipelines", "profiles", "receivers"), []string{"otlp", "jfr"}) {
		t.Errorf("gateway service: %v", cfg["service"])
	}
	wantEqual(t, "token secret data", str(d.must(t, "Secret", release+"-jfr-token"), "data", "token"), "azN5")
	wantEqual(t, "Service port", servicePort(d, "jfr"), "4040")
	dep := d.must(t, "Deployment", gatewayName)
	c := container(dep)
	wantEqual(t, "PROFSYM_JFR_LISTEN", str(env(c)["PROFSYM_JFR_LISTEN"], "value"), "0.0.0.0:4040")
	ports := map[string]string{}
	for _, p := range list(c, "ports") {
		ports[str(p, "name")] = fmt.Sprint(get(p, "containerPort"))
	}
	wantEqual(t, "container port", ports["jfr"], "4040")
	mounts := map[string]string{}
	for _, m := range list(c, "volumeMounts") {
		mounts[str(m, "name")] = str(m, "mountPath")
	}
	wantEqual(t, "token mount", mounts["jfr-token"], "/etc/profsym-jfr")
	secrets := map[string]string{}
	for _, v := range list(dep, "spec", "template", "spec", "volumes") {
		secrets[str(v, "name")] = str(v, "secret", "secretName")
	}
	wantEqual(t, "token volume", secrets["jfr-token"], release+"-jfr-token")

	// An existing Secret is mounted, none is created; no token, no auth.
	d = mustTemplate(t, "--set", "gateway.jfr.enabled=true", "--set", "gateway.jfr.auth.existingSecret=dd-keys", "--set", "gateway.jfr.auth.key=api-key")
	if d.find("Secret", release+"-jfr-token") != nil {
		t.Error("a Secret rendered next to existingSecret")
	}
	for _, v := range list(d.must(t, "Deployment", gatewayName), "spec", "template", "spec", "volumes") {
		if str(v, "name") == "jfr-token" {
			wantEqual(t, "existing secret", str(v, "secret", "secretName"), "dd-keys")
			wantEqual(t, "existing secret key", str(v, "secret", "items", "0", "key"), "api-key")
		}
	}
	// No token of its own: the gateway's intake token (gateway.auth), as
	// the OTLP receiver takes it; with gateway.auth off, none.
	d = mustTemplate(t, "--set", "gateway.jfr.enabled=true")
	cfg = collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	wantEqual(t, "jfr auth without a token of its own", str(cfg, "receivers", "jfr", "auth", "authenticator"), "bearertokenauth/intake")
	wantEqual(t, "otlp auth", str(cfg, "receivers", "otlp", "protocols", "grpc", "auth", "authenticator"), "bearertokenauth/intake")
	if mapping(cfg, "extensions", "bearertokenauth/jfr") != nil {
		t.Error("a jfr token extension without a jfr token")
	}
	d = mustTemplate(t, "--set", "gateway.jfr.enabled=true", "--set", "gateway.auth.enabled=false")
	cfg = collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	if mapping(cfg, "receivers", "jfr", "auth") != nil || mapping(cfg, "receivers", "otlp", "protocols", "grpc", "auth") != nil {
		t.Error("auth with gateway.auth off and no jfr token")
	}

	for _, tc := range []struct{ set, want string }{
		{"gateway.jfr.port=0", "port"},
		{"gateway.jfr.datadog.path=profiling", "path"},
		{"gateway.jfr.maxRecordingSize=0", "maxRecordingSize"},
		{"gateway.jfr.auth.header=Bad Header", "header"},
		{"gateway.jfr.bodyLimit=1", "bodyLimit"},
	} {
		if _, err := template(t, "--set", "gateway.jfr.enabled=true", "--set", tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: %v, want an error about %s", tc.set, err, tc.want)
		}
	}
}

func servicePort(d docs, name string) string {
	svc := d.find("Service", gatewayName)
	for _, p := range list(svc, "spec", "ports") {
		if str(p, "name") == name && str(p, "targetPort") == name {
			return fmt.Sprint(get(p, "port"))
		}
	}
	return ""
}

// The rendered gateway, run: the distribution serves the Datadog intake and
// Pyroscope's ingest on the chart's port, refuses uploads without the
// token (or with a wrong one) with 401, and accepts the ones that carry it,
// in the header each agent uses.
func TestJFRServes(t *testing.T) {
	helm(t)
	bin := collectorBinary(t)
	testfixture.Short(t, "the built binaries (make test builds them)")
	if bin == "" {
		testfixture.SkipOrFail(t, "the otelcol-profsym distribution is not built (make otelcol)")
	}
	rec := jfrtest.New(1_700_000_000_000_000_000)
	rec.Sample(jfrtest.DatadogExecutionSample, 10, 1, 1, jfrtest.JavaFrame("com/example/App", "run", 42))
	recording := rec.Bytes()
	datadog := func(base string, h http.Header) (int, error) {
		body, ct := jfrtest.DatadogUpload("service:app,env:test", jfrtest.Zstd(recording))
		return send(base+"/profiling/v1/input", ct, body, h)
	}
	pyroscope := func(base string, h http.Header) (int, error) {
		return send(base+"/ingest?name=app&format=jfr", "application/octet-stream", bytes.NewReader(recording), h)
	}
	own := func(header, scheme string) []string {
		return []string{"--set", "gateway.jfr.auth.value=s3cret", "--set", "gateway.jfr.auth.header=" + header, "--set", "gateway.jfr.auth.scheme=" + scheme}
	}
	for _, tc := range []struct {
		name, header, scheme string
		set                  []string
		post                 func(base string, h http.Header) (int, error)
	}{
		{"datadog", "DD-API-KEY", "", own("DD-API-KEY", ""), datadog},
		{"pyroscope", "Authorization", "Bearer", own("Authorization", "Bearer"), pyroscope},
		// No token of its own: the gateway's intake token, as the OTLP
		// receiver takes it, on both intakes.
		{"intake-token-pyroscope", "Authorization", "Bearer", []string{"--set", "gateway.auth.value=s3cret"}, pyroscope},
		{"intake-token-datadog", "Authorization", "Bearer", []string{"--set", "gateway.auth.value=s3cret"}, datadog},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := mustTemplate(t, append([]string{"--set", "gateway.jfr.enabled=true"}, tc.set...)...)
			base := runGateway(t, bin, d)
			token := "s3cret"
			if tc.scheme != "" {
				token = tc.scheme + " " + token
			}
			for _, c := range []struct {
				value string
				want  int
			}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {token, http.StatusOK}} {
				h := http.Header{}
				if c.value != "" {
					h.Set(tc.header, c.value)
				}
				code, err := tc.post(base, h)
				if err != nil || code != c.want {
					t.Errorf("%s %q: %d %v, want %d", tc.header, c.value, code, err, c.want)
				}
			}
		})
	}
}

func send(url, ctype string, body interface{ Read([]byte) (int, error) }, h http.Header) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		return 0, err
	}
	req.Header = h
	req.Header.Set("Content-Type", ctype)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// runGateway runs the distribution with the rendered gateway configuration
// and environment (startRendered) and returns the jfr receiver's base URL.
func runGateway(t *testing.T, bin string, d docs) string {
	t.Helper()
	ip, _ := startRendered(t, bin, d, "Deployment", gatewayName, renderedSecrets(d), 4040)
	return "http://" + net.JoinHostPort(ip, "4040")
}
