package helmtest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// startRendered runs the built distribution as a rendered workload's
// container runs, as a process: its configuration, args and literal env;
// every volume it mounts at a temporary directory standing for the mount
// path (ConfigMaps and Secrets written out, emptyDirs and claims empty);
// MY_POD_IP and 0.0.0.0 listeners on a loopback address of its own
// (127.x.y.z: the chart's fixed ports cannot collide with other tests).
// It waits until every port in ports listens and returns that address and
// the directory of each volume.
func startRendered(t *testing.T, bin string, d docs, kind, name string, sec secrets, ports ...int) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(250), 1+rand.IntN(250))
	w := d.must(t, kind, name)
	c := container(w)
	cm := ""
	vols := map[string]string{} // volume name -> directory
	mounts := map[string]string{}
	for _, v := range list(w, "spec", "template", "spec", "volumes") {
		vdir := filepath.Join(dir, str(v, "name"))
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			t.Fatal(err)
		}
		vols[str(v, "name")] = vdir
		files := map[string][]byte{}
		switch {
		case get(v, "configMap") != nil:
			cm = str(v, "configMap", "name")
			continue // the configuration, written below
		case get(v, "secret") != nil:
			data, ok := sec[str(v, "secret", "secretName")]
			if !ok {
				t.Fatalf("%s mounts Secret %s, which nobody made", name, str(v, "secret", "secretName"))
			}
			files = data
			if items := list(v, "secret", "items"); len(items) > 0 {
				files = map[string][]byte{}
				for _, it := range items {
					files[str(it, "path")] = data[str(it, "key")]
				}
			}
		}
		for f, b := range files {
			if err := os.WriteFile(filepath.Join(vdir, f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tmpl := range list(w, "spec", "volumeClaimTemplates") {
		vdir := filepath.Join(dir, str(tmpl, "metadata", "name"))
		os.MkdirAll(vdir, 0o755)
		vols[str(tmpl, "metadata", "name")] = vdir
	}
	for _, m := range list(c, "volumeMounts") {
		if v, ok := vols[str(m, "name")]; ok {
			mounts[str(m, "mountPath")] = v
		}
	}
	// Longest mount path first, so /a/b is not rewritten as /a.
	var paths []string
	for p := range mounts {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	local := func(s string) string {
		for _, p := range paths {
			s = strings.ReplaceAll(s, p+"/", mounts[p]+"/")
			if s == p {
				s = mounts[p]
			}
		}
		return s
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(local(str(d.must(t, "ConfigMap", cm), "data", "config.yaml"))), 0o644); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range strs(c, "args") {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + cfg
		}
		args = append(args, a)
	}
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "MY_POD_IP=" + ip, "HOST_NAME=node-1"}
	for n, e := range env(c) {
		v, ok := e["value"].(string)
		if !ok {
			if ref := mapping(e, "valueFrom", "secretKeyRef"); ref != nil {
				v, ok = string(sec[str(ref, "name")][str(ref, "key")]), true
			}
		}
		if ok {
			environ = append(environ, n+"="+strings.Replace(local(v), "0.0.0.0", ip, 1))
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = environ, dir
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, lastLines(log.Bytes(), 30))
		}
	})
	for _, port := range ports {
		addr := net.JoinHostPort(ip, fmt.Sprint(port))
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if conn, err := net.Dial("tcp", addr); err == nil {
				conn.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("%s exited:\n%s", name, log.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not listen on %s:\n%s", name, addr, log.String())
			}
		}
	}
	return ip, vols
}
