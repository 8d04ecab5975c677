//go:build !linux

package filever

import "os"

// StatNoAlloc is Stat (the no-allocation path is Linux's).
func StatNoAlloc(path string) (Version, error) { return Stat(path) }

// Fstat returns the open file's version and whether it is a regular file.
func Fstat(f *os.File) (Version, bool, error) {
	st, err := f.Stat()
	if err != nil {
		return Version{}, false, err
	}
	return Of(f.Name(), st), st.Mode().IsRegular(), nil
}
