package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// kubeTools returns the folder holding the kube-apiserver and etcd that
// `make kube-tools` builds (test/tools/kube), found by the same hash of
// that module's files the Makefile names it by.
func kubeTools(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PROFSYM_KUBE_TOOLS")
	if dir == "" {
		h := sha256.New()
		for _, f := range []string{"go.mod", "go.sum", "etcd/main.go"} {
			b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "test", "tools", "kube", f))
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "profsym", "kube-"+hex.EncodeToString(h.Sum(nil))[:12])
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		testfixture.Short(t, "kube-apiserver and etcd (make kube-tools)")
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			testfixture.SkipOrFail(t, "%s is not built: run make kube-tools (.ci/run does)", filepath.Join(dir, b))
		}
	}
	return dir
}

// kubeAPI is a real kube-apiserver over a real etcd, on loopback, with a
// self-signed serving certificate and a static admin token.
type kubeAPI struct {
	URL    string
	CAFile string
	CA     []byte
	admin  string
	client *http.Client
}

// startKubeAPI starts etcd and kube-apiserver in dir and waits for /readyz.
func startKubeAPI(t *testing.T, tools, dir string) *kubeAPI {
	t.Helper()
	caPEM, certPEM, keyPEM := selfSigned(t)
	saKey, saPub := ecKeyPair(t)
	admin := secretHex(t, 16)
	files := map[string][]byte{
		"ca.crt": caPEM, "server.crt": certPEM, "server.key": keyPEM,
		"sa.key": saKey, "sa.pub": saPub,
		"tokens.csv": []byte(admin + `,admin,admin,"system:masters"` + "\n"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	clientPort, peerPort, apiPort := testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd := daemon(t, "etcd", filepath.Join(tools, "etcd"),
		"--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--log-level", "warn",
		// A test's data need not survive a crash: no fsync on a busy disk.
		"--unsafe-no-fsync")
	waitHTTP(t, etcd, http.DefaultClient, etcdURL+"/health", "", 60*time.Second)

	api := daemon(t, "kube-apiserver", filepath.Join(tools, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort), "--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-private-key-file", filepath.Join(dir, "server.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		// No controller manager runs: nothing creates the default
		// ServiceAccount the admission plugin would insist on.
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false",
		// The kubernetes Service's endpoint may not be a loopback address;
		// nothing here needs that Service.
		"--endpoint-reconciler-type", "none")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	k := &kubeAPI{
		URL: fmt.Sprintf("https://127.0.0.1:%d", apiPort), CAFile: filepath.Join(dir, "ca.crt"), CA: caPEM, admin: admin,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
	}
	waitHTTP(t, api, k.client, k.URL+"/readyz", admin, 3*time.Minute)
	return k
}

// daemon starts a server process that dies with the test.
func daemon(t *testing.T, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	log := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, lastBytes(log.String(), 4000))
		}
	})
	return cmd
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func waitHTTP(t *testing.T, cmd *exec.Cmd, c *http.Client, url, token string, limit time.Duration) {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < limit {
		if cmd.ProcessState != nil {
			t.Fatalf("%s exited: %v", cmd.Path, cmd.ProcessState)
		}
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("%s ready in %v", filepath.Base(cmd.Path), time.Since(start).Round(time.Millisecond))
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s not ready after %v: %s", url, limit, last)
}

// do sends one request as the admin and decodes the answer.
func (k *kubeAPI) do(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	out, status, err := k.request(k.admin, method, path, body)
	if err != nil || status/100 != 2 {
		t.Fatalf("%s %s: %d %v %v", method, path, status, err, out)
	}
	return out
}

func (k *kubeAPI) request(token, method, path string, body any) (map[string]any, int, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, k.URL+path, r)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var out map[string]any
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out, resp.StatusCode, err
}

// create posts a manifest (apiVersion, kind, metadata) to its collection.
func (k *kubeAPI) create(t *testing.T, o map[string]any) map[string]any {
	t.Helper()
	return k.do(t, "POST", collectionPath(o), o)
}

// collectionPath is where objects of o's kind are created, for the kinds
// this test uses.
func collectionPath(o map[string]any) string {
	apiVersion, _ := o["apiVersion"].(string)
	kind, _ := o["kind"].(string)
	ns, _ := o["metadata"].(map[string]any)["namespace"].(string)
	base := "/apis/" + apiVersion
	if !strings.Contains(apiVersion, "/") {
		base = "/api/" + apiVersion
	}
	plural := strings.ToLower(kind) + "s"
	if ns != "" && kind != "Namespace" && kind != "ClusterRole" && kind != "ClusterRoleBinding" {
		return base + "/namespaces/" + ns + "/" + plural
	}
	return base + "/" + plural
}

// kubeconfig writes a kubeconfig that reaches k with token.
func (k *kubeAPI) kubeconfig(t *testing.T, dir, token string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: agent
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: agent}
current-context: e2e
`, k.URL, k.CAFile, token)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// selfSigned makes a CA and a serving certificate for 127.0.0.1 signed by it.
func selfSigned(t *testing.T) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "profsym-e2e-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// ecKeyPair is the key service account tokens are signed with.
func ecKeyPair(t *testing.T) (keyPEM, pubPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := x509.MarshalECPrivateKey(key)
	pb, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pb})
}

func secretHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// staticPodHash is what the kubelet names a static pod's cgroup by: the
// hash of its manifest (kubernetes.io/config.hash), not a UUID.
const staticPodHash = "6a0f3c4b8e1c2d3e4f5a6b7c8d9e0f1a"

// createMirrorPod creates the mirror pod the kubelet makes in the API for
// a static pod (etcd's, say): no owning workload.
func createMirrorPod(t *testing.T, api *kubeAPI, f *k8sFixture) {
	t.Helper()
	pod := api.create(t, map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": f.container + "-" + k8sNode, "namespace": "kube-system",
			"annotations": map[string]any{"kubernetes.io/config.mirror": staticPodHash, "kubernetes.io/config.hash": staticPodHash, "kubernetes.io/config.source": "file"}},
		"spec": map[string]any{"nodeName": k8sNode, "containers": []any{map[string]any{"name": f.container, "image": "registry.example/etcd:3"}}}})
	setRunning(t, api, f, pod)
}

// createWorkload creates a Deployment, its ReplicaSet and one Pod on the
// test's node, owned the way the controllers own them, and gives the pod
// the status a kubelet would report for a running container.
func createWorkload(t *testing.T, api *kubeAPI, f *k8sFixture) {
	t.Helper()
	ns := k8sAppNS
	if f.ns != "" {
		ns = f.ns
	}
	labels := map[string]any{"app": f.deployment}
	template := map[string]any{
		"metadata": map[string]any{"labels": labels},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": f.container, "image": "registry.example/" + f.deployment + ":1"}}},
	}
	dep := api.create(t, map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": f.deployment, "namespace": ns, "labels": labels},
		"spec":     map[string]any{"selector": map[string]any{"matchLabels": labels}, "template": template}})
	owner := func(o map[string]any, kind string) []any {
		m := o["metadata"].(map[string]any)
		return []any{map[string]any{"apiVersion": "apps/v1", "kind": kind, "name": m["name"], "uid": m["uid"], "controller": true, "blockOwnerDeletion": true}}
	}
	rsLabels := map[string]any{"app": f.deployment, "pod-template-hash": f.hash}
	rs := api.create(t, map[string]any{"apiVersion": "apps/v1", "kind": "ReplicaSet",
		"metadata": map[string]any{"name": f.deployment + "-" + f.hash, "namespace": ns, "labels": rsLabels, "ownerReferences": owner(dep, "Deployment")},
		"spec": map[string]any{"replicas": 1, "selector": map[string]any{"matchLabels": rsLabels},
			"template": map[string]any{"metadata": map[string]any{"labels": rsLabels}, "spec": template["spec"]}}})
	pod := api.create(t, map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": f.deployment + "-" + f.hash + "-x7k2q", "namespace": ns, "labels": rsLabels, "ownerReferences": owner(rs, "ReplicaSet")},
		"spec":     map[string]any{"nodeName": k8sNode, "containers": template["spec"].(map[string]any)["containers"]}})
	setRunning(t, api, f, pod)
}

// setRunning gives pod the status a kubelet reports for a running
// container, with f's container id.
func setRunning(t *testing.T, api *kubeAPI, f *k8sFixture, pod map[string]any) {
	t.Helper()
	m := pod["metadata"].(map[string]any)
	f.podName, f.podUID = m["name"].(string), m["uid"].(string)
	ns := m["namespace"].(string)
	image := pod["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["image"].(string)
	now := time.Now().UTC().Format(time.RFC3339)
	pod["status"] = map[string]any{
		"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.244.0.10", "startTime": now,
		"containerStatuses": []any{map[string]any{
			"name": f.container, "ready": true, "restartCount": 0, "started": true,
			"image": image, "imageID": strings.SplitN(image, ":", 2)[0] + "@sha256:" + strings.Repeat("ab", 32),
			"containerID": "containerd://" + f.containerID,
			"state":       map[string]any{"running": map[string]any{"startedAt": now}},
		}},
	}
	api.do(t, "PUT", "/api/v1/namespaces/"+ns+"/pods/"+f.podName+"/status", pod)
}
