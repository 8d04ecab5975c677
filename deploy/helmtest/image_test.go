package helmtest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// distVersion is the distribution's version (builder-config.yaml), which
// tags the image and is the chart's appVersion.
func distVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "builder-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^  version: *(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no dist.version in builder-config.yaml")
	}
	return string(m[1])
}

// makeImageRepository is the Makefile's IMAGE default.
func makeImageRepository(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE +\?= *(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no IMAGE ?= in the Makefile")
	}
	return string(m[1])
}

// imageArchive returns the OCI archive `make image` writes (make test
// builds it first, so under CI a missing one is a failure).
func imageArchive(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testfixture.Root(t), "_build", "image", "otelcol-profsym-"+distVersion(t)+".oci.tar")
	testfixture.Short(t, "the image (make image)")
	if _, err := os.Stat(p); err != nil {
		testfixture.SkipOrFail(t, "no image archive %s (make image)", p)
	}
	return p
}

// ociLayout reads an OCI archive's files into memory, blobs by digest.
type ociLayout struct {
	index []byte
	blobs map[string][]byte
}

func readOCI(t *testing.T, path string) ociLayout {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := ociLayout{blobs: map[string][]byte{}}
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "index.json":
			l.index = b
		case strings.HasPrefix(h.Name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			sum := sha256.Sum256(b)
			if d := strings.TrimPrefix(h.Name, "blobs/sha256/"); d != hex.EncodeToString(sum[:]) {
				t.Fatalf("blob %s holds sha256 %x", d, sum)
			}
			l.blobs["sha256:"+strings.TrimPrefix(h.Name, "blobs/sha256/")] = b
		}
	}
	return l
}

type ociDesc struct {
	MediaType   string                                      `json:"mediaType"`
	Digest      string                                      `json:"digest"`
	Platform    *struct{ Architecture, OS, Variant string } `json:"platform"`
	Annotations map[string]string                           `json:"annotations"`
}

func (l ociLayout) json(t *testing.T, digest string, v any) {
	t.Helper()
	b, ok := l.blobs[digest]
	if !ok {
		t.Fatalf("blob %s missing", digest)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// The archive make image writes is what the chart runs: its name is the
// chart's default image (the Makefile's IMAGE, tagged with the chart's
// appVersion, which is the distribution's version), and it holds an amd64
// and an arm64 image, each with static binaries of its architecture on an
// empty base, the CA certificates, and the chart's unprivileged user.
func TestImageArchive(t *testing.T) {
	helm(t)
	version := distVersion(t)
	ref := makeImageRepository(t) + ":" + version
	d := mustTemplate(t)
	for _, w := range [][2]string{{"DaemonSet", agentName}, {"Deployment", gatewayName}, {"StatefulSet", symbolsName}} {
		wantEqual(t, w[0]+" image", str(container(d.must(t, w[0], w[1])), "image"), ref)
	}
	l := readOCI(t, imageArchive(t))
	var index struct{ Manifests []ociDesc }
	if err := json.Unmarshal(l.index, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, l.index)
	}
	wantEqual(t, "archive's image name", index.Manifests[0].Annotations["org.opencontainers.image.ref.name"], ref)
	var list struct{ Manifests []ociDesc }
	l.json(t, index.Manifests[0].Digest, &list)
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	seen := map[string]bool{}
	for _, m := range list.Manifests {
		arch := m.Platform.Architecture
		seen[arch] = true
		var man struct {
			Config ociDesc
			Layers []ociDesc
		}
		l.json(t, m.Digest, &man)
		var cfg struct {
			Architecture string
			Config       struct {
				User       string
				Entrypoint []string
			}
		}
		l.json(t, man.Config.Digest, &cfg)
		wantEqual(t, arch+" config architecture", cfg.Architecture, arch)
		wantEqual(t, arch+" user", cfg.Config.User, "10001:10001")
		wantEqual(t, arch+" entrypoint", strings.Join(cfg.Config.Entrypoint, " "), "/otelcol-profsym")
		files := map[string][]byte{}
		for _, layer := range man.Layers {
			zr, err := gzip.NewReader(bytes.NewReader(l.blobs[layer.Digest]))
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(zr)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(tr)
				files["/"+strings.TrimSuffix(h.Name, "/")] = b
			}
		}
		for _, bin := range []string{"/otelcol-profsym", "/profsym"} {
			f, err := elf.NewFile(bytes.NewReader(files[bin]))
			if err != nil {
				t.Fatalf("%s %s: %v", arch, bin, err)
			}
			if f.Machine != machines[arch] {
				t.Errorf("%s %s is built for %v", arch, bin, f.Machine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s %s is dynamically linked: the empty base has no loader", arch, bin)
				}
			}
		}
		if n := bytes.Count(files["/etc/ssl/certs/ca-certificates.crt"], []byte("BEGIN CERTIFICATE")); n < 10 {
			t.Errorf("%s: %d CA certificates", arch, n)
		}
		if !bytes.Contains(files["/etc/passwd"], []byte(":10001:10001:")) {
			t.Errorf("%s: no user 10001 in /etc/passwd", arch)
		}
		t.Logf("%s: %d files, otelcol-profsym %d MB, profsym %d MB, layer %d MB compressed", arch, len(files),
			len(files["/otelcol-profsym"])>>20, len(files["/profsym"])>>20, len(l.blobs[man.Layers[0].Digest])>>20)
	}
	if !seen["amd64"] || !seen["arm64"] {
		t.Errorf("platforms %v, want amd64 and arm64", seen)
	}
}

// The image, loaded into podman, runs the chart as rendered, with its
// defaults and with TLS on: the symbol store, a gateway and an agent, each
// with exactly its pod's user, capabilities, read-only root, seccomp,
// limits and volumes (tokens generated by the chart). A private binary
// runs on the host: the agent samples it and exports its raw frames to the
// gateway, uploads its symbols to the store, and the gateway, which never
// saw the process, names its hot function.
func TestImageRunsChart(t *testing.T) {
	helm(t)
	archive := imageArchive(t)
	p := newPodman(t)
	p.must("load", "-q", "-i", archive)
	// No API server in podman: k8s_attributes would fail to start without
	// one (internal/e2e TestKubernetesMetadata runs it against a real one).
	fast := []string{"--set", "agent.profiling.reportInterval=2s", "--set", "symbols.store.rescan=2s",
		"--set", "agent.config.processors.symbolupload.query_interval=1s", "--set", "kubernetesMetadata.enabled=false"}
	t.Run("defaults", func(t *testing.T) { runChartInPodman(t, p, 20, "imagedefaults", fast, nil) })
	t.Run("tls", func(t *testing.T) {
		tlsSet := []string{"--set", "tls.enabled=true", "--set", "tls.existingSecret=ps-tls"}
		// The names the chart's certificate holds, from its cert-manager
		// Certificate: a certificate the test signs for them must satisfy
		// every client.
		cm := mustTemplate(t, "--set", "tls.enabled=true", "--api-versions", "cert-manager.io/v1")
		cert := testCertificate(t, strs(cm.must(t, "Certificate", release+"-tls"), "spec", "dnsNames"))
		runChartInPodman(t, p, 30, "imagetls", append(tlsSet, fast...), secrets{"ps-tls": cert})
	})
}

// runChartInPodman renders the chart with set, runs its three workloads in
// p at addresses from base on, and checks the profile path end to end with
// a fixture whose hot function is spin_ID.
func runChartInPodman(t *testing.T, p *podman, base int, id string, set []string, extra secrets) {
	fn := "spin_" + id
	bin := testfixture.Build(t, testfixture.Spec{Name: id, Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=" + id}})
	d := mustTemplate(t, set...)
	sec := renderedSecrets(d)
	for k, v := range extra {
		sec[k] = v
	}
	symIP, gwIP, agentIP := p.ip(base), p.ip(base+1), p.ip(base+2)
	// Cluster DNS: every form of each Service name.
	hosts := map[string]string{}
	for svc, ip := range map[string]string{symbolsName: symIP, gatewayName: gwIP, gatewayName + "-headless": gwIP} {
		for _, n := range []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local"} {
			hosts[n] = ip
		}
	}
	store := p.run(d, "StatefulSet", symbolsName, "profsym-"+id+"-symbols", symIP, sec, hosts)
	p.ready(store, 13133, time.Minute)
	gw := p.run(d, "Deployment", gatewayName, "profsym-"+id+"-gateway", gwIP, sec, hosts)
	p.ready(gw, 13133, time.Minute)

	work := exec.Command(bin, "120")
	if err := work.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { work.Process.Kill(); work.Wait() })
	pid := work.Process.Pid

	start := time.Now()
	agent := p.run(d, "DaemonSet", agentName, "profsym-"+id+"-agent", agentIP, sec, hosts)
	p.ready(agent, 13133, 2*time.Minute)

	out := filepath.Join(gw.dirs["output"], "profiles.jsonl")
	var sampled, named time.Duration
	var samples int64
	for end := time.Now().Add(150 * time.Second); named == 0 && time.Now().Before(end); time.Sleep(time.Second) {
		n, hit := scanOutput(t, out, pid, fn)
		if n > 0 && sampled == 0 {
			sampled = time.Since(start)
		}
		if hit {
			named = time.Since(start)
		}
		samples = n
	}
	if sampled == 0 {
		t.Fatalf("no samples of pid %d reached the gateway's output %s within 150 s", pid, out)
	}
	if named == 0 {
		t.Fatalf("%d samples of pid %d reached the gateway, none named %s (the agent's upload or the gateway's read of the store failed)", samples, pid, fn)
	}
	t.Logf("pid %d: first samples in the gateway's output %v after the agent started, named %s after %v",
		pid, sampled.Round(time.Second), fn, named.Round(time.Second))

	// The agent runs with the capabilities its pod grants, no more (less
	// only where this machine's root lacks one, as CAP_SYS_RESOURCE here).
	apid := p.pid(agent)
	granted := strs(container(d.must(t, "DaemonSet", agentName)), "securityContext", "capabilities", "add")
	eff, bnd := capSet(t, apid, "CapEff"), capSet(t, os.Getpid(), "CapBnd")
	for name, bit := range capBits {
		want := slices.Contains(granted, name) && bnd&(1<<bit) != 0
		if got := eff&(1<<bit) != 0; got != want {
			t.Errorf("agent CAP_%s effective %v, want %v (granted %v)", name, got, want, granted)
		}
	}
	if extra := eff &^ capMask(granted); extra != 0 {
		t.Errorf("agent holds capabilities its pod does not grant: %#x", extra)
	}

	// The agent's BPF maps must fit the chart's agent.bpfMemory reserve.
	maps := bpfMapBytes(t, apid)
	reserve := quantity(t, "128Mi")
	t.Logf("agent (host pid %d): BPF maps %.1f MiB (memlock in /proc/%d/fdinfo), agent.bpfMemory %d MiB; container memory %s",
		apid, float64(maps)/(1<<20), apid, reserve>>20, p.must("stats", "--no-stream", "--format", "{{.MemUsage}}", agent.name))
	if maps == 0 || maps > reserve {
		t.Errorf("the agent's BPF maps take %d bytes; agent.bpfMemory reserves %d", maps, reserve)
	}
}

// scanOutput reads the gateway's OTLP JSON lines and reports pid's samples
// and whether a frame of them is named fn.
func scanOutput(t *testing.T, path string, pid int, fn string) (samples int64, named bool) {
	nodeName, _ := os.Hostname()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	var um pprofile.JSONUnmarshaler
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			continue // a line being written
		}
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			if v, ok := rp.Resource().Attributes().Get(pframe.AttrPID); !ok || v.Int() != int64(pid) {
				continue
			}
			// The pod's HOST_NAME (spec.nodeName; the node is this
			// machine), not the pod's own host name.
			if h, _ := rp.Resource().Attributes().Get(pframe.AttrHostName); h.Str() != nodeName {
				t.Errorf("host.name %q, want the node's %q", h.Str(), nodeName)
				return 0, false
			}
			for _, sp := range rp.ScopeProfiles().All() {
				for _, prof := range sp.Profiles().All() {
					for _, s := range prof.Samples().All() {
						samples++
						if si := int(s.StackIndex()); si < dict.StackTable().Len() {
							for _, li := range dict.StackTable().At(si).LocationIndices().All() {
								for _, ln := range dict.LocationTable().At(int(li)).Lines().All() {
									f := dict.FunctionTable().At(int(ln.FunctionIndex()))
									if dict.StringTable().At(int(f.NameStrindex())) == fn {
										named = true
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return samples, named
}

// bpfMapBytes sums the memlock the kernel accounts to pid's BPF maps.
func bpfMapBytes(t *testing.T, pid int) int64 {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	memlock, id := regexp.MustCompile(`(?m)^memlock:\s+(\d+)$`), regexp.MustCompile(`(?m)^map_id:\s+(\d+)$`)
	seen := map[string]bool{} // a map held by several descriptors counts once
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !bytes.Contains(b, []byte("map_type:")) {
			continue
		}
		if m := id.FindSubmatch(b); m != nil {
			if seen[string(m[1])] {
				continue
			}
			seen[string(m[1])] = true
		}
		if m := memlock.FindSubmatch(b); m != nil {
			n, _ := strconv.ParseInt(string(m[1]), 10, 64)
			total += n
		}
	}
	return total
}

// make image-push, as docs/deployment.md tells users to run it, pushes
// both architectures as one image (here to an OCI directory instead of a
// registry: the same podman manifest push).
func TestImagePush(t *testing.T) {
	archive := imageArchive(t)
	testfixture.NeedTool(t, "podman")
	mk := testfixture.NeedTool(t, "make")
	root := testfixture.Root(t)
	rel, _ := filepath.Rel(root, archive)
	dest := t.TempDir()
	// -o: push the archive as it is; never rebuild it from here.
	cmd := exec.Command(mk, "-C", root, "image-push", "-o", rel, "PUSH=oci:"+dest+":"+distVersion(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image-push: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dest, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var index struct{ Manifests []ociDesc }
	json.Unmarshal(b, &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("pushed index: %s", b)
	}
	blob, err := os.ReadFile(filepath.Join(dest, "blobs", strings.ReplaceAll(index.Manifests[0].Digest, ":", "/")))
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Manifests []ociDesc }
	json.Unmarshal(blob, &list)
	var arches []string
	for _, m := range list.Manifests {
		if m.Platform != nil {
			arches = append(arches, m.Platform.Architecture)
		}
	}
	sort.Strings(arches)
	wantEqual(t, "pushed architectures", strings.Join(arches, ","), "amd64,arm64")
}

// capBits are the capabilities the agent's pod may add (linux/capability.h).
var capBits = map[string]uint{"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_RESOURCE": 24,
	"SYSLOG": 34, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}

func capMask(names []string) uint64 {
	var m uint64
	for _, n := range names {
		if b, ok := capBits[n]; ok {
			m |= 1 << b
		}
	}
	return m
}

// capSet reads one capability set of pid from /proc/PID/status.
func capSet(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+([0-9a-f]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	v, _ := strconv.ParseUint(string(m[1]), 16, 64)
	return v
}
