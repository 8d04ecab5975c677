package locate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/profsym/profsym/internal/frame"
)

// maxLinks bounds the symbolic links followed while resolving one path, as
// the kernel's ELOOP limit does.
const maxLinks = 40

// InRoot resolves path (absolute, as a process or a profile names it) inside
// root the way the process would see it if root were its "/": ".." stops at
// root, and symbolic links, absolute ones included, are followed within
// root. The result always lies under root; a path that cannot be resolved
// so is an error wrapping frame.ErrInvalidPath. root "" or "/" is this
// machine's own root, where path only needs to be absolute.
//
// This is what makes a path taken from a frame safe to open: "/../x" is
// "/x" inside root, and a link to /etc/shadow inside a host mount is that
// host's shadow file, not ours.
func InRoot(root, path string) (string, error) {
	if !filepath.IsAbs(path) || strings.IndexByte(path, 0) >= 0 {
		return "", fmt.Errorf("path %.200q is not absolute: %w", path, frame.ErrInvalidPath)
	}
	if root == "" || root == "/" {
		return filepath.Clean(path), nil
	}
	root = filepath.Clean(root)
	rest := strings.Split(filepath.Clean(path), "/")
	var done []string // resolved components below root
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := filepath.Join(root, filepath.Join(done...), c)
		st, err := os.Lstat(cur)
		if err != nil {
			// Missing components are the caller's not-found; what is
			// built so far is contained.
			return filepath.Join(append([]string{root, filepath.Join(done...), c}, rest...)...), nil
		}
		if st.Mode()&os.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("path %.200q: too many symbolic links: %w", path, frame.ErrInvalidPath)
		}
		target, err := os.Readlink(cur)
		if err != nil {
			return "", fmt.Errorf("path %.200q: %v: %w", path, err, frame.ErrInvalidPath)
		}
		if filepath.IsAbs(target) {
			done = done[:0]
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, filepath.Join(done...)), nil
}
