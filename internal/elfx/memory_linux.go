package elfx

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/frame"
)

// sectionMemory holds decompressed sections outside the Go heap, in
// anonymous mappings of the size a section claims: pages become resident
// only as the decoder writes them, so a claim the stream does not back
// costs address space, not memory, and Close returns it to the OS at once
// (no garbage for the GC to find later).
var sectionMemory memory = anonMemory{}

type anonMemory struct{}

func (anonMemory) grow(buf []byte, n int) ([]byte, error) {
	if err := addressSpaceFor(int64(n - cap(buf))); err != nil {
		return nil, err
	}
	if cap(buf) == 0 {
		b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, err
		}
		return b[:0], nil
	}
	b, err := unix.Mremap(buf[:cap(buf)], n, unix.MREMAP_MAYMOVE)
	if err != nil {
		return nil, err
	}
	return b[:len(buf)], nil
}

func (m anonMemory) trim(buf []byte) []byte {
	if len(buf) == cap(buf) || len(buf) == 0 {
		return buf
	}
	b, err := unix.Mremap(buf[:cap(buf)], len(buf), 0)
	if err != nil {
		return buf
	}
	return b
}

func (anonMemory) free(buf []byte) {
	if cap(buf) > 0 {
		unix.Munmap(buf[:cap(buf)])
	}
}

// addressSpaceFor refuses to map n more bytes when RLIMIT_AS leaves less
// than twice that: the runtime's heap must still be able to grow in the
// rest, or the process dies with "fatal error: out of memory" where a
// refused section would only have been an error.
func addressSpaceFor(n int64) error {
	var rl unix.Rlimit
	if n <= 0 || unix.Getrlimit(unix.RLIMIT_AS, &rl) != nil || rl.Cur == unix.RLIM_INFINITY || rl.Cur >= 1<<62 {
		return nil
	}
	used, ok := mappedBytes()
	if !ok {
		return nil
	}
	if !roomFor(n, int64(rl.Cur), used) {
		return fmt.Errorf("mapping %d bytes would leave too little of the %d-byte address space limit (%d mapped): %w",
			n, rl.Cur, used, frame.ErrLimitExceeded)
	}
	return nil
}

// roomFor reports whether n more bytes fit in half of what limit leaves
// beyond used.
func roomFor(n, limit, used int64) bool {
	return n <= (limit-used)/2
}

// mappedBytes is this process's VmSize.
func mappedBytes() (int64, bool) { return VmSize("/proc/self/status") }

// VmSize is the VmSize line of a /proc/PID/status file, in bytes: the
// address space a process maps, which RLIMIT_AS bounds.
func VmSize(status string) (int64, bool) {
	b, err := os.ReadFile(status)
	if err != nil {
		return 0, false
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmSize:")); ok {
			f := strings.Fields(string(rest))
			if len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10, true
				}
			}
		}
	}
	return 0, false
}
