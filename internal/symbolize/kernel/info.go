package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
)

// Bounds on sysfs reads. /sys/kernel/notes holds a handful of notes (a few
// hundred bytes); a module's build-id note is 36 bytes.
const (
	maxNotesSize  = 64 << 10
	maxModuleNote = 4 << 10
	maxModuleDirs = 1 << 15
	maxBuildIDLen = 256
)

// Info identifies the running kernel and its loaded modules so that frames
// can be matched to debug files later.
type Info struct {
	Release string            // uname -r
	BuildID string            // hex GNU build id of vmlinux, "" if unknown
	Modules map[string]string // module name -> hex GNU build id
}

// KernelBuildID returns the running kernel's GNU build id from
// SYSFS/kernel/notes, where sysRoot is sysfs's mount point ("" means
// "/sys"). A kernel built without one returns an error wrapping
// buildid.ErrNotFound.
func KernelBuildID(sysRoot string) (string, error) {
	data, err := readBounded(filepath.Join(sysDir(sysRoot), "kernel", "notes"), maxNotesSize)
	if err != nil {
		return "", err
	}
	return buildIDFromNotes(data)
}

// ModuleBuildIDs returns the build id of every loaded module that exposes
// SYSFS/module/NAME/notes/.note.gnu.build-id. Built-in "modules" have no
// notes folder and are left out; so are modules whose note is unreadable or
// malformed, since one bad module should not hide the rest.
func ModuleBuildIDs(sysRoot string) (map[string]string, error) {
	dir := filepath.Join(sysDir(sysRoot), "module")
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(maxModuleDirs)
	if err != nil && err != io.EOF {
		return nil, err
	}
	ids := make(map[string]string)
	for _, name := range names {
		data, err := readBounded(filepath.Join(dir, name, "notes", ".note.gnu.build-id"), maxModuleNote)
		if err != nil {
			continue
		}
		if id, err := buildIDFromNotes(data); err == nil {
			ids[name] = id
		}
	}
	return ids, nil
}

// buildIDFromNotes finds the GNU build id in raw note records as sysfs
// exposes them. The kernel lays out its notes with 4-byte padding, but a
// note section aligned to 8 (as .note.gnu.property forces on some builds)
// pads to 8, so both are tried.
func buildIDFromNotes(data []byte) (string, error) {
	var firstErr error
	for _, align := range []uint64{4, 8} {
		var id []byte
		err := buildid.ParseNotes(data, binary.NativeEndian, align, func(n buildid.Note) bool {
			if n.Name == "GNU" && n.Type == 3 && len(n.Desc) > 0 && len(n.Desc) <= maxBuildIDLen {
				id = n.Desc
				return false
			}
			return true
		})
		if id != nil {
			return buildid.HexString(id), nil
		}
		if err == nil {
			// One padding read every record cleanly: the id is absent, and
			// the other padding's complaint would be misleading.
			return "", fmt.Errorf("kernel notes: %w", buildid.ErrNotFound)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return "", firstErr
}

func sysDir(sysRoot string) string {
	if sysRoot == "" {
		return "/sys"
	}
	return sysRoot
}

// readBounded reads a whole file, refusing ones larger than limit. sysfs
// reports size 4096 for every attribute, so the size is checked on the bytes
// read, not on stat.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes: %w", path, limit, frame.ErrCorruptFile)
	}
	return data, nil
}

// ReadInfo gathers Release, the kernel build id and the modules' build ids.
// A missing build id leaves the field empty rather than failing, because
// the release alone still lets a debug file be found by name.
func ReadInfo(sysRoot string) (Info, error) {
	rel, err := Release()
	if err != nil {
		return Info{}, err
	}
	info := Info{Release: rel}
	id, err := KernelBuildID(sysRoot)
	if err != nil && !errors.Is(err, buildid.ErrNotFound) && !errors.Is(err, os.ErrNotExist) {
		return info, err
	}
	info.BuildID = id
	mods, err := ModuleBuildIDs(sysRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return info, err
	}
	info.Modules = mods
	return info, nil
}
