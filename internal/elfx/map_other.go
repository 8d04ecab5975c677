//go:build !unix

package elfx

import (
	"io"
	"os"
)

// mapFile reads a regular file into memory (no mmap here); the size is
// checked against the limit before anything is allocated.
func mapFile(path string, maxBytes int64) ([]byte, func([]byte) error, error) {
	f, size, err := OpenRegular(path, maxBytes)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	data := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, size), data); err != nil {
		return nil, nil, err
	}
	return data, func([]byte) error { return nil }, nil
}

// dropPages has nothing to drop: the image was read into memory.
func dropPages([]byte) {}

// OpenRegular opens path for reading if it is a regular file of at most
// maxBytes bytes: anything else wraps frame.ErrInvalidPath, a larger file
// frame.ErrLimitExceeded, an empty one frame.ErrCorruptFile.
func OpenRegular(path string, maxBytes int64) (*os.File, int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, notRegular(path, st.Mode().Type().String())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	if st, err = f.Stat(); err != nil {
		f.Close()
		return nil, 0, err
	}
	switch {
	case !st.Mode().IsRegular():
		err = notRegular(path, st.Mode().Type().String())
	case st.Size() > maxBytes:
		err = tooLarge(path, st.Size(), maxBytes)
	case st.Size() <= 0:
		err = empty(path)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}
