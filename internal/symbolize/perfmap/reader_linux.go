//go:build linux

package perfmap

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// openInRoot opens name below root as if root were "/": the map lives in a
// filesystem the process controls, and an absolute symlink there (say
// /tmp/perf-1.map -> /etc/shadow) must resolve inside the container, not on
// the host. openat2's RESOLVE_IN_ROOT does exactly that; on kernels without
// it (before 5.6) we refuse symlinks in the last component and a /tmp that
// is not a real directory instead.
func openInRoot(root, name string) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
	dirfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(root, name)), nil
	}
	if err != unix.ENOSYS && err != unix.EPERM {
		return nil, &os.PathError{Op: "openat2", Path: filepath.Join(root, name), Err: err}
	}
	// EPERM: seccomp filters (older container runtimes) deny openat2.
	dir, base := filepath.Split(name)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, filepath.Clean(dir), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: filepath.Join(root, dir), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, dir), Err: unix.ENOTDIR}
	}
	fd, err = unix.Openat(dirfd, filepath.Join(dir, base), flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, name)), nil
}
