// Package cgsel finds the cgroups (v2) that a selection of processes by
// cgroup path covers, as the ids the kernel gives them
// (bpf_get_current_cgroup_id: their directories' inode numbers), and keeps
// that set current as cgroups come and go. The sampler drops every other
// cgroup's samples before walking them.
package cgsel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Hierarchy is the cgroup v2 hierarchy as this process sees it.
type Hierarchy struct {
	// Dir is where it is mounted ("/sys/fs/cgroup", or
	// "/sys/fs/cgroup/unified" on a hybrid host).
	Dir string
	// Root is the cgroup path of Dir, as /proc/PID/cgroup writes paths:
	// "/" unless the mount shows a sub-tree only.
	Root string
}

// Find looks for the cgroup v2 hierarchy in a mountinfo file
// (/proc/self/mountinfo). ok is false on a host that mounts none (cgroup
// v1 only): there, every task is in the root of an invisible hierarchy
// and a cgroup id says nothing. Of several mounts, the one that shows
// the most of the tree wins: in a container with its own cgroup
// namespace, /sys/fs/cgroup shows the container's cgroup only, while the
// host's tree mounted aside (the Helm chart's /host/sys/fs/cgroup) has a
// root above the namespace's ("/../.."); then /sys/fs/cgroup among
// equals.
func Find(mountinfo string) (h Hierarchy, ok bool, err error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return Hierarchy{}, false, err
	}
	defer f.Close() //nolint:errcheck // read only
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, found := strings.Cut(sc.Text(), " - ")
		if !found || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) < 5 {
			continue
		}
		c := Hierarchy{Dir: unescape(fields[4]), Root: unescape(fields[3])}
		if !ok || wider(c, h) {
			h, ok = c, true
		}
	}
	return h, ok, sc.Err()
}

// wider reports whether mount a shows more of the tree than b.
func wider(a, b Hierarchy) bool {
	if ua, ub := ups(a.Root), ups(b.Root); ua != ub {
		return ua > ub
	}
	if len(a.Root) != len(b.Root) {
		return len(a.Root) < len(b.Root)
	}
	return a.Dir == "/sys/fs/cgroup" && b.Dir != "/sys/fs/cgroup"
}

// ups counts the ".." segments of a root: how far above this process's
// cgroup namespace it is.
func ups(root string) int {
	n := 0
	for seg := range strings.SplitSeq(root, "/") {
		if seg == ".." {
			n++
		}
	}
	return n
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Matcher says which cgroups, by path (as /proc/PID/cgroup writes it),
// are selected (Match), and below which ones a selected cgroup may be
// (Below: the others' sub-trees are not read).
type Matcher struct {
	Match, Below func(path string) bool
}

// Scan returns the ids of the cgroups below h that m selects. Cgroups
// removed while it walks are left out.
func (h Hierarchy) Scan(m Matcher) (map[uint64]struct{}, error) {
	ids := map[uint64]struct{}{}
	err := filepath.WalkDir(h.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != h.Dir {
				return nil // removed meanwhile
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(h.Dir, p)
		if err != nil {
			return err
		}
		cg := h.path(filepath.ToSlash(rel))
		if !m.Match(cg) {
			if m.Below != nil && !m.Below(cg) {
				return fs.SkipDir
			}
			return nil // a cgroup below it may still match
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if ino, ok := inode(info); ok {
			ids[ino] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cgroups: scanning %s: %w", h.Dir, err)
	}
	return ids, nil
}

// path is the cgroup path of directory rel (relative to Dir) as
// /proc/PID/cgroup writes it: not cleaned, so that a root above this
// process's cgroup namespace keeps its leading "/.." as there.
func (h Hierarchy) path(rel string) string {
	if rel == "." {
		return h.Root
	}
	if strings.HasSuffix(h.Root, "/") {
		return h.Root + rel
	}
	return h.Root + "/" + rel
}

// Watch rescans h every interval and hands set every new result, until
// ctx ends: a cgroup made later whose path matches is selected within an
// interval. A scan or set that fails is logged and tried again at the
// next interval.
func (h Hierarchy) Watch(ctx context.Context, interval time.Duration, m Matcher,
	set func(map[uint64]struct{}) error, log *zap.Logger,
) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids, err := h.Scan(m)
		if err == nil {
			err = set(ids)
		}
		if err != nil && !failing {
			log.Warn("updating the selected cgroups failed; retrying", zap.Error(err))
		}
		failing = err != nil
	}
}
