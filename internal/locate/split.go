package locate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/frame"
)

// Split DWARF (-gsplit-dwarf) keeps an object's functions in .dwo files,
// one per compilation unit, named by each skeleton unit (DW_AT_dwo_name,
// relative to DW_AT_comp_dir), or in one .dwp package beside the binary.
// Neither has a build id: they are found by name, beside the object's
// files, in the debug directories and in the symbol directories; the
// engine checks each unit's dwo id. Names come from the object's DWARF:
// every path built from them stays inside the object's folders, a debug
// directory or a symbol directory.

// maxDWOName bounds a recorded .dwo name (PATH_MAX).
const maxDWOName = 4096

// LocateSplit returns the path of the file holding an object's split
// units: with dwoName empty its package (FILE.dwp beside one of files, the
// object's binary and debug file, or that name in a symbol directory),
// else the .dwo a skeleton unit names (dwoName, relative to compDir).
func (c *Chain) LocateSplit(ctx context.Context, files []string, dwoName, compDir string) (string, error) {
	var debugDirs, symbolDirs []string
	var symdirs []*SymbolDirs
	for _, s := range c.opt.Sources {
		switch s := s.(type) {
		case DebugDirs:
			debugDirs = append(debugDirs, s.Dirs...)
			if len(s.Dirs) == 0 {
				debugDirs = append(debugDirs, debugdirs.DefaultDebugDir)
			}
		case *SymbolDirs:
			symdirs = append(symdirs, s)
			symbolDirs = append(symbolDirs, s.dirs...)
		}
	}
	var cands, names []string
	if dwoName == "" {
		for _, f := range files {
			if f != "" {
				cands = append(cands, f+".dwp")
				names = append(names, filepath.Base(f)+".dwp")
			}
		}
	} else {
		cands = dwoPaths(files, debugDirs, symbolDirs, dwoName, compDir)
		if b := filepath.Base(dwoName); validName(b) {
			names = append(names, b)
		}
	}
	for _, p := range cands {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	for _, d := range symdirs {
		for _, n := range names {
			if ps := d.byName(n); len(ps) > 0 {
				return ps[0], nil
			}
		}
	}
	what := dwoName
	if what == "" {
		what = "package (.dwp)"
	}
	return "", fmt.Errorf("split DWARF %.200q: %w", what, frame.ErrNotFound)
}

// dwoPaths lists where the .dwo a skeleton names may be: compDir/dwoName
// (where the compiler wrote it), dwoName and its base name beside the
// object's files, and dwoName under each debug directory (DIR/compDir/
// dwoName, as gdb looks). Only paths inside an object's folder, a debug
// directory or a symbol directory are kept.
func dwoPaths(files, debugDirs, symbolDirs []string, dwoName, compDir string) []string {
	if dwoName == "" || len(dwoName) > maxDWOName || len(compDir) > maxDWOName ||
		strings.IndexByte(dwoName, 0) >= 0 || strings.IndexByte(compDir, 0) >= 0 || !validName(filepath.Base(dwoName)) {
		return nil
	}
	var roots []string
	for _, f := range files {
		if f != "" {
			roots = append(roots, filepath.Dir(filepath.Clean(f)))
		}
	}
	roots = append(append(roots, debugDirs...), symbolDirs...)
	var out []string
	add := func(p string) {
		p = filepath.Clean(p)
		for _, x := range out {
			if x == p {
				return
			}
		}
		for _, r := range roots {
			if within(filepath.Clean(r), p) {
				out = append(out, p)
				return
			}
		}
	}
	switch {
	case filepath.IsAbs(dwoName):
		add(dwoName)
	case filepath.IsAbs(compDir):
		add(filepath.Join(compDir, dwoName))
	}
	for _, f := range files {
		if f == "" {
			continue
		}
		dir := filepath.Dir(filepath.Clean(f))
		if !filepath.IsAbs(dwoName) {
			add(filepath.Join(dir, dwoName))
		}
		add(filepath.Join(dir, filepath.Base(dwoName)))
	}
	for _, d := range debugDirs {
		switch {
		case filepath.IsAbs(dwoName):
			add(filepath.Join(d, dwoName))
		case filepath.IsAbs(compDir):
			add(filepath.Join(d, compDir, dwoName))
		}
	}
	return out
}

// validName accepts a file name: not empty, ".", ".." or a path.
func validName(b string) bool {
	return b != "" && b != "." && b != ".." && b != "/" && !strings.ContainsRune(b, '/')
}
