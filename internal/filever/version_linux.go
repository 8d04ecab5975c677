//go:build linux

package filever

import (
	"os"

	"golang.org/x/sys/unix"
)

// Stat returns the version of the file at path (following links), without
// the allocation of an os.FileInfo: the sampler calls it per mapping.
func Stat(path string) (Version, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Version{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fromStat(&st), nil
}

// Fstat returns the open file's version and whether it is a regular file.
func Fstat(f *os.File) (Version, bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Version{}, false, err
	}
	return fromStat(&st), st.Mode&unix.S_IFMT == unix.S_IFREG, nil
}

func fromStat(st *unix.Stat_t) Version {
	return Version{Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano()}
}
