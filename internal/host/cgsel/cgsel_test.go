package cgsel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

func TestFind(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "mountinfo")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hybrid := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	h, ok, err := Find(write(hybrid))
	if err != nil || !ok || h != (Hierarchy{Dir: "/sys/fs/cgroup/unified", Root: "/"}) {
		t.Errorf("hybrid: %+v %v %v", h, ok, err)
	}
	unified := `50 40 0:38 /kubepods /host\040cg rw - cgroup2 cgroup2 rw
51 40 0:38 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
`
	h, ok, err = Find(write(unified))
	if err != nil || !ok || h != (Hierarchy{Dir: "/sys/fs/cgroup", Root: "/"}) {
		t.Errorf("unified: %+v %v %v", h, ok, err)
	}
	h, ok, err = Find(write(strings.SplitN(unified, "\n", 2)[0] + "\n"))
	if err != nil || !ok || h != (Hierarchy{Dir: "/host cg", Root: "/kubepods"}) {
		t.Errorf("sub-tree: %+v %v %v", h, ok, err)
	}
	// In a pod with its own cgroup namespace: the host's tree mounted aside.
	pod := `60 50 0:38 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw
61 50 0:38 /../../.. /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw
62 50 0:38 /.. /other ro - cgroup2 cgroup2 rw
63 50 0:38 /../.. /more ro - cgroup2 cgroup2 rw
`
	h, ok, err = Find(write(pod))
	if err != nil || !ok || h != (Hierarchy{Dir: "/host/sys/fs/cgroup", Root: "/../../.."}) {
		t.Errorf("pod: %+v %v %v", h, ok, err)
	}
	h, ok, err = Find(write("63 50 0:38 /../.. /more ro - cgroup2 cgroup2 rw\n62 50 0:38 /.. /other ro - cgroup2 cgroup2 rw\n"))
	if err != nil || !ok || h.Dir != "/more" {
		t.Errorf("two levels above the namespace over one: %+v %v %v", h, ok, err)
	}
	h = Hierarchy{Dir: "/host/sys/fs/cgroup", Root: "/../../.."}
	if got := h.path("kubepods/pod1"); got != "/../../../kubepods/pod1" {
		t.Errorf("path below a root above the namespace: %s", got)
	}
	v1 := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
`
	if h, ok, err := Find(write(v1)); err != nil || ok {
		t.Errorf("v1: %+v %v %v", h, ok, err)
	}
}

// Scan matches a directory's path as /proc/PID/cgroup writes it, under the
// mount's root, and gives its inode number.
func TestScanPaths(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a/x", "a/y", "b/a"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	ids, err := Hierarchy{Dir: dir, Root: "/r"}.Scan(Matcher{Match: func(p string) bool {
		seen = append(seen, p)
		return strings.HasPrefix(p, "/r/a")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "/r /r/a /r/a/x /r/a/y /r/b /r/b/a" {
		t.Errorf("paths matched: %s", got)
	}
	if len(ids) != 3 {
		t.Errorf("%d ids, want 3 (a, a/x, a/y)", len(ids))
	}
	// Below prunes: /r/b's sub-tree is not read.
	seen = nil
	pruned, err := Hierarchy{Dir: dir, Root: "/r"}.Scan(Matcher{
		Match: func(p string) bool { seen = append(seen, p); return strings.HasPrefix(p, "/r/a") },
		Below: func(p string) bool { return strings.HasPrefix("/r/a", p) }, //nolint:gocritic // p is a prefix of the target
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "/r /r/a /r/a/x /r/a/y /r/b" || len(pruned) != 3 {
		t.Errorf("pruned walk: %s, %d ids", got, len(pruned))
	}
	fi, _ := os.Stat(filepath.Join(dir, "a/x"))
	ino, _ := inode(fi)
	if _, ok := ids[ino]; !ok {
		t.Errorf("a/x's inode %d not in %v", ino, ids)
	}
}

// On the real cgroup fs, a cgroup made after the first scan is found by the
// next one, and one removed is gone from it.
func TestScanCgroupFS(t *testing.T) {
	testfixture.Short(t, "cgroup v2")
	h, ok, err := Find("/proc/self/mountinfo")
	if err != nil || !ok {
		testfixture.SkipOrFail(t, "no cgroup v2 hierarchy: %v", err)
	}
	parent := testfixture.NewCgroup(t)
	match := Matcher{Match: func(p string) bool { return strings.HasPrefix(p, parent.Path) }}
	ids, err := h.Scan(match)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ids[parent.ID(t)]; !ok || len(ids) != 1 {
		t.Fatalf("scan: %v, want just %d", ids, parent.ID(t))
	}
	child := testfixture.NewCgroup(t, parent.Path)
	ids, err = h.Scan(match)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ids[child.ID(t)]; !ok || len(ids) != 2 {
		t.Fatalf("rescan: %v, want %d and %d", ids, parent.ID(t), child.ID(t))
	}
}
