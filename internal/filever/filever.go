// Package filever names one version of a file's contents, so that caches
// keyed by it share an entry across the paths that reach one file (a
// library seen through /proc/PID/map_files, /proc/PID/root and a host
// mount) and never serve a rebuilt file from an entry of the old one.
package filever

import "fmt"

// Version is comparable, for use as a map key. Where the system has inodes
// a replaced file changes Dev/Ino and a rewritten one Size or Mtime; where
// it has none Path stands in for Dev/Ino.
type Version struct {
	Dev, Ino uint64
	Size     int64
	Mtime    int64 // ns
	Path     string
}

// String spells v for string-keyed maps and singleflight groups.
func (v Version) String() string {
	if v.Path != "" {
		return fmt.Sprintf("%s:%d:%d", v.Path, v.Size, v.Mtime)
	}
	return fmt.Sprintf("%d:%d:%d:%d", v.Dev, v.Ino, v.Size, v.Mtime)
}
