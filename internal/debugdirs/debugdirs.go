// Package debugdirs finds the separate debug file of a binary the way gdb
// and llvm-symbolizer do: first by GNU build id under the debug directories,
// then by the .gnu_debuglink name and CRC next to the binary. A candidate
// that belongs to another build is never returned.
package debugdirs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
)

// DefaultDebugDir is where distributions install debug files.
const DefaultDebugDir = "/usr/lib/debug"

// maxLinkName bounds the .gnu_debuglink file name (a file name, so NAME_MAX).
const maxLinkName = 255

// DebugLink returns the file name and CRC32 recorded in f's .gnu_debuglink.
func DebugLink(f *elfx.File) (name string, crc uint32, ok bool) {
	data, err := f.SectionData(".gnu_debuglink")
	if err != nil {
		return "", 0, false
	}
	return ParseDebugLink(data, f.ByteOrder)
}

// ParseDebugLink decodes .gnu_debuglink contents: a NUL-terminated file name,
// zero padding to a 4-byte boundary, then the CRC32 of the debug file in the
// object's byte order. Names with a path separator are refused: the name is
// joined to directories we search, and must not walk out of them.
func ParseDebugLink(data []byte, order binary.ByteOrder) (name string, crc uint32, ok bool) {
	n := bytes.IndexByte(data, 0)
	if n <= 0 || n > maxLinkName {
		return "", 0, false
	}
	name = string(data[:n])
	if name == "." || name == ".." || bytes.ContainsRune(data[:n], '/') {
		return "", 0, false
	}
	off := (n + 1 + 3) &^ 3
	if off+4 > len(data) {
		return "", 0, false
	}
	return name, order.Uint32(data[off:]), true
}

// FileCRC computes the CRC gdb checks a debuglink against: the standard
// IEEE CRC-32 (gdb's gnu_debuglink_crc32 is the zlib polynomial) over the
// whole file. Only a regular file within elfx's default size cap is read
// (never a FIFO, which would block, nor a sparse terabyte).
func FileCRC(path string) (uint32, error) {
	fh, _, err := elfx.OpenRegular(path, elfx.DefaultMaxFileBytes)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	h := crc32.NewIEEE()
	if _, err := io.Copy(h, fh); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

// BuildIDPaths returns where a debug file (DIR/.build-id/ab/cdef.debug) and
// a binary (DIR/.build-id/ab/cdef, where distributions link one) with the
// GNU build id hexID would be, for each directory. hexID must be validated
// hex (frame.ParseBuildID): it becomes part of the paths.
func BuildIDPaths(dirs []string, hexID string) (debug, bins []string) {
	if len(hexID) < 3 {
		return nil, nil
	}
	if len(dirs) == 0 {
		dirs = []string{DefaultDebugDir}
	}
	for _, d := range dirs {
		p := filepath.Join(d, ".build-id", hexID[:2], hexID[2:])
		debug = append(debug, p+".debug")
		bins = append(bins, p)
	}
	return debug, bins
}

// FindLinked returns the debug file a binary names in its .gnu_debuglink,
// checked by CRC: NAME in the binary's folder, in its .debug/ subfolder, then
// in DIR/<folder>/ for each debug directory. binPath is where the binary can
// be read here; dir is its folder as its process saw it (an absolute path),
// hostDir where that folder is reachable here (the same on this machine; a
// host mount or /proc/PID/root/... otherwise). A link whose CRC matches no
// candidate is frame.ErrBuildIDMismatch when some candidate existed, else
// frame.ErrNoDebugInfo.
func FindLinked(binPath, dir, hostDir string, debugDirs []string) (string, error) {
	f, err := elfx.Open(binPath)
	if err != nil {
		return "", err
	}
	name, crc, ok := DebugLink(f)
	buildID, _ := buildid.GNU(f)
	f.Close()
	if !ok {
		return "", fmt.Errorf("%s has no .gnu_debuglink: %w", binPath, frame.ErrNoDebugInfo)
	}
	if len(debugDirs) == 0 {
		debugDirs = []string{DefaultDebugDir}
	}
	seen := []string{filepath.Clean(dir)}
	if hostDir == dir {
		// On this machine, the folder's resolved path counts too (a
		// symlinked /lib is common).
		if real, err := filepath.EvalSymlinks(dir); err == nil && real != seen[0] {
			seen = append(seen, real)
		}
	}
	cands := []string{filepath.Join(hostDir, name), filepath.Join(hostDir, ".debug", name)}
	for _, d := range debugDirs {
		for _, sd := range seen {
			if filepath.IsAbs(sd) {
				cands = append(cands, filepath.Join(d, sd, name))
			}
		}
	}
	var rejected []string
	for _, p := range cands {
		if ok, why := linkedMatches(p, binPath, crc, buildID); ok {
			return p, nil
		} else if why != "" {
			rejected = append(rejected, why)
		}
	}
	if len(rejected) > 0 {
		return "", fmt.Errorf("debug file for %s: candidates of another build: %v: %w", binPath, rejected, frame.ErrBuildIDMismatch)
	}
	return "", fmt.Errorf("debug file %s for %s: %w", name, binPath, frame.ErrNoDebugInfo)
}

// linkedMatches checks a debuglink candidate: a regular file other than the
// binary, with the CRC the link records and, when both carry one, the
// binary's build id.
func linkedMatches(p, binPath string, crc uint32, buildID []byte) (bool, string) {
	st, err := os.Stat(p)
	if err != nil || !st.Mode().IsRegular() || isSameFile(p, binPath) {
		return false, ""
	}
	got, err := FileCRC(p)
	if err != nil {
		return false, ""
	}
	if got != crc {
		return false, fmt.Sprintf("%s (CRC %08x, link wants %08x)", p, got, crc)
	}
	if len(buildID) == 0 {
		return true, ""
	}
	cf, err := elfx.Open(p)
	if err != nil {
		return false, ""
	}
	defer cf.Close()
	id, err := buildid.GNU(cf)
	if errors.Is(err, buildid.ErrNotFound) {
		return true, "" // an old debug file without an id; the CRC vouches for it
	}
	if err != nil || !bytes.Equal(id, buildID) {
		return false, fmt.Sprintf("%s (build id %x)", p, id)
	}
	return true, ""
}

// Find returns the debug file of the binary at binPath (opened as f; f may
// be nil to search by build id only) as gdb and llvm-symbolizer search for
// it: by build id under the debug directories, then by .gnu_debuglink (see
// FindLinked). buildID is the binary's GNU build id, or nil to read it from
// f. A candidate of another build is never returned: failure wraps
// frame.ErrBuildIDMismatch when every candidate found was of another build,
// and frame.ErrNoDebugInfo when there was none.
func Find(binPath string, f *elfx.File, buildID []byte, debugDirs []string) (string, error) {
	if buildID == nil && f != nil {
		buildID, _ = buildid.GNU(f) // absent: debuglink only
	}
	var rejected []string
	if len(buildID) >= 2 {
		debug, _ := BuildIDPaths(debugDirs, buildid.HexString(buildID))
		for _, p := range debug {
			st, err := os.Stat(p)
			if err != nil || !st.Mode().IsRegular() {
				continue
			}
			cf, err := elfx.Open(p)
			if err != nil {
				continue
			}
			id, _ := buildid.GNU(cf)
			cf.Close()
			if bytes.Equal(id, buildID) {
				return p, nil
			}
			rejected = append(rejected, fmt.Sprintf("%s (build id %x)", p, id))
		}
	}
	if f != nil && binPath != "" {
		abs, err := filepath.Abs(binPath)
		if err == nil {
			p, err := FindLinked(binPath, filepath.Dir(abs), filepath.Dir(abs), debugDirs)
			if err == nil {
				return p, nil
			}
			if errors.Is(err, frame.ErrBuildIDMismatch) {
				return "", err
			}
		}
	}
	if len(rejected) > 0 {
		return "", fmt.Errorf("debug file for %s: candidates of another build: %v: %w", binPath, rejected, frame.ErrBuildIDMismatch)
	}
	return "", fmt.Errorf("debug file for %s: %w", binPath, frame.ErrNoDebugInfo)
}

func isSameFile(a, b string) bool {
	if b == "" {
		return false
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
