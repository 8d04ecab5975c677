//go:build !linux

package normalize

import "os"

// statKey identifies a version of the file at path by size and mtime (the
// normalizer reads /proc, so this only keeps the package building).
func statKey(path string) (fileKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileKey{}, err
	}
	return fileKey{Size: st.Size(), Mtime: st.ModTime().UnixNano()}, nil
}
