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

// Find returns the path of the debug file for the binary at binPath (opened
// as f; f may be nil to search by build id only). buildID is the binary's
// GNU build id, or nil to read it from f. debugDirs defaults to
// DefaultDebugDir. Search order, as gdb and llvm-symbolizer:
//
//  1. <dir>/.build-id/ab/cdef….debug for each debug dir;
//  2. the .gnu_debuglink name in the binary's folder, in its .debug/
//     subfolder, then in <dir>/<binary's absolute folder>/ for each dir,
//     accepted only if the file's CRC32 matches the link.
//
// Any candidate whose own GNU build id differs from the binary's is skipped.
// Failure wraps frame.ErrBuildIDMismatch when every candidate found was of
// another build, and frame.ErrNoDebugInfo when there was none.
func Find(binPath string, f *elfx.File, buildID []byte, debugDirs []string) (string, error) {
	if len(debugDirs) == 0 {
		debugDirs = []string{DefaultDebugDir}
	}
	if buildID == nil && f != nil {
		buildID, _ = buildid.GNU(f) // absent: debuglink only
	}
	var rejected []string
	accept := func(p string, wantCRC *uint32) bool {
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() || isSameFile(p, binPath) {
			return false
		}
		if wantCRC != nil {
			crc, err := FileCRC(p)
			if err != nil {
				return false
			}
			if crc != *wantCRC {
				rejected = append(rejected, fmt.Sprintf("%s (CRC %08x, link wants %08x)", p, crc, *wantCRC))
				return false
			}
		}
		if len(buildID) == 0 {
			return true
		}
		cf, err := elfx.Open(p)
		if err != nil {
			return false
		}
		defer cf.Close()
		id, err := buildid.GNU(cf)
		if errors.Is(err, buildid.ErrNotFound) && wantCRC != nil {
			return true // an old debug file without an id; the CRC vouches for it
		}
		if err != nil || !bytes.Equal(id, buildID) {
			rejected = append(rejected, fmt.Sprintf("%s (build id %x)", p, id))
			return false
		}
		return true
	}

	if len(buildID) >= 2 {
		hexID := buildid.HexString(buildID)
		for _, d := range debugDirs {
			p := filepath.Join(d, ".build-id", hexID[:2], hexID[2:]+".debug")
			if accept(p, nil) {
				return p, nil
			}
		}
	}

	if f != nil {
		if name, crc, ok := DebugLink(f); ok {
			for _, dir := range binDirs(binPath) {
				cands := []string{filepath.Join(dir, name), filepath.Join(dir, ".debug", name)}
				for _, d := range debugDirs {
					cands = append(cands, filepath.Join(d, dir, name))
				}
				for _, p := range cands {
					if accept(p, &crc) {
						return p, nil
					}
				}
			}
		}
	}
	if len(rejected) > 0 {
		return "", fmt.Errorf("debug file for %s: candidates of another build: %v: %w", binPath, rejected, frame.ErrBuildIDMismatch)
	}
	return "", fmt.Errorf("debug file for %s: %w", binPath, frame.ErrNoDebugInfo)
}

// binDirs returns the binary's absolute folder, then the folder of its
// resolved path if that differs (a symlinked /lib is common).
func binDirs(binPath string) []string {
	if binPath == "" {
		return nil
	}
	abs, err := filepath.Abs(binPath)
	if err != nil {
		return nil
	}
	dirs := []string{filepath.Dir(abs)}
	if real, err := filepath.EvalSymlinks(abs); err == nil && filepath.Dir(real) != dirs[0] {
		dirs = append(dirs, filepath.Dir(real))
	}
	return dirs
}

func isSameFile(a, b string) bool {
	if b == "" {
		return false
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
