package elfx

import "golang.org/x/sys/unix"

// sectionMemory holds decompressed sections outside the Go heap, in
// anonymous mappings of the size a section claims: pages become resident
// only as the decoder writes them, so a claim the stream does not back
// costs address space, not memory, and Close returns it to the OS at once
// (no garbage for the GC to find later).
var sectionMemory memory = anonMemory{}

type anonMemory struct{}

func (anonMemory) grow(buf []byte, n int) ([]byte, error) {
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
