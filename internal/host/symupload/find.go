package symupload

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/symstore"
)

// Candidate is one mapping seen in a profile: a file of a process, known by
// its GNU build id or, for a Go binary without one, its Go build id.
type Candidate struct {
	PID     int64
	Path    string // as the profile names it: absolute, or a basename (upstream profiler)
	BuildID string // GNU build id, hex
	// GoBuildID is used when BuildID is empty: Go before 1.24, and later
	// with -ldflags=-B=none, links no GNU build id.
	GoBuildID string
	// Start and Limit are the mapping's addresses, when known; they find
	// the exact file through /proc/PID/map_files.
	Start, Limit uint64
}

// Key is what the candidate is stored under: its GNU build id when it has
// one, else its Go build id.
func (c Candidate) Key() (symstore.Key, error) {
	if c.BuildID != "" || c.GoBuildID == "" {
		return symstore.GNUKey(c.BuildID)
	}
	return symstore.GoKey(c.GoBuildID)
}

// maxMapsLines bounds the /proc/PID/maps lines read for a basename match.
const maxMapsLines = 1 << 16

// hostPaths lists where the candidate's file can be opened on this host,
// most exact first: the mapping itself (map_files, even when the file was
// replaced or deleted), the path inside the process's mount namespace, and
// for a basename every mapped file of that name.
func hostPaths(procRoot string, c Candidate) []string {
	if c.PID <= 0 {
		if filepath.IsAbs(c.Path) {
			return []string{c.Path} // a file named without a process (CLI, tests)
		}
		return nil
	}
	dir := filepath.Join(procRoot, strconv.FormatInt(c.PID, 10))
	out := normalize.OpenPaths(dir, c.Start, c.Limit, c.Path)
	if c.Path != "" && !strings.Contains(c.Path, "/") {
		if f, err := os.Open(filepath.Join(dir, "maps")); err == nil {
			sc := bufio.NewScanner(f)
			for n := 0; sc.Scan() && n < maxMapsLines; n++ {
				fields := strings.Fields(sc.Text())
				if len(fields) >= 6 && filepath.Base(fields[5]) == c.Path && filepath.IsAbs(fields[5]) {
					p := filepath.Join(dir, "root", fields[5])
					if len(out) == 0 || out[len(out)-1] != p {
						out = append(out, p)
					}
				}
			}
			f.Close()
		}
	}
	return out
}

// Source is what to upload for a build id.
type Source struct {
	Path   string // the file whose sections are extracted
	Binary string // the binary it belongs to (== Path when it has its own symbols)
	Size   int64
}

// FindSource opens the candidate's binary on this host, checks it is the
// build the profile names, and returns the file that carries its symbols:
// the binary itself, or its separate debug file (by build id under the
// debug directories, the process's own /usr/lib/debug, or .gnu_debuglink).
// A candidate known by Go build id only must carry its own symbols (Go
// binaries keep .gopclntab even when stripped). Errors wrap
// frame.ErrNotFound (no such file any more), frame.ErrBuildIDMismatch or
// frame.ErrNoDebugInfo.
func FindSource(procRoot string, c Candidate, debugDirs []string) (Source, error) {
	key, err := c.Key()
	if err != nil {
		return Source{}, err
	}
	var want []byte
	if key.NS == symstore.NSBuildID {
		if want, err = buildid.ParseHex(key.ID); err != nil {
			return Source{}, fmt.Errorf("%w: %v", frame.ErrInvalidBuildID, err)
		}
	}
	var lastErr error = fmt.Errorf("%s: %w", c.Path, frame.ErrNotFound)
	for _, p := range hostPaths(procRoot, c) {
		f, err := elfx.Open(p)
		if err != nil {
			continue
		}
		if got, ok := sameBuild(f, key); !ok {
			f.Close()
			lastErr = fmt.Errorf("%s has build id %s, the profile says %s: %w", p, got, key, frame.ErrBuildIDMismatch)
			continue
		}
		if keepdebug.HasSymbols(f) {
			size := int64(len(f.Bytes()))
			f.Close()
			return Source{Path: p, Binary: p, Size: size}, nil
		}
		if want == nil {
			f.Close()
			lastErr = fmt.Errorf("%s: no symbols, and no GNU build id to find a debug file by: %w", p, frame.ErrNoDebugInfo)
			continue
		}
		dirs := append([]string(nil), debugDirs...)
		if c.PID > 0 {
			dirs = append(dirs, filepath.Join(procRoot, strconv.FormatInt(c.PID, 10), "root", debugdirs.DefaultDebugDir))
		}
		dbg, derr := debugdirs.Find(p, f, want, dirs)
		f.Close()
		if derr != nil {
			lastErr = derr
			continue
		}
		df, err := elfx.Open(dbg)
		if err != nil {
			lastErr = err
			continue
		}
		ok := keepdebug.HasSymbols(df)
		size := int64(len(df.Bytes()))
		df.Close()
		if ok {
			return Source{Path: dbg, Binary: p, Size: size}, nil
		}
		lastErr = fmt.Errorf("%s: %w", dbg, frame.ErrNoDebugInfo)
	}
	return Source{}, lastErr
}

// sameBuild reports whether f is the build key names, and what f says.
func sameBuild(f *elfx.File, key symstore.Key) (string, bool) {
	if key.NS == symstore.NSGoBuildID {
		got, _ := buildid.Go(f)
		return fmt.Sprintf("go:%.100q", got), got == key.GoBuildID()
	}
	got, _ := buildid.GNU(f)
	return buildid.HexString(got), buildid.HexString(got) == key.ID
}
