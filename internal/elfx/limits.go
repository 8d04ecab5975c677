package elfx

import "time"

// Limits bound what opening one file may cost. Zero fields take the
// defaults below.
type Limits struct {
	// MaxFileBytes refuses larger files (a sparse 1 TiB file costs nothing
	// to make). The file is mapped, not read, so this bounds address space
	// and page cache, not heap.
	MaxFileBytes int64
	// MaxDecompressedBytes bounds the bytes decompression may produce for
	// one file, across all of its compressed sections and the ELF embedded
	// in .gnu_debugdata. This is heap the File holds while open.
	MaxDecompressedBytes int64
	// Pool, if set, also bounds the decompressed bytes of this file
	// together with every other file opened with the same pool.
	Pool *Pool
}

// Defaults. Debug files of large C++ programs reach a few GiB on disk;
// their compressed DWARF rarely expands past a few hundred MiB, and the
// gateway's default memory limit (1.5 GiB in the Helm chart) must survive a
// file made to expand as far as it may.
const (
	DefaultMaxFileBytes         = 4 << 30
	DefaultMaxDecompressedBytes = 512 << 20
	// DefaultOpenTimeout bounds Open (without a context): how long opening
	// and parsing the headers may block on a hung file system.
	DefaultOpenTimeout = 30 * time.Second
)

// DefaultLimits returns the limits zero fields take.
func DefaultLimits() Limits {
	return Limits{MaxFileBytes: DefaultMaxFileBytes, MaxDecompressedBytes: DefaultMaxDecompressedBytes}
}

// WithDefaults returns l with zero fields set to the defaults.
func (l Limits) WithDefaults() Limits { return l.withDefaults() }

func (l Limits) withDefaults() Limits {
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	if l.MaxDecompressedBytes <= 0 {
		l.MaxDecompressedBytes = DefaultMaxDecompressedBytes
	}
	return l
}
