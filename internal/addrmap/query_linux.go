//go:build linux

package addrmap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// procmapQuery is struct procmap_query (include/uapi/linux/fs.h, Linux 6.11).
type procmapQuery struct {
	Size        uint64
	QueryFlags  uint64
	QueryAddr   uint64
	VmaStart    uint64
	VmaEnd      uint64
	VmaFlags    uint64
	VmaPageSize uint64
	VmaOffset   uint64
	Inode       uint64
	DevMajor    uint32
	DevMinor    uint32
	VmaNameSize uint32
	BuildIDSize uint32
	VmaNameAddr uint64
	BuildIDAddr uint64
}

const (
	procmapQueryIoctl = 0xc0686611 // _IOWR('f', 17, struct procmap_query)

	pmqReadable       = 0x01
	pmqWritable       = 0x02
	pmqExecutable     = 0x04
	pmqShared         = 0x08
	pmqCoveringOrNext = 0x10
)

var nameBufs = sync.Pool{New: func() any { return new([MaxLineLen]byte) }}

// queryUnsupported is set once the kernel refused the ioctl.
var queryUnsupported atomic.Bool

// ErrQueryUnsupported: the kernel has no PROCMAP_QUERY (before 6.11); read
// the maps text instead.
var ErrQueryUnsupported = errors.New("PROCMAP_QUERY not supported")

// QueryExec calls fn for each executable mapping of the process whose
// /proc/PID/maps f is, in address order, as ParseMaps would report them,
// through the PROCMAP_QUERY ioctl: the kernel formats no text and skips the
// other mappings, which costs a quarter of reading the maps of a small
// process and less the more mappings it has. It returns
// ErrQueryUnsupported, having called fn for nothing, when the kernel lacks
// the ioctl.
func QueryExec(f *os.File, fn func(Mapping) error) error {
	if queryUnsupported.Load() {
		return ErrQueryUnsupported
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	// The kernel writes names through a pointer held in the query, which
	// the syscall's own pointer rule does not cover: the buffer must be on
	// the heap, where nothing moves it.
	buf := nameBufs.Get().(*[MaxLineLen]byte)
	defer nameBufs.Put(buf)
	name := buf[:]
	addr := uint64(0)
	for n := 0; ; n++ {
		q := procmapQuery{
			Size:        uint64(unsafe.Sizeof(procmapQuery{})),
			QueryFlags:  pmqExecutable | pmqCoveringOrNext,
			QueryAddr:   addr,
			VmaNameSize: uint32(len(name)),
			VmaNameAddr: uint64(uintptr(unsafe.Pointer(&name[0]))),
		}
		var errno syscall.Errno
		if cerr := sc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, procmapQueryIoctl, uintptr(unsafe.Pointer(&q)))
		}); cerr != nil {
			return cerr
		}
		runtime.KeepAlive(buf)
		switch {
		case errno == syscall.ENOENT:
			return nil // no executable mapping at or after addr
		case errno == syscall.ENOTTY || (errno == syscall.EINVAL && n == 0):
			queryUnsupported.Store(true)
			return ErrQueryUnsupported
		case errno != 0:
			return fmt.Errorf("PROCMAP_QUERY: %w", errno)
		}
		if q.VmaEnd <= q.VmaStart || q.VmaEnd <= addr || q.VmaNameSize > uint32(len(name)) {
			return fmt.Errorf("PROCMAP_QUERY: mapping %#x-%#x after %#x: %w", q.VmaStart, q.VmaEnd, addr, errCorrupt)
		}
		m := Mapping{Start: q.VmaStart, End: q.VmaEnd, Offset: q.VmaOffset,
			DevMajor: q.DevMajor, DevMinor: q.DevMinor, Inode: q.Inode}
		for _, b := range []struct {
			flag uint64
			p    Perms
		}{{pmqReadable, Read}, {pmqWritable, Write}, {pmqExecutable, Exec}, {pmqShared, Shared}} {
			if q.VmaFlags&b.flag != 0 {
				m.Perms |= b.p
			}
		}
		if q.VmaNameSize > 0 {
			// The size counts the terminating NUL. The text escapes newlines
			// in paths; so does this, so that both read alike.
			p := bytes.TrimRight(name[:q.VmaNameSize], "\x00")
			if bytes.HasSuffix(p, []byte(deletedSuffix)) {
				m.Deleted = true
				p = p[:len(p)-len(deletedSuffix)]
			}
			m.Path = string(bytes.ReplaceAll(p, []byte("\n"), []byte(`\012`)))
		}
		if err := fn(m); err != nil {
			return err
		}
		addr = q.VmaEnd
	}
}
