package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// Under a real RLIMIT_AS of 2 GiB (prlimit on a child of this test), the
// hold's memory limit is what is left of the address space, not 1 GiB.
func TestHoldGCUnderAddressSpaceLimit(t *testing.T) {
	if os.Getenv("PROFSYM_HOLD_CHILD") != "" {
		release := holdGC()
		fmt.Printf("limit=%d\n", debug.SetMemoryLimit(-1))
		release()
		return
	}
	prlimit := testfixture.NeedTool(t, "prlimit")
	cmd := exec.Command(prlimit, "--as=2147483648", os.Args[0], "-test.run=^TestHoldGCUnderAddressSpaceLimit$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PROFSYM_HOLD_CHILD=1", "GOGC=", "GOMEMLIMIT=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, rest, ok := strings.Cut(string(out), "limit=")
	if !ok {
		t.Fatalf("child printed no limit:\n%s", out)
	}
	limit, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
	used, _ := vmSize("/proc/self/status")
	t.Logf("held under a 2 GiB address space: memory limit %d MiB (this process maps %d MiB)", limit>>20, used>>20)
	if limit >= gcHoldLimit {
		t.Errorf("memory limit %d under a 2 GiB RLIMIT_AS: the hold ignores it", limit)
	}
}

func TestCgroupRoom(t *testing.T) {
	write := func(path, s string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		self  string
		files map[string]string
		want  int64
	}{
		{"v2", "0::/a/b\n", map[string]string{
			"a/b/memory.max": "max\n", "a/b/memory.current": "1000\n",
			"a/memory.max": "3000000000\n", "a/memory.current": "1000000000\n"}, 2000000000},
		{"v2 own limit is the least", "0::/a/b\n", map[string]string{
			"a/b/memory.max": "500000000\n", "a/b/memory.current": "100000000\n",
			"a/memory.max": "3000000000\n", "a/memory.current": "1000000000\n"}, 400000000},
		{"v2 unlimited", "0::/a\n", map[string]string{"a/memory.max": "max\n", "a/memory.current": "5\n"}, -1},
		{"v2 namespaced: the mount's root is ours", "0::/../../hidden\n", map[string]string{
			"memory.max": "1073741824\n", "memory.current": "73741824\n"}, 1000000000},
		{"v1", "4:memory:/process_api/x\n1:cpu:/\n", map[string]string{
			"memory/process_api/x/memory.limit_in_bytes": "2147483648\n", "memory/process_api/x/memory.usage_in_bytes": "147483648\n",
			"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "1\n"}, 2000000000},
		{"v1 unlimited", "4:cpuacct,memory:/\n", map[string]string{
			"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "1\n"}, -1},
		{"over its limit", "0::/a\n", map[string]string{"a/memory.max": "100\n", "a/memory.current": "200\n"}, 0},
	} {
		root := t.TempDir()
		for p, s := range c.files {
			write(filepath.Join(root, "fs", p), s)
		}
		write(filepath.Join(root, "cgroup"), c.self)
		if got := cgroupRoom(filepath.Join(root, "cgroup"), filepath.Join(root, "fs")); got != c.want {
			t.Errorf("%s: cgroupRoom = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestVMSize(t *testing.T) {
	n, ok := vmSize("/proc/self/status")
	if !ok || n < 1<<20 {
		t.Errorf("VmSize of this process: %d, %v", n, ok)
	}
}
