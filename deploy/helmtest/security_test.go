package helmtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

// testCertificate makes a CA and a serving certificate for dnsNames, as a
// kubernetes.io/tls Secret's data (tls.crt, tls.key, ca.crt).
func testCertificate(t *testing.T, dnsNames []string) map[string][]byte {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "profsym-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsNames[0]}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
}

// fakeAPIServer answers what helm's lookup asks a cluster: the v1 resource
// list and GETs of the given Secrets (name -> key -> value).
func fakeAPIServer(t *testing.T, existing map[string]map[string]string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch p := r.URL.Path; {
		case p == "/api/v1":
			json.NewEncoder(w).Encode(map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
				"resources": []map[string]any{{"name": "secrets", "singularName": "secret", "namespaced": true, "kind": "Secret", "verbs": []string{"get", "list"}}}})
		case strings.HasPrefix(p, "/api/v1/namespaces/"+namespace+"/secrets/"):
			name := strings.TrimPrefix(p, "/api/v1/namespaces/"+namespace+"/secrets/")
			if data, ok := existing[name]; ok {
				enc := map[string]string{}
				for k, v := range data {
					enc[k] = base64.StdEncoding.EncodeToString([]byte(v))
				}
				json.NewEncoder(w).Encode(map[string]any{"kind": "Secret", "apiVersion": "v1", "metadata": map[string]any{"name": name, "namespace": namespace}, "data": enc})
				return
			}
			fallthrough
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func secretValue(t *testing.T, d docs, name, key string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(str(d.must(t, "Secret", name), "data", key))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Secure by default: the symbol store's token and the gateway's intake
// token are generated unless given, and kept across upgrades (helm looks
// the Secret up: a fake API server stands in for the cluster); the store,
// the gateways and the agents all use them.
func TestTokensGenerated(t *testing.T) {
	symTok, gwTok := release+"-symbols-token", release+"-gateway-token"
	d := mustTemplate(t)
	random := regexp.MustCompile(`^[A-Za-z0-9]{48}$`)
	for _, s := range []string{symTok, gwTok} {
		if v := secretValue(t, d, s, "token"); !random.MatchString(v) {
			t.Errorf("Secret %s holds %q, want 48 random characters", s, v)
		}
	}
	if again := mustTemplate(t); secretValue(t, again, symTok, "token") == secretValue(t, d, symTok, "token") {
		t.Error("two installs got the same generated token")
	}
	// Every piece uses them.
	scfg := collectorConfig(t, d.must(t, "ConfigMap", symbolsName))
	wantEqual(t, "store auth", str(scfg, "extensions", "symbolstore", "auth", "authenticator"), "bearertokenauth/symbols")
	gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	for _, proto := range []string{"grpc", "http"} {
		wantEqual(t, "gateway otlp "+proto+" auth", str(gcfg, "receivers", "otlp", "protocols", proto, "auth", "authenticator"), "bearertokenauth/intake")
	}
	wantEqual(t, "gateway intake token file", str(gcfg, "extensions", "bearertokenauth/intake", "filename"), "/etc/profsym-gateway-token/token")
	wantEqual(t, "gateway intake token volume", str(volume(d.must(t, "Deployment", gatewayName), "gateway-token"), "secret", "secretName"), gwTok)
	ag := container(d.must(t, "DaemonSet", agentName))
	wantEqual(t, "agent token env", str(env(ag)["PROFSYM_GATEWAY_TOKEN"], "valueFrom", "secretKeyRef", "name"), gwTok)
	acfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	wantEqual(t, "agent header", str(acfg, "exporters", "otlp_grpc", "headers", "authorization"), "Bearer ${env:PROFSYM_GATEWAY_TOKEN}")
	wantEqual(t, "agent upload auth", str(acfg, "processors", "symbolupload", "auth", "authenticator"), "bearertokenauth/symbols")

	// Upgrades keep what the cluster holds.
	api := fakeAPIServer(t, map[string]map[string]string{symTok: {"token": "kept-symbols"}, gwTok: {"token": "kept-gateway"}})
	up := mustTemplate(t, "--dry-run=server", "--kube-apiserver", api, "--kubeconfig", "/dev/null")
	wantEqual(t, "symbols token across an upgrade", secretValue(t, up, symTok, "token"), "kept-symbols")
	wantEqual(t, "gateway token across an upgrade", secretValue(t, up, gwTok, "token"), "kept-gateway")
	// A first install against the cluster makes new ones.
	first := mustTemplate(t, "--dry-run=server", "--kube-apiserver", fakeAPIServer(t, nil), "--kubeconfig", "/dev/null")
	if !random.MatchString(secretValue(t, first, symTok, "token")) {
		t.Error("no token generated on a first install")
	}

	// Given values and existing Secrets win.
	d = mustTemplate(t, "--set", "symbols.token.value=s", "--set", "gateway.auth.value=g")
	wantEqual(t, "given symbols token", secretValue(t, d, symTok, "token"), "s")
	wantEqual(t, "given gateway token", secretValue(t, d, gwTok, "token"), "g")
	d = mustTemplate(t, "--set", "symbols.token.existingSecret=mine", "--set", "gateway.auth.existingSecret=ours", "--set", "gateway.auth.key=k")
	if d.find("Secret", symTok) != nil || d.find("Secret", gwTok) != nil {
		t.Error("Secrets rendered next to existing ones")
	}
	wantEqual(t, "existing gateway token key", str(env(container(d.must(t, "DaemonSet", agentName)))["PROFSYM_GATEWAY_TOKEN"], "valueFrom", "secretKeyRef", "key"), "k")

	// gateway.auth off: open intakes, no token anywhere on that path.
	d = mustTemplate(t, "--set", "gateway.auth.enabled=false")
	if d.find("Secret", gwTok) != nil || mapping(collectorConfig(t, d.must(t, "ConfigMap", gatewayName)), "receivers", "otlp", "protocols", "grpc", "auth") != nil ||
		mapping(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "exporters", "otlp_grpc", "headers") != nil {
		t.Error("intake auth rendered with gateway.auth.enabled=false")
	}
}

// tls.enabled turns TLS on for every connection between the chart's pods,
// from a Secret or from cert-manager, and the certificate names every host
// the agents and gateways dial.
func TestTLSRendered(t *testing.T) {
	d := mustTemplate(t)
	if get(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "exporters", "otlp_grpc", "tls", "insecure") != true {
		t.Error("plain gRPC by default is not said explicitly")
	}
	for _, o := range d {
		if o["kind"] == "Certificate" || o["kind"] == "Issuer" {
			t.Errorf("%v rendered with TLS off", o["kind"])
		}
	}
	if _, err := template(t, "--set", "tls.enabled=true"); err == nil || !strings.Contains(err.Error(), "tls.existingSecret") {
		t.Errorf("TLS without a Secret or cert-manager: %v", err)
	}

	for _, tc := range []struct {
		name   string
		args   []string
		secret string
	}{
		{"secret", []string{"--set", "tls.enabled=true", "--set", "tls.existingSecret=my-tls"}, "my-tls"},
		{"cert-manager", []string{"--set", "tls.enabled=true", "--api-versions", "cert-manager.io/v1"}, release + "-tls"},
		{"cert-manager-issuer", []string{"--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true",
			"--set", "tls.certManager.issuerRef.name=corp-ca", "--set", "tls.certManager.issuerRef.kind=ClusterIssuer"}, release + "-tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := mustTemplate(t, tc.args...)
			acfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
			gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
			scfg := collectorConfig(t, d.must(t, "ConfigMap", symbolsName))
			const ca, crt = "/etc/profsym-tls/ca.crt", "/etc/profsym-tls/tls.crt"
			wantEqual(t, "agent exporter CA", str(acfg, "exporters", "otlp_grpc", "tls", "ca_file"), ca)
			wantEqual(t, "agent upload CA", str(acfg, "processors", "symbolupload", "tls", "ca_file"), ca)
			wantEqual(t, "gateway store client CA", str(gcfg, "extensions", "symbolstore", "storage", "remote", "tls", "ca_file"), ca)
			for _, proto := range []string{"grpc", "http"} {
				wantEqual(t, "gateway "+proto+" cert", str(gcfg, "receivers", "otlp", "protocols", proto, "tls", "cert_file"), crt)
			}
			wantEqual(t, "store cert", str(scfg, "extensions", "symbolstore", "tls", "cert_file"), crt)
			upload := str(acfg, "processors", "symbolupload", "endpoint")
			if !strings.HasPrefix(upload, "https://") || !strings.HasPrefix(str(gcfg, "extensions", "symbolstore", "storage", "remote", "endpoint"), "https://") {
				t.Errorf("store URLs not https: %s", upload)
			}
			for _, w := range [][2]string{{"DaemonSet", agentName}, {"Deployment", gatewayName}, {"StatefulSet", symbolsName}} {
				o := d.must(t, w[0], w[1])
				wantEqual(t, w[1]+" TLS volume", str(volume(o, "tls"), "secret", "secretName"), tc.secret)
			}
			if tc.secret == "my-tls" {
				if d.find("Certificate", release+"-tls") != nil {
					t.Error("a Certificate next to an existing Secret")
				}
				return
			}
			cert := d.must(t, "Certificate", release+"-tls")
			wantEqual(t, "certificate secret", str(cert, "spec", "secretName"), tc.secret)
			names := strs(cert, "spec", "dnsNames")
			// Every host a client dials is in the certificate.
			dialed := []string{
				regexp.MustCompile(`^dns:///([^:]+):`).FindStringSubmatch(str(env(container(d.must(t, "DaemonSet", agentName)))["PROFSYM_GATEWAY_ENDPOINT"], "value"))[1],
				hostOf(t, upload), gatewayName + "." + namespace + ".svc",
			}
			for _, h := range dialed {
				if !slices.Contains(names, h) {
					t.Errorf("certificate names %v, not %s", names, h)
				}
			}
			issuer := str(cert, "spec", "issuerRef", "name")
			if tc.name == "cert-manager" {
				wantEqual(t, "bootstrapped issuer", issuer, release+"-ca")
				d.must(t, "Issuer", release+"-ca")
				d.must(t, "Issuer", release+"-selfsigned")
				wantEqual(t, "CA certificate", get(d.must(t, "Certificate", release+"-ca"), "spec", "isCA"), any(true))
			} else {
				wantEqual(t, "given issuer", issuer, "corp-ca")
				wantEqual(t, "given issuer kind", str(cert, "spec", "issuerRef", "kind"), "ClusterIssuer")
				if d.find("Issuer", release+"-ca") != nil {
					t.Error("a CA bootstrapped next to a given issuer")
				}
			}
		})
	}
}

func hostOf(t *testing.T, url string) string {
	t.Helper()
	m := regexp.MustCompile(`^https?://([^:/]+)`).FindStringSubmatch(url)
	if m == nil {
		t.Fatalf("not a URL: %s", url)
	}
	return m[1]
}

// The rendered gateway and symbol store, run with TLS and tokens on (a
// certificate signed for the names the chart's Certificate lists): OTLP
// needs TLS, a certificate for the name dialed, and the intake token; the
// store takes uploads over HTTPS with its token only.
func TestTLSAndTokensServe(t *testing.T) {
	helm(t)
	bin := collectorBinary(t)
	testfixture.Short(t, "the built binaries (make test builds them)")
	if bin == "" {
		testfixture.SkipOrFail(t, "the otelcol-profsym distribution is not built (make otelcol)")
	}
	set := []string{"--set", "tls.enabled=true", "--set", "tls.existingSecret=ps-tls", "--set", "gateway.auth.value=intake-token",
		"--set", "symbols.token.value=store-token"}
	names := strs(mustTemplate(t, set[0], set[1], "--api-versions", "cert-manager.io/v1").must(t, "Certificate", release+"-tls"), "spec", "dnsNames")
	d := mustTemplate(t, set...)
	sec := renderedSecrets(d)
	sec["ps-tls"] = testCertificate(t, names)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(sec["ps-tls"]["ca.crt"])
	dialed := regexp.MustCompile(`^dns:///([^:]+):`).FindStringSubmatch(str(env(container(d.must(t, "DaemonSet", agentName)))["PROFSYM_GATEWAY_ENDPOINT"], "value"))[1]

	gw, _ := startRendered(t, bin, d, "Deployment", gatewayName, sec, 4317, 4318)
	export := func(creds credentials.TransportCredentials, token string) error {
		conn, err := grpc.NewClient(net.JoinHostPort(gw, "4317"), grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		_, err = pprofileotlp.NewGRPCClient(conn).Export(ctx, pprofileotlp.NewExportRequest())
		return err
	}
	tlsFor := func(name string) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: name})
	}
	if err := export(tlsFor(dialed), "intake-token"); err != nil {
		t.Errorf("TLS for %s with the token: %v", dialed, err)
	}
	if err := export(tlsFor(dialed), ""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("without the token: %v, want Unauthenticated", err)
	}
	if err := export(tlsFor(dialed), "wrong"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("with a wrong token: %v, want Unauthenticated", err)
	}
	if err := export(insecure.NewCredentials(), "intake-token"); err == nil {
		t.Error("plain gRPC to a TLS gateway succeeded")
	}
	if err := export(tlsFor("someone-else.example"), "intake-token"); err == nil {
		t.Error("the gateway's certificate passed for another name")
	}
	// OTLP/HTTP: the same token, over HTTPS.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: dialed}}}
	for tok, want := range map[string]int{"": http.StatusUnauthorized, "intake-token": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodPost, "https://"+net.JoinHostPort(gw, "4318")+"/v1development/profiles", bytes.NewReader([]byte("{}")))
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("OTLP/HTTP: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("OTLP/HTTP with token %q: %d, want %d", tok, resp.StatusCode, want)
		}
	}

	// The symbol store: HTTPS, its own token.
	st, _ := startRendered(t, bin, d, "StatefulSet", symbolsName, sec, 8002)
	storeHost := hostOf(t, str(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "symbolupload", "endpoint"))
	client := func(token string) *symstore.Client {
		c, err := symstore.NewClient("https://"+net.JoinHostPort(st, "8002"), token, &http.Client{Timeout: 10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: storeHost}}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ids := []string{"0123456789abcdef0123456789abcdef01234567"}
	if _, err := client("store-token").Missing(context.Background(), ids); err != nil {
		t.Errorf("store over HTTPS with its token: %v", err)
	}
	if _, err := client("intake-token").Missing(context.Background(), ids); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("store with the intake token: %v, want 401", err)
	}
	// Plain HTTP gets Go's TLS server's 400, never the store.
	if resp, err := http.Get(fmt.Sprintf("http://%s/buildid/%s/debuginfo", net.JoinHostPort(st, "8002"), ids[0])); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the store: %d", resp.StatusCode)
		}
	}
}
