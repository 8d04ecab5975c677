package testfixture

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MemoryCgroup is a memory cgroup made for one test: processes moved into
// it share its limit, as a container's do, and the kernel's OOM killer acts
// on them when they pass it.
type MemoryCgroup struct {
	Dir string
	v2  bool
}

// NewMemoryCgroup creates a memory cgroup of limit bytes below this
// process's own (cgroup v1's memory hierarchy, or v2 with the memory
// controller), removed when the test ends. It skips, or fails under CI,
// where neither can be made.
func NewMemoryCgroup(t testing.TB, limit int64) *MemoryCgroup {
	t.Helper()
	name := fmt.Sprintf("profsym-test-%08x", rand.Uint32())
	var cg *MemoryCgroup
	var why []string
	if parent, ok := ownCgroup("memory"); ok {
		cg = &MemoryCgroup{Dir: filepath.Join("/sys/fs/cgroup/memory", parent, name)}
		if err := cg.make("memory.limit_in_bytes", limit); err != nil {
			why, cg = append(why, "v1: "+err.Error()), nil
		}
	}
	if cg == nil {
		if parent, ok := ownCgroup(""); ok {
			root := "/sys/fs/cgroup"
			if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
				root = "/sys/fs/cgroup/unified"
			}
			cg = &MemoryCgroup{Dir: filepath.Join(root, parent, name), v2: true}
			if err := cg.make("memory.max", limit); err != nil {
				why, cg = append(why, "v2: "+err.Error()), nil
			}
		}
	}
	if cg == nil {
		SkipOrFail(t, "cannot make a memory cgroup (root and a writable cgroup fs are needed): %s", strings.Join(why, "; "))
		return nil
	}
	t.Cleanup(func() {
		// Wait for its processes to be gone: rmdir fails until then.
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if err := os.Remove(cg.Dir); err == nil || time.Now().After(end) {
				return
			}
		}
	})
	return cg
}

func (c *MemoryCgroup) make(limitFile string, limit int64) error {
	if err := os.Mkdir(c.Dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		os.Remove(c.Dir)
		return err
	}
	return nil
}

// ownCgroup returns this process's cgroup path in the v1 hierarchy of
// controller, or in the v2 hierarchy for "".
func ownCgroup(controller string) (string, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2], true
		}
		if controller != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					return parts[2], true
				}
			}
		}
	}
	return "", false
}

// Wrap returns a command line that moves itself into the cgroup and then
// runs argv, so that argv and its children start inside it.
func (c *MemoryCgroup) Wrap(argv ...string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.Dir, "cgroup.procs")}, argv...)
}

// Stats reads the cgroup's memory: its current and peak usage (peak is 0
// where the kernel does not keep it), and how many processes the OOM
// killer ended in it.
func (c *MemoryCgroup) Stats() (usage, peak, oomKills int64) {
	read := func(name string) int64 {
		b, _ := os.ReadFile(filepath.Join(c.Dir, name))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	field := func(name, key string) int64 {
		b, _ := os.ReadFile(filepath.Join(c.Dir, name))
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	if c.v2 {
		return read("memory.current"), read("memory.peak"), field("memory.events", "oom_kill")
	}
	return read("memory.usage_in_bytes"), read("memory.max_usage_in_bytes"), field("memory.oom_control", "oom_kill")
}

// Cgroup is a cgroup v2 made for one test, with no controller: a place to
// put processes that a test selects, or not, by cgroup.
type Cgroup struct {
	Dir  string // its directory
	Path string // its path as /proc/PID/cgroup writes it
}

// NewCgroup creates a cgroup v2 below this process's own (below parent
// when given, a path as /proc/PID/cgroup writes it), removed when the test
// ends. It skips, or fails under CI, where none can be made.
func NewCgroup(t testing.TB, parent ...string) *Cgroup {
	t.Helper()
	own, ok := ownCgroup("")
	if len(parent) > 0 {
		own = parent[0]
	}
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		root = "/sys/fs/cgroup/unified"
	}
	if !ok {
		SkipOrFail(t, "no cgroup v2 hierarchy in /proc/self/cgroup")
		return nil
	}
	p := filepath.Join(own, fmt.Sprintf("profsym-test-%08x", rand.Uint32()))
	c := &Cgroup{Dir: filepath.Join(root, p), Path: p}
	if err := os.Mkdir(c.Dir, 0o755); err != nil {
		SkipOrFail(t, "cannot make a cgroup (root and a writable cgroup v2 fs are needed): %v", err)
		return nil
	}
	t.Cleanup(func() {
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if err := os.Remove(c.Dir); err == nil || time.Now().After(end) {
				return
			}
		}
	})
	return c
}

// Wrap returns a command line that moves itself into the cgroup and then
// runs argv, so that argv and its children start inside it.
func (c *Cgroup) Wrap(argv ...string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.Dir, "cgroup.procs")}, argv...)
}
