//go:build !unix

package elfx

import (
	"io"
	"os"
)

// mapFile reads a regular file into memory (no mmap here); the size is
// checked against the limit before anything is allocated.
func mapFile(path string, maxBytes int64) ([]byte, func([]byte) error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, notRegular(path, st.Mode().Type().String())
	}
	if st.Size() > maxBytes {
		return nil, nil, tooLarge(path, st.Size(), maxBytes)
	}
	if st.Size() <= 0 {
		return nil, nil, empty(path)
	}
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, st.Size()), data); err != nil {
		return nil, nil, err
	}
	return data, func([]byte) error { return nil }, nil
}
