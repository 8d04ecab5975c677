//go:build !linux

package filever

import "os"

// Stat returns the version of the file at path (following links).
func Stat(path string) (Version, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Version{}, err
	}
	return Of(path, st), nil
}

// Fstat returns the open file's version and whether it is a regular file.
func Fstat(f *os.File) (Version, bool, error) {
	st, err := f.Stat()
	if err != nil {
		return Version{}, false, err
	}
	return Of(f.Name(), st), st.Mode().IsRegular(), nil
}
