package locate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/frame"
)

// Source names, as the processor's `sources` list spells them.
const (
	SourceProc       = "proc"
	SourceLocal      = "local"
	SourceDebugDirs  = "debug_directories"
	SourceSymbolDirs = "symbol_directories"
	SourceStore      = "symbol_store"
	SourceDebuginfod = "debuginfod"
	SourceKernel     = "kernel"
)

// DefaultOrder is the order sources are tried in when none is configured:
// what is on this host first, downloads last.
var DefaultOrder = []string{SourceProc, SourceLocal, SourceDebugDirs, SourceSymbolDirs, SourceStore, SourceDebuginfod, SourceKernel}

// Local opens the mapping's file by its path on this machine, below Root (a
// host mount such as /host; "" for this machine's own files). A base name
// (the upstream profiler's mappings) is tried as the process's executable
// when the resource names one with that base name.
type Local struct {
	Root string
}

func (Local) Name() string { return SourceLocal }

func (l Local) Find(_ context.Context, q *Query) ([]Candidate, error) {
	if q.Kernel {
		return nil, nil
	}
	var paths []string
	add := func(p string) {
		for _, x := range paths {
			if x == p {
				return
			}
		}
		paths = append(paths, p)
	}
	for _, h := range q.Hints {
		if filepath.IsAbs(h.File) {
			add(h.File)
		}
		if filepath.IsAbs(h.ExePath) && (h.File == "" || filepath.Base(h.File) == filepath.Base(h.ExePath)) {
			add(h.ExePath)
		}
	}
	var out []Candidate
	var err error
	for _, p := range paths {
		hp, perr := InRoot(l.Root, p)
		if perr != nil {
			err = perr
			continue
		}
		if _, serr := os.Stat(hp); serr != nil {
			continue
		}
		out = append(out, Candidate{Path: hp, Dir: filepath.Dir(filepath.Clean(p)), HostDir: filepath.Dir(hp)})
	}
	return out, err
}

// DebugDirs looks files up in .build-id trees by GNU build id
// (DIR/.build-id/ab/cdef.debug, and DIR/.build-id/ab/cdef for binaries),
// and the separate debug files of binaries already found by their
// .gnu_debuglink (next to the binary, in its .debug/ folder, and under
// DIR/<binary's folder>/), checked by CRC, as gdb and llvm-symbolizer do.
type DebugDirs struct {
	Dirs []string
}

func (DebugDirs) Name() string { return SourceDebugDirs }

func (d DebugDirs) Find(_ context.Context, q *Query) ([]Candidate, error) {
	var out []Candidate
	if q.ID.GNU != "" { // validated hex: safe in a path
		debug, bins := debugdirs.BuildIDPaths(d.Dirs, q.ID.GNU)
		for _, p := range append(debug, bins...) {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				out = append(out, Candidate{Path: p})
			}
		}
	}
	if q.SupName != "" {
		dirs := d.Dirs
		if len(dirs) == 0 {
			dirs = []string{debugdirs.DefaultDebugDir}
		}
		for _, p := range supPaths(dirs, q.SupName, q.SupFrom) {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				out = append(out, Candidate{Path: p})
			}
		}
	}
	if len(out) > 0 {
		// A debug file by build id is what gdb tries first too; the
		// debuglink search (a CRC over whole files) is for binaries
		// without one there.
		return out, nil
	}
	var firstErr error
	for _, f := range q.Found {
		if !f.Code || f.Score == ScoreDWARF || f.HostDir == "" {
			continue
		}
		p, err := debugdirs.FindLinked(f.Path, f.Dir, f.HostDir, d.Dirs)
		if err == nil {
			out = append(out, Candidate{Path: p, LinkCRC: true})
		} else if errors.Is(err, frame.ErrBuildIDMismatch) && firstErr == nil {
			firstErr = err
		}
	}
	return out, firstErr
}

// Kernel finds vmlinux where distributions install it for a kernel
// release: /usr/lib/debug/boot/vmlinux-REL, /usr/lib/debug/lib/modules/REL/vmlinux,
// /boot/vmlinux-REL, /lib/modules/REL/build/vmlinux. The release comes from
// the frame's resource (os.kernel.release) or this machine's; the build id
// decides whether a file is the one.
type Kernel struct {
	// Release of this machine's kernel, tried when the frame names none.
	Release string
}

func (Kernel) Name() string { return SourceKernel }

func (k Kernel) Find(_ context.Context, q *Query) ([]Candidate, error) {
	if !q.Kernel {
		return nil, nil
	}
	var out []Candidate
	for _, rel := range []string{q.KernelRelease, k.Release} {
		if !validRelease(rel) {
			continue
		}
		for _, p := range []string{
			"/usr/lib/debug/boot/vmlinux-" + rel,
			"/usr/lib/debug/lib/modules/" + rel + "/vmlinux",
			"/boot/vmlinux-" + rel,
			"/lib/modules/" + rel + "/build/vmlinux",
		} {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				out = append(out, Candidate{Path: p})
			}
		}
	}
	return out, nil
}

// validRelease accepts what `uname -r` prints: no path syntax.
func validRelease(s string) bool {
	if s == "" || len(s) > 128 || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '-' || c == '_' || c == '+' || c == '~') {
			return false
		}
	}
	return true
}
