package helmtest

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// podman runs rendered workloads of the chart as containers, the way the
// kubelet runs their pods: the container's image, args and env, its
// securityContext (user, capabilities, read-only root, seccomp, no new
// privileges), host PID namespace, memory and CPU limits, and its volumes
// (ConfigMaps and Secrets as files, emptyDirs and claims as directories,
// host paths as host paths). Runtime runc with the host's ulimits: crun,
// and runc with podman's default ulimits, set RLIMIT_NOFILE, which needs
// CAP_SYS_RESOURCE this machine's root lacks.
type podman struct {
	t       *testing.T
	bin     string
	conf    string // CONTAINERS_CONF without default ulimits
	network string
	subnet  string // 10.89.N
	dir     string
	names   []string
}

func newPodman(t *testing.T) *podman {
	testfixture.Short(t, "rootful podman and eBPF")
	t.Helper()
	p := &podman{t: t, bin: testfixture.NeedTool(t, "podman"), dir: t.TempDir()}
	testfixture.NeedTool(t, "runc")
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "running the agent's container needs root (rootful podman, host PID namespace, BPF)")
	}
	p.conf = filepath.Join(p.dir, "containers.conf")
	if err := os.WriteFile(p.conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A network of the test's own: fixed addresses, nothing shared.
	n := 10 + rand.IntN(240)
	p.subnet = fmt.Sprintf("10.89.%d", n)
	p.network = fmt.Sprintf("profsym-test-%d-%d", os.Getpid(), n)
	p.must("network", "create", "--subnet", p.subnet+".0/24", p.network)
	t.Cleanup(func() {
		for _, name := range p.names {
			if t.Failed() {
				out, _ := p.cmd("logs", "--tail", "40", name).CombinedOutput()
				t.Logf("%s log:\n%s", name, out)
			}
			p.cmd("rm", "-f", "-t", "5", name).Run()
		}
		p.cmd("network", "rm", "-f", p.network).Run()
	})
	return p
}

func (p *podman) cmd(args ...string) *exec.Cmd {
	c := exec.Command(p.bin, args...)
	c.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	return c
}

func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.cmd(args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// ip returns the address of host n on the test's network.
func (p *podman) ip(n int) string { return fmt.Sprintf("%s.%d", p.subnet, n) }

// secrets holds Secret contents by name and key: the rendered Secrets,
// plus those a user would create (existingSecret).
type secrets map[string]map[string][]byte

func renderedSecrets(d docs) secrets {
	s := secrets{}
	for _, o := range d {
		if o["kind"] != "Secret" {
			continue
		}
		m := map[string][]byte{}
		for k, v := range mapping(o, "data") {
			b, _ := base64.StdEncoding.DecodeString(fmt.Sprint(v))
			m[k] = b
		}
		s[str(o, "metadata", "name")] = m
	}
	return s
}

// started is a running workload.
type started struct {
	name, ip string
	dirs     map[string]string // volume name -> host directory
}

// run starts the first container of a rendered workload as container name
// at address ip, resolving hosts (service name -> address) as cluster DNS
// would.
func (p *podman) run(d docs, kind, wname, name, ip string, sec secrets, hosts map[string]string) *started {
	t := p.t
	t.Helper()
	w := d.must(t, kind, wname)
	pod := mapping(w, "spec", "template", "spec")
	c := container(w)
	name = fmt.Sprintf("%s-%d", name, os.Getpid())
	ctr := &started{name: name, ip: ip, dirs: map[string]string{}}
	args := []string{"--runtime", "runc", "run", "-d", "--name", name, "--ulimit", "host", "--hostname", wname}
	if pod["hostPID"] == true {
		args = append(args, "--pid", "host")
	}
	args = append(args, "--network", p.network, "--ip", ip)
	for h, a := range hosts {
		args = append(args, "--add-host", h+":"+a)
	}

	sc := mapping(c, "securityContext")
	uid, gid := intOf(get(sc, "runAsUser")), intOf(get(sc, "runAsGroup"))
	if uid >= 0 {
		if gid < 0 {
			gid = 0
		}
		args = append(args, "--user", fmt.Sprintf("%d:%d", uid, gid))
	}
	fsGroup := intOf(get(pod, "securityContext", "fsGroup"))
	if fsGroup >= 0 {
		args = append(args, "--group-add", strconv.Itoa(fsGroup))
	}
	if get(sc, "privileged") == true {
		args = append(args, "--privileged")
	} else {
		if slices.Contains(strs(sc, "capabilities", "drop"), "ALL") {
			args = append(args, "--cap-drop", "ALL")
		}
		if add := strs(sc, "capabilities", "add"); len(add) > 0 {
			args = append(args, "--cap-add", strings.Join(add, ","))
		}
	}
	if get(sc, "allowPrivilegeEscalation") == false {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if get(sc, "readOnlyRootFilesystem") == true {
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	switch str(sc, "seccompProfile", "type") {
	case "Unconfined":
		args = append(args, "--security-opt", "seccomp=unconfined")
	case "RuntimeDefault", "":
	default:
		t.Fatalf("seccomp profile %v not supported here", get(sc, "seccompProfile"))
	}
	if q := get(c, "resources", "limits", "memory"); q != nil {
		args = append(args, "--memory", strconv.FormatInt(quantity(t, fmt.Sprint(q)), 10))
	}
	if q := get(c, "resources", "limits", "cpu"); q != nil {
		args = append(args, "--cpus", cpus(t, fmt.Sprint(q)))
	}

	for n, e := range env(c) {
		v, ok := e["value"].(string)
		switch {
		case ok:
		case str(e, "valueFrom", "fieldRef", "fieldPath") == "status.podIP":
			v = ip
		case str(e, "valueFrom", "fieldRef", "fieldPath") == "spec.nodeName":
			v, _ = os.Hostname()
		case get(e, "valueFrom", "secretKeyRef") != nil:
			ref := mapping(e, "valueFrom", "secretKeyRef")
			b, ok := sec[str(ref, "name")][str(ref, "key")]
			if !ok {
				t.Fatalf("%s: env %s from Secret %s key %s, which nobody made", wname, n, str(ref, "name"), str(ref, "key"))
			}
			v = string(b)
		default:
			t.Fatalf("%s: env %s: %v not supported here", wname, n, e["valueFrom"])
		}
		args = append(args, "-e", n+"="+v)
	}

	owner := uid
	if fsGroup >= 0 && owner < 0 {
		owner = 0
	}
	for _, m := range list(c, "volumeMounts") {
		vname, at := str(m, "name"), str(m, "mountPath")
		src := p.volume(d, w, pod, vname, sec, owner, fsGroup)
		ctr.dirs[vname] = src
		opt := ""
		if get(m, "readOnly") == true {
			opt = ":ro"
		}
		args = append(args, "-v", src+":"+at+opt)
	}
	args = append(args, str(c, "image"))
	args = append(args, strs(c, "args")...)
	p.names = append(p.names, name)
	p.must(args...)
	return ctr
}

// volume materializes one pod volume on the host and returns its path.
func (p *podman) volume(d docs, w obj, pod map[string]any, vname string, sec secrets, owner, group int) string {
	t := p.t
	var vol map[string]any
	for _, v := range list(pod, "volumes") {
		if str(v, "name") == vname {
			vol = v.(map[string]any)
		}
	}
	claim := false
	for _, v := range list(w, "spec", "volumeClaimTemplates") {
		claim = claim || str(v, "metadata", "name") == vname
	}
	dir := filepath.Join(p.dir, str(w, "metadata", "name"), vname)
	write := func(files map[string][]byte) string {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, b := range files {
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	switch {
	case vol == nil && claim, vol != nil && (vol["emptyDir"] != nil || vol["persistentVolumeClaim"] != nil):
		if err := os.MkdirAll(dir, 0o770); err != nil {
			t.Fatal(err)
		}
		if owner >= 0 {
			g := group
			if g < 0 {
				g = owner
			}
			os.Chown(dir, owner, g)
		}
		return dir
	case vol == nil:
		t.Fatalf("volume %s is mounted but not defined", vname)
	case vol["hostPath"] != nil:
		return str(vol, "hostPath", "path")
	case vol["configMap"] != nil:
		data := map[string][]byte{}
		for k, v := range mapping(d.must(t, "ConfigMap", str(vol, "configMap", "name")), "data") {
			data[k] = []byte(fmt.Sprint(v))
		}
		return write(data)
	case vol["secret"] != nil:
		name := str(vol, "secret", "secretName")
		data, ok := sec[name]
		if !ok {
			t.Fatalf("volume %s: Secret %s, which nobody made", vname, name)
		}
		if items := list(vol, "secret", "items"); len(items) > 0 {
			picked := map[string][]byte{}
			for _, it := range items {
				picked[str(it, "path")] = data[str(it, "key")]
			}
			data = picked
		}
		return write(data)
	}
	t.Fatalf("volume %s: %v not supported here", vname, vol)
	return ""
}

func intOf(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	return -1
}

// cpus turns a Kubernetes CPU quantity ("500m", "2") into podman's --cpus.
func cpus(t *testing.T, q string) string {
	if m, ok := strings.CutSuffix(q, "m"); ok {
		n, err := strconv.ParseFloat(m, 64)
		if err != nil {
			t.Fatalf("cpu %q", q)
		}
		return strconv.FormatFloat(n/1000, 'f', 3, 64)
	}
	return q
}

// pid returns the host pid of a container's first process.
func (p *podman) pid(c *started) int {
	n, err := strconv.Atoi(p.must("inspect", "--format", "{{.State.Pid}}", c.name))
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

// ready waits until the container's health_check answers on port, failing
// with its log if it exits first.
func (p *podman) ready(c *started, port int, within time.Duration) {
	p.t.Helper()
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(c.ip, strconv.Itoa(port)))
	for end := time.Now().Add(within); ; time.Sleep(250 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if st := p.must("inspect", "--format", "{{.State.Status}}", c.name); st != "running" {
			out, _ := p.cmd("logs", c.name).CombinedOutput()
			p.t.Fatalf("%s is %s:\n%s", c.name, st, lastLines(out, 40))
		}
		if time.Now().After(end) {
			out, _ := p.cmd("logs", c.name).CombinedOutput()
			p.t.Fatalf("%s not ready on %s within %v:\n%s", c.name, url, within, lastLines(out, 40))
		}
	}
}

func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
