//go:build unix

package elfx

import (
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps a regular file read-only. The descriptor is closed once
// mapped: the mapping keeps the file readable and costs no descriptor.
func mapFile(path string, maxBytes int64) ([]byte, func([]byte) error, error) {
	fd, size, err := openRegular(path, maxBytes)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "mmap", Path: path, Err: err}
	}
	return data, unix.Munmap, nil
}

// dropPages unmaps the pages of a read-only shared file mapping from this
// process; the page cache keeps them.
func dropPages(data []byte) {
	_ = unix.Madvise(data, unix.MADV_DONTNEED)
}

// OpenRegular opens path for reading if it is a regular file of at most
// maxBytes bytes, with the checks of OpenContext: a FIFO, device, socket or
// folder wraps frame.ErrInvalidPath and never blocks the open, a larger
// file wraps frame.ErrLimitExceeded, an empty one frame.ErrCorruptFile. It
// returns the file and its size. For files read as a stream (CRCs, hashes).
func OpenRegular(path string, maxBytes int64) (*os.File, int64, error) {
	fd, size, err := openRegular(path, maxBytes)
	if err != nil {
		return nil, 0, err
	}
	return os.NewFile(uintptr(fd), path), size, nil
}

// openRegular checks the path with stat before opening it, so a device
// (whose open may have side effects) is never opened; O_NONBLOCK keeps a
// FIFO swapped in between from blocking, and fstat checks what was really
// opened.
func openRegular(path string, maxBytes int64) (int, int64, error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Stat(path, &st) }); err != nil {
		return -1, 0, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if err := checkStat(path, &st, maxBytes); err != nil {
		return -1, 0, err
	}
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		return err
	})
	if err != nil {
		return -1, 0, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := checkStat(path, &st, maxBytes); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, st.Size, nil
}

func checkStat(path string, st *unix.Stat_t, maxBytes int64) error {
	switch uint32(st.Mode) & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFIFO:
		return notRegular(path, "FIFO")
	case unix.S_IFDIR:
		return notRegular(path, "directory")
	case unix.S_IFCHR, unix.S_IFBLK:
		return notRegular(path, "device")
	case unix.S_IFSOCK:
		return notRegular(path, "socket")
	default:
		return notRegular(path, "special file")
	}
	if st.Size > maxBytes {
		return tooLarge(path, st.Size, maxBytes)
	}
	if st.Size <= 0 {
		return empty(path)
	}
	return nil
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}
