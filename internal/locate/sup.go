package locate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/frame"
)

// Supplementary files (the common file `dwz -m` writes, which
// .gnu_debugaltlink and .debug_sup name) are found like any object, by
// their build id, through every source: debug directories' .build-id
// trees, symbol directories, a symbol store, debuginfod. The name the
// referring file records adds places to look in the debug directories.

// maxSupName bounds a recorded supplementary file name (PATH_MAX).
const maxSupName = 4096

// supPaths returns where a supplementary file recorded as name may be,
// for a file at from that names it: under each debug directory's .dwz/
// (the part of name after its last ".dwz/", or its base name), the name
// itself when it is an absolute path inside a debug directory, and the
// name resolved against from's folder when that stays inside the folder
// or a debug directory. name is untrusted: every path returned is inside
// a debug directory or from's folder.
func supPaths(dirs []string, name, from string) []string {
	if name == "" || len(name) > maxSupName || strings.IndexByte(name, 0) >= 0 {
		return nil
	}
	if b := filepath.Base(name); b == "." || b == ".." || b == "/" || strings.HasSuffix(name, "/") {
		return nil
	}
	var out []string
	add := func(p string) {
		for _, x := range out {
			if x == p {
				return
			}
		}
		out = append(out, p)
	}
	rest := filepath.Base(name)
	if i := strings.LastIndex(name, ".dwz/"); i >= 0 && (i == 0 || name[i-1] == '/') {
		rest = name[i+len(".dwz/"):]
	}
	if r := filepath.Clean(rest); r != "." && r != ".." && !filepath.IsAbs(r) && !strings.HasPrefix(r, "../") {
		for _, d := range dirs {
			add(filepath.Join(d, ".dwz", r))
		}
	}
	roots := append([]string(nil), dirs...)
	var p string
	if filepath.IsAbs(name) {
		p = filepath.Clean(name)
	} else if from != "" {
		roots = append(roots, filepath.Dir(from))
		p = filepath.Join(filepath.Dir(from), name)
	}
	for _, r := range roots {
		if p != "" && within(filepath.Clean(r), p) {
			add(p)
			break
		}
	}
	return out
}

// within reports whether the clean path p is below the clean folder dir.
func within(dir, p string) bool {
	return dir != "" && strings.HasPrefix(p, dir+"/") || dir == "/" && strings.HasPrefix(p, "/") && p != "/"
}

// LocateSup finds the supplementary file whose GNU build id is id (hex)
// and that the file at from records as name, through every source, and
// returns its path. byName (a DWARF 5 .debug_sup link, whose checksum
// need not be a build id) also takes the first file found by name in the
// debug directories, unchecked: the caller checks the checksum. The error
// carries a reason (frame.ErrPending while a download goes on,
// frame.ErrNoDebugInfo when no source has it, ...).
func (c *Chain) LocateSup(ctx context.Context, id, name, from string, byName bool) (string, error) {
	gnu, err := frame.ParseBuildID(id)
	if err != nil {
		return "", err
	}
	q := Query{ID: frame.Identity{GNU: gnu}, SupName: name, SupFrom: from, Since: time.Now()}
	if q.SupName == "" {
		q.SupName = "-" // still a supplementary query: its own cache entry
	}
	res, err := c.Locate(ctx, q)
	if err == nil {
		for _, f := range []*File{res.Debug, res.Bin} {
			if f != nil && f.Score == ScoreDWARF {
				return f.Path, nil
			}
		}
		if res.Pending {
			return "", fmt.Errorf("dwz file %s: %w", gnu, frame.ErrPending)
		}
		err = fmt.Errorf("dwz file %s: %w", gnu, frame.ErrNoDebugInfo)
	}
	if byName {
		for _, s := range c.opt.Sources {
			d, ok := s.(DebugDirs)
			if !ok {
				continue
			}
			dirs := d.Dirs
			if len(dirs) == 0 {
				dirs = []string{debugdirs.DefaultDebugDir}
			}
			for _, p := range supPaths(dirs, name, from) {
				if st, serr := os.Stat(p); serr == nil && st.Mode().IsRegular() {
					return p, nil
				}
			}
		}
	}
	return "", err
}
