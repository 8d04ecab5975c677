package normalize

import "syscall"

// statKey identifies a version of the file at path: a replaced file
// changes dev/ino, a rewritten one its size and mtime.
func statKey(path string) (fileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}, err
	}
	return fileKey{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano()}, nil
}
